// Package atomicfile replaces a file whole: a temporary file beside it, written, then renamed over
// it, so that a reader sees the old content or the new, never part of it, and a process started
// from it runs the old binary or the new one, never half of one.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path with what write writes to the temporary file.
func Write(path string, write func(*os.File) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".storeguard-*")
	if err != nil {
		return err
	}
	err = write(tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
