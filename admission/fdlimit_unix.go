//go:build unix

package admission

import "syscall"

// FileLimit is this process's soft RLIMIT_NOFILE: -1 when unlimited, 0 when it cannot be read.
func FileLimit() int64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	if lim.Cur > 1<<62 { // RLIM_INFINITY
		return -1
	}
	return int64(lim.Cur)
}
