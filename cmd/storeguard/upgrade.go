package main

import (
	"fmt"
	"os"
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
