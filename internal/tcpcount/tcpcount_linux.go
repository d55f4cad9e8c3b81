// Package tcpcount reads how far a TCP socket's two byte streams stand, from the kernel's own
// counters: they live as long as the socket, in whichever process holds it, so a process that
// takes over a socket from one that died can tell exactly what its predecessor read and wrote.
package tcpcount

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// What the application consumed is what arrived (tcpi_bytes_received, a FIN counting one) less
// what waits unread (SIOCINQ, which leaves the FIN out); what it wrote is what the peer
// acknowledged (tcpi_bytes_acked) plus what waits to be sent or acknowledged (SIOCOUTQ). Each
// pair is read until nothing moved between its two readings.

// ErrMoving: the counters kept changing over 100 readings.
var ErrMoving = errors.New("tcpcount: a socket's counters kept moving")

// Counts reads the bytes consumed (read) from and written to the TCP socket fd, since it was
// created. A socket that connected (dialed: the active open) has its SYN counted among the bytes
// the peer acknowledged; Counts leaves it out when told so. Differences between two readings of
// one socket need no such care.
func Counts(fd int, dialed bool) (read, written uint64, err error) {
	for range 100 {
		a, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return 0, 0, os.NewSyscallError("getsockopt TCP_INFO", err)
		}
		inq, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
		if err != nil {
			return 0, 0, os.NewSyscallError("ioctl SIOCINQ", err)
		}
		outq, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
		if err != nil {
			return 0, 0, os.NewSyscallError("ioctl SIOCOUTQ", err)
		}
		b, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return 0, 0, os.NewSyscallError("getsockopt TCP_INFO", err)
		}
		if a.Bytes_received != b.Bytes_received || a.Bytes_acked != b.Bytes_acked || a.State != b.State {
			continue
		}
		read = b.Bytes_received - uint64(inq)
		if finReceived(b.State) {
			read--
		}
		written = b.Bytes_acked + uint64(outq)
		if dialed && written > 0 {
			written--
		}
		return read, written, nil
	}
	return 0, 0, ErrMoving
}

// finReceived: the TCP states after the peer's FIN. CLOSE too: a socket in FIN_WAIT2 that gets
// the FIN hands its address to a time-wait socket and is CLOSE from then on (a reset also ends
// in CLOSE, with no FIN, but then the connection is gone anyway).
func finReceived(state uint8) bool {
	switch state {
	case unix.BPF_TCP_CLOSE_WAIT, unix.BPF_TCP_LAST_ACK, unix.BPF_TCP_CLOSING, unix.BPF_TCP_TIME_WAIT, unix.BPF_TCP_CLOSE:
		return true
	}
	return false
}

// Discard takes n bytes that wait in fd's receive queue out of it, without waiting: it fails
// if fewer are there. The bytes are dropped, not copied: recv with no buffer and MSG_TRUNC, which
// a TCP socket takes as "discard" (tcp(7); HAProxy drains sockets so). It never blocks, so it is
// a raw system call, cheap enough for the proxy's event loops, which consume every byte they
// peeked with it.
func Discard(fd int, n uint64) error {
	for n > 0 {
		m, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), 0, uintptr(min(n, 1<<30)),
			unix.MSG_TRUNC|unix.MSG_DONTWAIT, 0, 0)
		switch {
		case e == unix.EINTR:
			continue
		case e != 0:
			return os.NewSyscallError("recv", e)
		case m == 0:
			return errors.New("tcpcount: the stream ended before the bytes to discard")
		}
		n -= uint64(m)
	}
	return nil
}

// PeerOpen reports whether fd's peer may still send: neither its FIN nor a reset has come (false
// too when TCP_INFO cannot be read).
func PeerOpen(fd int) bool {
	ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	return err == nil && !finReceived(ti.State)
}
