package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/storeguard/storeguard/keeper"
	"github.com/storeguard/storeguard/proxy"
)

// childEnv is this process's environment for a process it starts, without hand-over variables.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, proxy.HandoverEnv+"=") && !strings.HasPrefix(kv, keeper.Env+"=") {
			env = append(env, kv)
		}
	}
	return env
}

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

// writePidFile writes pid to path, replacing it whole.
func writePidFile(path string, pid int) error {
	if path == "" {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".storeguard-pid-*")
	if err != nil {
		return fmt.Errorf("pid-file: %w", err)
	}
	_, err = fmt.Fprintf(tmp, "%d\n", pid)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("pid-file: %w", err)
	}
	return nil
}
