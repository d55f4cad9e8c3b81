package fdpass

import "golang.org/x/sys/unix"

// Dup duplicates a descriptor, close-on-exec, for a packet to carry or a file to take; -1 when it
// cannot (out of descriptors).
func Dup(fd int) int {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return nfd
}
