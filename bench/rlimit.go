package bench

import "syscall"

// RaiseFileLimit raises RLIMIT_NOFILE so that want descriptors can be open: to want if the
// process may raise its hard limit (root), else to the hard limit. It returns the soft limit in
// force afterwards.
func RaiseFileLimit(want uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= want {
		return lim.Cur, nil
	}
	if want > lim.Max {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}); err == nil {
			return want, nil
		}
	}
	err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: min(want, lim.Max), Max: lim.Max})
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return lim.Cur, err
}
