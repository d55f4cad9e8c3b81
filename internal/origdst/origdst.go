// Package origdst reads the address a client dialled before an nftables/iptables REDIRECT sent
// its connection to a guard (SO_ORIGINAL_DST): the transparent sidecars of configs/.
package origdst

import (
	"net"
	"net/netip"
)

// Of is the address c's client dialled: after a REDIRECT the socket's local address is the
// guard's port, and the kernel keeps the original. Without a redirect it is the local address.
func Of(c *net.TCPConn) netip.AddrPort {
	local := netip.AddrPort{}
	if t, ok := c.LocalAddr().(*net.TCPAddr); ok {
		local = t.AddrPort()
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return local
	}
	orig := local
	rc.Control(func(fd uintptr) { orig = Fd(int(fd), local) })
	return orig
}
