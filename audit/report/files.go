package report

import (
	"os"

	"github.com/storeguard/storeguard/audit"
)

// ExpandFiles returns the logs to read for paths, each file once (so
// `audit audit.log*` reads each file once). With rotated, each path's
// backups come first, oldest first; a path with neither backups nor a file of
// its own stays in, for Summarize to report it missing. With flows, each path's
// passed-flow records (audit.FlowsPath, with its backups when rotated) come before it,
// if there are any: a connection's interim records (verdict open) are there, and
// a Summarizer must read them before the connection's last record, which is in
// path's set unless the connection passed.
func ExpandFiles(paths []string, rotated, flows bool) ([]string, error) {
	var out []string
	seen := make(map[string]bool)
	for _, path := range paths {
		var files []string
		if flows {
			more, err := logFiles(audit.FlowsPath(path), rotated)
			if err != nil {
				return nil, err
			}
			files = more
		}
		more, err := logFiles(path, rotated)
		if err != nil {
			return nil, err
		}
		if len(more) == 0 {
			more = []string{path}
		}
		for _, f := range append(files, more...) {
			if !seen[f] {
				seen[f] = true
				out = append(out, f)
			}
		}
	}
	return out, nil
}

// logFiles is the files of the log at path that exist: with rotated, its backups too (audit.RotatedFiles).
func logFiles(path string, rotated bool) ([]string, error) {
	if rotated {
		return audit.RotatedFiles(path)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, nil
	}
	return []string{path}, nil
}
