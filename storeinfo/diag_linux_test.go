package storeinfo

import (
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/config"
)

// TestDiagListenersMatchProc: sock_diag finds the listening sockets /proc/net/tcp* list, with
// their addresses and inodes, and no connected one.
func TestDiagListenersMatchProc(t *testing.T) {
	var mine []procListener
	for _, addr := range []string{"127.0.0.1:0", "[::]:0", "[::1]:0", "0.0.0.0:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Logf("%s: %v", addr, err)
			continue
		}
		defer ln.Close()
		if addr == "127.0.0.1:0" { // a connected socket of the same port must not be listed
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
		}
		for _, l := range fileListeners() {
			if int(l.addr.Port()) == ln.Addr().(*net.TCPAddr).Port {
				mine = append(mine, l)
			}
		}
	}
	if len(mine) < 3 {
		t.Fatalf("/proc lists %d of the test's listeners: %v", len(mine), mine)
	}
	got, err := diagListeners()
	if err != nil {
		t.Skipf("no sock_diag here: %v", err)
	}
	sameSocket := func(ls []procListener, l procListener) bool {
		return slices.ContainsFunc(ls, func(o procListener) bool { return o.addr == l.addr && o.inode == l.inode })
	}
	for _, l := range mine {
		if !sameSocket(got, l) {
			t.Errorf("sock_diag does not list %v (inode %d); it lists %d sockets", l.addr, l.inode, len(got))
		}
	}
	for _, l := range got {
		for _, m := range mine {
			if l.addr.Port() == m.addr.Port() && !sameSocket(mine, l) {
				t.Errorf("sock_diag lists %v (inode %d), which /proc does not list as listening", l.addr, l.inode)
			}
		}
	}
}

// TestDiagListenersTellTheBacklog: sock_diag tells a listening socket's accept-queue size, the
// backlog it was given.
func TestDiagListenersTellTheBacklog(t *testing.T) {
	at := listenWithBacklog(t, 37)
	got, err := diagListeners()
	if err != nil {
		t.Skipf("no sock_diag here: %v", err)
	}
	i := slices.IndexFunc(got, func(l procListener) bool { return l.addr == at })
	if i < 0 {
		t.Fatalf("sock_diag does not list %v", at)
	}
	if got[i].backlog != 37 {
		t.Errorf("the backlog of %v: %d, want 37", at, got[i].backlog)
	}
}

// listenWithBacklog listens on a free port of 127.0.0.1 with an accept queue of backlog, until the
// test ends.
func listenWithBacklog(t *testing.T, backlog int) netip.AddrPort {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, backlog); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port))
}

// The Limiter gives the pacer the store's accept-queue size, whatever caps.max-store-connections
// says, and reads again within listenEvery while the store does not listen yet.
func TestLimiterBoundsPacingByTheStoresBacklog(t *testing.T) {
	if _, err := diagListeners(); err != nil {
		t.Skipf("no sock_diag here: %v", err)
	}
	var cfg config.Config
	cfg.Upstream, cfg.Caps.MaxStoreConnections = listenWithBacklog(t, 37).String(), config.AutoCount{N: 4000}
	slots := admission.NewStoreSlots(0, 0)
	slots.SetDialRate(admission.DialRate{Paced: true})
	l := NewLimiter(slots, func() config.Config { return cfg }, slog.New(slog.DiscardHandler))
	l.apply()
	if w, _, _ := slots.Pacing(); w != 37 || l.early {
		t.Fatalf("behind a store with a backlog of 37: window %v, reading again early %v", w, l.early)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Upstream = free.Addr().String()
	free.Close()
	l.apply()
	if !l.early {
		t.Fatalf("no store listens on %s, yet the Limiter does not read again early", cfg.Upstream)
	}
}
