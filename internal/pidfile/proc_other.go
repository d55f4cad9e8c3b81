//go:build !linux

package pidfile

import (
	"errors"
	"time"
)

var errNoProc = errors.New("naming a process needs Linux's /proc")

// Lookup needs /proc: elsewhere the pid file is written without a record (Write fails).
func Lookup(int) (Process, error) { return Process{}, errNoProc }

// StartTime needs /proc.
func StartTime(Process) (time.Time, error) { return time.Time{}, errNoProc }
