package connect

import "syscall"

func setMark(fd, mark int) error {
	return syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_MARK, mark)
}
