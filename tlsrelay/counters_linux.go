package tlsrelay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/storeguard/storeguard/internal/tcpcount"
)

// counts reads a socket's bytes consumed (read) and written, from the kernel's counters
// (tcpcount): they tell how far a relay that died had got.
func counts(s Sock) (read, written uint64, err error) {
	rc, err := s.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	cerr := rc.Control(func(fd uintptr) { read, written, err = tcpcount.Counts(int(fd), false) })
	if cerr != nil {
		return 0, 0, cerr
	}
	return read, written, err
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

// consume takes n bytes, already in s's receive queue, out of it (tcpcount.Discard): it never
// waits, so no freeze's deadline stops it.
func consume(s Sock, n int) error {
	rc, err := s.SyscallConn()
	if err != nil {
		return err
	}
	if cerr := rc.Control(func(fd uintptr) { err = tcpcount.Discard(int(fd), uint64(n)) }); cerr != nil {
		return cerr
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

// pairHolds is how many bytes a relay's loopback pair holds, both ways: in both receive queues,
// and sent and not acknowledged.
func pairHolds(relayFd, guardFd int) (int, error) {
	in, err := queued(unix.SIOCINQ, relayFd, guardFd)
	if err != nil {
		return 0, err
	}
	out, err := queued(unix.SIOCOUTQ, relayFd, guardFd)
	return in + out, err
}

// queued sums an ioctl's count (SIOCINQ: bytes to read; SIOCOUTQ: sent and not acknowledged)
// over fds.
func queued(req uint, fds ...int) (n int, err error) {
	for _, fd := range fds {
		q, err := unix.IoctlGetInt(fd, req)
		if err != nil {
			return 0, os.NewSyscallError("ioctl", err)
		}
		n += q
	}
	return n, nil
}

// drainPair reads all a relay's loopback pair holds, now that neither end writes to it any more:
// what waits for the guard (toGuard) and for the relay (toRelay), until both receive queues are
// empty and nothing is in flight (SIOCOUTQ of both ends 0). A sender whose peer's queue was full
// sends the rest as it is read; on loopback it comes at once, and within 100 ms or never.
func drainPair(relayFd, guardFd int) (toGuard, toRelay []byte, err error) {
	for idle := 0; idle < 100; idle++ {
		for _, q := range [2]struct {
			fd  int
			got *[]byte
		}{{guardFd, &toGuard}, {relayFd, &toRelay}} {
			b, err := readQueue(q.fd, false)
			if err != nil {
				return nil, nil, err
			}
			if len(b) > 0 {
				*q.got, idle = append(*q.got, b...), 0
			}
		}
		inFlight, err := queued(unix.SIOCOUTQ, relayFd, guardFd)
		if err != nil {
			return nil, nil, err
		}
		if inFlight == 0 && idle > 0 {
			return toGuard, toRelay, nil
		}
		if idle > 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return nil, nil, errors.New("tlsrelay: the pair's bytes in flight did not come")
}

// readQueue reads all that waits in fd's receive queue, without waiting; with peek, leaving it
// there.
func readQueue(fd int, peek bool) ([]byte, error) {
	n, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
	if err != nil {
		return nil, os.NewSyscallError("ioctl SIOCINQ", err)
	}
	flags := unix.MSG_DONTWAIT
	if peek {
		flags |= unix.MSG_PEEK
	}
	b := make([]byte, n)
	for got := 0; got < n; {
		m, _, err := unix.Recvfrom(fd, b[got:], flags)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, os.NewSyscallError("recv", err)
		case m == 0:
			return nil, io.ErrUnexpectedEOF
		case peek && m < n:
			return nil, fmt.Errorf("tlsrelay: peeked %d of the %d bytes queued", m, n)
		}
		got += m
	}
	return b, nil
}

// sockAddrs are a TCP socket's local and remote addresses.
func sockAddrs(fd int) (local, remote net.Addr, err error) {
	la, err := unix.Getsockname(fd)
	if err != nil {
		return nil, nil, os.NewSyscallError("getsockname", err)
	}
	ra, err := unix.Getpeername(fd)
	if err != nil {
		return nil, nil, os.NewSyscallError("getpeername", err)
	}
	return tcpAddr(la), tcpAddr(ra), nil
}

func tcpAddr(sa unix.Sockaddr) *net.TCPAddr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: a.Addr[:], Port: a.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: a.Addr[:], Port: a.Port}
	}
	return &net.TCPAddr{}
}
