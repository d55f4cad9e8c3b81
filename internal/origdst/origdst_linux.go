package origdst

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Fd is the address a client dialled before an nftables/iptables REDIRECT, for a socket
// whose local address is local (see Of).
func Fd(fd int, local netip.AddrPort) netip.AddrPort {
	level := unix.SOL_IP
	if local.Addr().Is6() && !local.Addr().Is4In6() {
		level = unix.SOL_IPV6 // IP6T_SO_ORIGINAL_DST has SO_ORIGINAL_DST's number
	}
	var sa [unix.SizeofSockaddrInet6]byte // sockaddr_in or sockaddr_in6
	n := uint32(len(sa))
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), unix.SO_ORIGINAL_DST,
		uintptr(unsafe.Pointer(&sa[0])), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return local
	}
	port := uint16(sa[2])<<8 | uint16(sa[3])
	switch {
	case sa[0] == unix.AF_INET && n >= 8:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), port)
	case sa[0] == unix.AF_INET6 && n >= 24:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(sa[8:24])), port)
	}
	return local
}
