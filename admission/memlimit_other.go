//go:build !linux

package admission

// MemoryLimit is 0 (none known) outside Linux.
func MemoryLimit() int64 { return 0 }
