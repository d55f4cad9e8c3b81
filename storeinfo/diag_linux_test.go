package storeinfo

import (
	"net"
	"slices"
	"testing"
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
	for _, l := range mine {
		if !slices.Contains(got, l) {
			t.Errorf("sock_diag does not list %v (inode %d); it lists %d sockets", l.addr, l.inode, len(got))
		}
	}
	for _, l := range got {
		for _, m := range mine {
			if l.addr.Port() == m.addr.Port() && !slices.Contains(mine, l) {
				t.Errorf("sock_diag lists %v (inode %d), which /proc does not list as listening", l.addr, l.inode)
			}
		}
	}
}
