//go:build !linux

package proxy

import "net/netip"

// The transparent redirect's original destination (SO_ORIGINAL_DST) needs Linux: elsewhere a
// connection's destination is the address it reached.
func originalDstFd(_ int, local netip.AddrPort) netip.AddrPort { return local }
