//go:build !unix

package admission

// FileLimit is 0 (unknown) where there is no RLIMIT_NOFILE.
func FileLimit() int64 { return 0 }
