package proxy

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
)

// peerStore listens on addr as torch's store does on its port and answers each connection's first
// byte with 8; it reports the address each connection came from.
func peerStore(t *testing.T, addr string) (port string, from <-chan netip.Addr) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan netip.Addr, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ch <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
			go func() {
				defer c.Close()
				if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
					c.Write(make([]byte, 8))
				}
				io.Copy(io.Discard, c)
			}()
		}
	}()
	_, port, _ = net.SplitHostPort(ln.Addr().String())
	return port, ch
}

// TestStoreSeesAddressHostsNames: torch's store listens on [::] and looks up the name of every
// connection's peer (torch 2.6+); from 127.0.0.1 it would see ::ffff:127.0.0.1, which no hosts
// file names, so each lookup would ask DNS. With upstream-loopback auto the guard dials such a
// store at [::1]; as-written, and for a store with an IPv4 socket, it dials as written.
func TestStoreSeesAddressHostsNames(t *testing.T) { run(t, testStoreSeesAddressHostsNames) }

func testStoreSeesAddressHostsNames(t *testing.T, m mode) {
	if l, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	} else {
		l.Close()
	}
	for _, tc := range []struct {
		name, listen string
		setting      config.UpstreamLoopback
		want         netip.Addr
	}{
		{"dual stack, auto", "[::]:0", config.UpstreamLoopbackAuto, netip.IPv6Loopback()},
		{"dual stack, as-written", "[::]:0", config.UpstreamLoopbackAsWritten, netip.MustParseAddr("127.0.0.1")},
		{"IPv4 socket, auto", "127.0.0.1:0", config.UpstreamLoopbackAuto, netip.MustParseAddr("127.0.0.1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port, from := peerStore(t, tc.listen)
			h := startOn(t, m, net.JoinHostPort("127.0.0.1", port), func(c *config.Config) {
				c.UpstreamLoopback = tc.setting
			})
			c := h.dial()
			defer c.Close()
			c.Write([]byte{0x06}) // 1.13's GETNUMKEYS
			c.SetReadDeadline(time.Now().Add(patience))
			if _, err := io.ReadFull(c, make([]byte, 8)); err != nil {
				t.Fatalf("no reply through the guard: %v", err)
			}
			select {
			case got := <-from:
				if got.Unmap() != tc.want {
					t.Errorf("the store saw the guard as %v, want %v", got, tc.want)
				}
			case <-time.After(patience):
				t.Fatal("the store saw no connection")
			}
		})
	}
}
