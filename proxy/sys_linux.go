package proxy

import (
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"unsafe"

	"github.com/storeguard/storeguard/tlsrelay"
	"golang.org/x/sys/unix"
)

// clientOptions are what Go sets on the connections it accepts, and setClientOptions on the ones
// a loop accepts: no Nagle delay, and keep-alive probes after 15 s idle, every 15 s, 9 of them, so
// that a client host that vanished frees its connection (and its place under the caps) within
// minutes.
var clientOptions = [...]struct{ level, name, value int }{
	{unix.IPPROTO_TCP, unix.TCP_NODELAY, 1},
	{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
	{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 15},
	{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 15},
	{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 9},
}

func setClientOptions(fd int) {
	for _, o := range clientOptions {
		unix.SetsockoptInt(fd, o.level, o.name, o.value)
	}
}

func hasClientOptions(fd int) bool {
	for _, o := range clientOptions {
		if v, err := unix.GetsockoptInt(fd, o.level, o.name); err != nil || v != o.value {
			return false
		}
	}
	return true
}

// clientOptionsOf sets clientOptions on a socket a loop accepted, unless accepted sockets inherit
// them from the listening socket, which has them (Linux copies them to each accepted socket; 5
// system calls fewer per connection). That is checked on the first accepted socket, and if it
// did not inherit them, every socket gets them set as before.
func (ls *loops) clientOptionsOf(fd int) {
	switch ls.inherit.Load() {
	case inherits:
		return
	case inheritUnknown:
		if hasClientOptions(fd) {
			ls.inherit.Store(inherits)
			return
		}
		ls.inherit.Store(inheritsNot)
	}
	setClientOptions(fd)
}

const (
	inheritUnknown = iota
	inherits
	inheritsNot
)

// rawAddrPort is the address in rsa as Go's accept reports it: IPv4-mapped addresses unmapped, and
// a link-local address with its zone, the interface's name (its index if it has none).
func rawAddrPort(rsa *unix.RawSockaddrAny) netip.AddrPort {
	switch rsa.Addr.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), netPort(&sa.Port))
	case unix.AF_INET6:
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		a := netip.AddrFrom16(sa.Addr).Unmap()
		if sa.Scope_id != 0 {
			zone := strconv.Itoa(int(sa.Scope_id))
			if ifi, err := net.InterfaceByIndex(int(sa.Scope_id)); err == nil {
				zone = ifi.Name
			}
			a = a.WithZone(zone)
		}
		return netip.AddrPortFrom(a, netPort(&sa.Port))
	}
	return netip.AddrPort{}
}

// netPort reads a port in network byte order.
func netPort(p *uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(p))
	return uint16(b[0])<<8 | uint16(b[1])
}

// addrCall is accept4 (with flags), getsockname or getpeername of fd as a raw system call that
// reads the address itself: x/sys/unix's ask each IPv4 or IPv6 socket they return an address of
// for its protocol (a getsockopt SO_PROTOCOL, to tell L2TP sockets apart), a system call more
// each, three a connection. None waits: the listening socket is non-blocking. r is accept4's new
// socket.
func addrCall(trap uintptr, fd int, flags int) (r int, ap netip.AddrPort, errno unix.Errno) {
	var rsa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	r0, _, e := unix.RawSyscall6(trap, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n)),
		uintptr(flags), 0, 0)
	if e != 0 {
		return -1, netip.AddrPort{}, e
	}
	return int(r0), rawAddrPort(&rsa), 0
}

// The loop's reads, writes and non-blocking epoll_waits never block, so they are raw system calls:
// none of the runtime's bookkeeping for a call that might (entersyscall, exitsyscall), which
// costs about as much as a small read itself. Only the epoll_wait that waits goes through it.

// epollWait waits up to msec milliseconds for events on epfd; 0 returns at once. (Each
// unsafe.Pointer is converted within the call expression, as unix.Syscall requires.)
func epollWait(epfd int, events []unix.EpollEvent, msec int) (int, unix.Errno) {
	var n uintptr
	var e unix.Errno
	if msec == 0 {
		n, _, e = unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd),
			uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	} else {
		n, _, e = unix.Syscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd),
			uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(msec), 0, 0)
	}
	return int(n), e
}

// readFd reads what fd has; n == 0 with errno 0 is the end of the stream.
func readFd(fd int32, p []byte) (int, unix.Errno) {
	return rawIO(unix.SYS_READ, fd, unsafe.Pointer(&p[0]), len(p), 0)
}

// peekFd reads what fd has into p without consuming it, without waiting: a connection its keeper
// holds is read so (docs/design.md, "What a crash costs"), and tcpcount.Discard takes the bytes
// once they are passed on.
func peekFd(fd int32, p []byte) (int, unix.Errno) {
	return rawIO(unix.SYS_RECVFROM, fd, unsafe.Pointer(&p[0]), len(p), unix.MSG_PEEK|unix.MSG_DONTWAIT)
}

// writeFd writes a and then b (which may be empty) with one system call, without waiting.
func writeFd(fd int32, a, b []byte) (int, unix.Errno) {
	if len(b) == 0 {
		return rawIO(unix.SYS_WRITE, fd, unsafe.Pointer(&a[0]), len(a), 0)
	}
	iov := [2]unix.Iovec{{Base: &a[0]}, {Base: &b[0]}}
	iov[0].SetLen(len(a))
	iov[1].SetLen(len(b))
	return rawIO(unix.SYS_WRITEV, fd, unsafe.Pointer(&iov[0]), len(iov), 0)
}

// rawIO is read, write, writev or recvfrom (with flags, and no address) of fd as a raw system
// call, again if a signal interrupted it: the count, or 0 and the errno. (p stays an
// unsafe.Pointer up to the call expression, as unix.RawSyscall requires; read, write and writev
// ignore the arguments past their third.)
func rawIO(trap uintptr, fd int32, p unsafe.Pointer, n int, flags uintptr) (int, unix.Errno) {
	for {
		r, _, e := unix.RawSyscall6(trap, uintptr(fd), uintptr(p), uintptr(n), flags, 0, 0)
		switch e {
		case 0:
			return int(r), 0
		case unix.EINTR:
		default:
			return 0, e
		}
	}
}

// dupFd duplicates sc's descriptor, close-on-exec, for the caller to own.
func dupFd(sc syscall.Conn) (int32, error) {
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	nfd, derr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) {
		nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
		if derr != nil {
			derr = os.NewSyscallError("fcntl", derr)
		}
	}); err != nil {
		return -1, err
	}
	return int32(nfd), derr
}

// attach gives a descriptor from detach back to Go's poller; the descriptor is closed either way.
func attach(fd int32) (sock, error) { return tlsrelay.FromFd(int(fd)) }
