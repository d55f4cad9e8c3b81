package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// inheritedFile is the descriptor an environment variable names (a process started to take
// over), or nil when the variable is not set.
func inheritedFile(name string) (*os.File, error) {
	v, ok := os.LookupEnv(name)
	if !ok {
		return nil, nil
	}
	os.Unsetenv(name)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: not a descriptor", name, v)
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), name), nil
}

// replaceFile writes path whole with write: a temporary file beside it, renamed over it, so that a
// reader sees the old content or the new, never part of it.
func replaceFile(path string, write func(*os.File) error) error {
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
