package tlsrelay

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// The kernel counts a TCP socket's bytes in both directions for as long as the socket lives, in
// whichever process holds it: what the application consumed is what arrived (tcpi_bytes_received,
// a FIN counting one) less what waits unread (SIOCINQ, which leaves the FIN out); what it wrote is
// what the peer acknowledged (tcpi_bytes_acked) plus what waits to be sent or acknowledged
// (SIOCOUTQ). Each pair is read until nothing moved between its two readings.

// counts reads a socket's bytes consumed (read) and written.
func counts(s Sock) (read, written uint64, err error) {
	rc, err := s.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	cerr := rc.Control(func(fd uintptr) { read, written, err = fdCounts(int(fd)) })
	if cerr != nil {
		return 0, 0, cerr
	}
	return read, written, err
}

var errMoving = errors.New("tlsrelay: a socket's counters kept moving")

func fdCounts(fd int) (read, written uint64, err error) {
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
		return read, b.Bytes_acked + uint64(outq), nil
	}
	return 0, 0, errMoving
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

// peek reads what is at the start of s's receive queue into buf without consuming it: at least
// min bytes (fewer only at the end of the stream), waiting for them as a read would.
func peek(s Sock, buf []byte, min int) (n int, eof bool, err error) {
	rc, err := s.SyscallConn()
	if err != nil {
		return 0, false, err
	}
	var serr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, serr = unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case serr == unix.EAGAIN || serr == unix.EINTR:
			serr, n = nil, 0
			return false
		case serr != nil:
			return true
		case n == 0:
			eof = true
			return true
		}
		return n >= min
	})
	if serr != nil {
		return n, false, os.NewSyscallError("recv", serr)
	}
	if err != nil {
		return n, false, err
	}
	return max(n, 0), eof, nil
}

// consume takes n bytes, already in s's receive queue, out of it (into buf, len(buf) >= n).
func consume(s Sock, buf []byte, n int) error {
	rc, err := s.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	done := 0
	err = rc.Read(func(fd uintptr) bool {
		for done < n {
			m, _, e := unix.Recvfrom(int(fd), buf[done:n], unix.MSG_DONTWAIT)
			switch {
			case e == unix.EINTR:
				continue
			case e == unix.EAGAIN:
				return false
			case e != nil:
				serr = e
				return true
			case m == 0:
				serr = errors.New("tlsrelay: the stream ended inside bytes peeked before")
				return true
			}
			done += m
		}
		return true
	})
	if serr != nil {
		return serr
	}
	return err
}

// write writes what one write(2) takes of p, waiting until s takes some.
func write(s Sock, p []byte) (int, error) {
	rc, err := s.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		n, serr = unix.Write(int(fd), p)
		if serr == unix.EAGAIN || serr == unix.EINTR {
			serr = nil
			return false
		}
		return true
	})
	if serr != nil {
		return 0, os.NewSyscallError("write", serr)
	}
	return max(n, 0), err
}
