//go:build !linux

package origdst

import "net/netip"

// Fd is local: the transparent redirect's original destination (SO_ORIGINAL_DST) needs Linux.
func Fd(_ int, local netip.AddrPort) netip.AddrPort { return local }
