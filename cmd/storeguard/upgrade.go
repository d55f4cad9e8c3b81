package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"syscall"

	"github.com/storeguard/storeguard/internal/pidfile"
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

// upgradeFailed records a failed upgrade beside the pid file, which tells `storeguard upgrade` at
// once (the UpgradeFailed of serve and connect).
func upgradeFailed(pids *pidfile.Writer, log *slog.Logger) func(error) {
	return func(err error) {
		if werr := pids.Failed(err); werr != nil {
			log.Warn("could not record the failed upgrade beside the pid file", "err", werr)
		}
	}
}

// writePid writes this process's pid file, naming its keeper (its parent) when it runs under one.
func writePid(pids *pidfile.Writer, underKeeper bool) error {
	keeperPID := 0
	if underKeeper {
		keeperPID = os.Getppid()
	}
	return pids.Write(keeperPID)
}
