package storeinfo

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/config"
)

func TestParseProcListener(t *testing.T) {
	tests := []struct {
		name, line string
		want       procListener
		ok         bool
	}{
		{"v4 loopback", "   0: 0100007F:E7C5 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3361629 2 000000002e20e36c 100 0 0 10 0",
			procListener{addr: netip.MustParseAddrPort("127.0.0.1:59333"), inode: 3361629}, true},
		{"v4 wildcard", "   2: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 61 1 000000008e5a2714 100 0 0 10 0",
			procListener{addr: netip.MustParseAddrPort("0.0.0.0:2024"), inode: 61}, true},
		{"v6 wildcard", "   0: 00000000000000000000000000000000:99FD 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3359894 1 000000003b2aab86 100 0 0 10 0",
			procListener{addr: netip.MustParseAddrPort("[::]:39421"), inode: 3359894}, true},
		{"v4-mapped is v4", "   0: 0000000000000000FFFF00000100007F:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7 1 0 100 0 0 10 0",
			procListener{addr: netip.MustParseAddrPort("127.0.0.1:80"), inode: 7}, true},
		{"established", "   5: 0100007F:E7C5 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 3361630 1 0 20 4 30 10 -1", procListener{}, false},
		{"header", "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode", procListener{}, false},
		{"short", "   0: 0100007F:E7C5 00000000:0000 0A", procListener{}, false},
	}
	for _, tc := range tests {
		got, ok := parseProcListener(tc.line)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: got %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseOpenFilesLimit(t *testing.T) {
	limits := "Limit                     Soft Limit           Hard Limit           Units     \n" +
		"Max cpu time              unlimited            unlimited            seconds   \n" +
		"Max open files            %s                 524288               files     \n" +
		"Max locked memory         8388608              8388608              bytes     \n"
	for soft, want := range map[string]int64{"1024": 1024, "unlimited": -1} {
		got, err := parseOpenFilesLimit(fmt.Sprintf(limits, soft))
		if err != nil || got != want {
			t.Errorf("soft %s: %d, %v", soft, got, err)
		}
	}
	for _, bad := range []string{"", "Max open files\n", fmt.Sprintf(limits, "many")} {
		if _, err := parseOpenFilesLimit(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestAutoStoreLimit(t *testing.T) {
	tests := []struct {
		name             string
		soft             int64
		open, ours, want int
		floored          bool
	}{
		{"the usual 1024, a bare store", 1024, 14, 0, 896, false},
		{"its connections from the guard are not its own files", 1024, 814, 800, 896, false},
		{"a store holding many files of its own", 1024, 300, 0, 1024 - 364, false},
		{"700 direct connections: the floor, not 246", 1024, 714, 0, storeFloor, true},
		{"all but full: still the floor", 1024, 1020, 0, storeFloor, true},
		{"just above the floor", 1024, 700, 0, 1024 - 764, false},
		{"a small limit's floor is what its reserve leaves", 300, 250, 0, 300 - 128, true},
		{"a raised limit", 1 << 20, 20, 0, 1<<20 - 128, false},
		{"unlimited", -1, 20, 0, 0, false},
		{"nothing left", 100, 90, 0, 1, true},
		{"beyond int32", 1 << 40, 10, 0, 1<<31 - 1 - 128, false},
	}
	for _, tc := range tests {
		got, floored := autoStoreLimit(tc.soft, tc.open, tc.ours)
		if got != tc.want || floored != tc.floored {
			t.Errorf("%s: autoStoreLimit(%d, %d, %d) = %d, %v; want %d, %v", tc.name, tc.soft, tc.open, tc.ours,
				got, floored, tc.want, tc.floored)
		}
	}
}

// auto finds the process listening on the upstream address through /proc: here, this test's own.
func TestFindStoreReadsTheListenersProcess(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		host := map[string]string{"tcp4": "127.0.0.1", "tcp6": "::1"}[network]
		ln, err := net.Listen(network, net.JoinHostPort(host, "0"))
		if err != nil {
			t.Skipf("%s: %v", network, err)
		}
		defer ln.Close()
		var rl syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			t.Fatal(err)
		}
		p, err := findStore(ln.Addr().String(), storeProcess{})
		if err != nil {
			t.Fatalf("%s: %v", network, err)
		}
		if p.pid != os.Getpid() || p.soft != int64(rl.Cur) || p.open < 1 {
			t.Errorf("%s: found %+v, want pid %d with soft limit %d", network, p, os.Getpid(), rl.Cur)
		}
		if again, err := findStore(ln.Addr().String(), p); err != nil || again.pid != p.pid {
			t.Errorf("%s: knowing the socket: %+v, %v", network, again, err)
		}
		if other, err := findStore(ln.Addr().String(), storeProcess{pid: 1, inode: p.inode + 1}); err != nil || other.pid != p.pid {
			t.Errorf("%s: after another socket of another process: %+v, %v", network, other, err)
		}
	}
}

func TestFindStoreWithoutALocalStore(t *testing.T) {
	if _, err := findStore("192.0.2.1:29500", storeProcess{}); !errors.Is(err, errRemote) {
		t.Errorf("a remote store: %v, want errRemote", err)
	}
	free := closedAddr(t)
	if _, err := findStore(free, storeProcess{}); !errors.Is(err, errNotListening) {
		t.Errorf("nothing listening: %v, want errNotListening", err)
	}
}

// With caps.max-store-connections auto and the store on this host, the cap is the store process's
// soft limit less the reserve (the store here is a listener of this test's process, which holds few
// files).
func TestAutoCapFromTheStoreProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var cfg config.Config
	cfg.Upstream, cfg.Caps.MaxStoreConnections = ln.Addr().String(), config.AutoCount{Auto: true}
	slots := admission.NewStoreSlots(FallbackConnections, 0)
	l := NewLimiter(slots, func() config.Config { return cfg }, slog.New(slog.DiscardHandler))
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	want, _ := autoStoreLimit(int64(rl.Cur), len(entries), 0)
	l.apply()
	// The reserve is at least storeReserve; the process's open descriptors vary a little between
	// the two readings.
	if got := slots.Limit(); got > int(int64(rl.Cur)-storeReserve) || got < want-256 {
		t.Errorf("a cap of %d from the soft limit %d with %d files open (about %d)", got, rl.Cur, len(entries), want)
	}
}
