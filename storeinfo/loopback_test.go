package storeinfo

import (
	"bytes"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/storeguard/storeguard/config"
)

func listener(s string) procListener { return procListener{addr: netip.MustParseAddrPort(s), inode: 1} }

func TestChooseRoute(t *testing.T) {
	auto, asWritten := config.UpstreamLoopbackAuto, config.UpstreamLoopbackAsWritten
	v6any, v4any := listener("[::]:29501"), listener("0.0.0.0:29501")
	for _, tc := range []struct {
		name      string
		upstream  string
		mode      config.UpstreamLoopback
		ls        []procListener
		have6     bool
		dial      string
		seen      string // "" for none
		listening bool
	}{
		{"torch's [::] socket: ::1", "127.0.0.1:29501", auto, []procListener{v6any}, true, "[::1]:29501", "::1", true},
		{"as-written", "127.0.0.1:29501", asWritten, []procListener{v6any}, true, "127.0.0.1:29501", "::ffff:127.0.0.1", true},
		{"no ::1 on this host", "127.0.0.1:29501", auto, []procListener{v6any}, false, "127.0.0.1:29501", "::ffff:127.0.0.1", true},
		{"an IPv4 socket takes it", "127.0.0.1:29501", auto, []procListener{v6any, v4any}, true, "127.0.0.1:29501", "127.0.0.1", true},
		{"bound to 127.0.0.1", "127.0.0.1:29501", auto, []procListener{listener("127.0.0.1:29501")}, true, "127.0.0.1:29501", "127.0.0.1", true},
		{"another port only", "127.0.0.1:29501", auto, []procListener{listener("[::]:29502")}, true, "127.0.0.1:29501", "", false},
		{"not listening yet", "127.0.0.1:29501", auto, nil, true, "127.0.0.1:29501", "", false},
		{"an IPv6 upstream", "[::1]:29501", auto, []procListener{v6any}, true, "[::1]:29501", "::1", true},
		{"another host", "10.0.0.5:29501", auto, []procListener{v6any}, true, "10.0.0.5:29501", "", false},
		{"a name", "localhost:29501", auto, []procListener{v6any}, true, "localhost:29501", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, listening := chooseRoute(tc.upstream, tc.mode, tc.ls, tc.have6)
			seen := ""
			if r.Seen.IsValid() {
				seen = r.Seen.String()
			}
			if r.Dial != tc.dial || seen != tc.seen || listening != tc.listening {
				t.Errorf("got dial %s, seen %q, listening %v; want %s, %q, %v", r.Dial, seen, listening, tc.dial, tc.seen, tc.listening)
			}
			if ap, err := netip.ParseAddrPort(r.Dial); err == nil && ap.Addr().IsLoopback() && r.Local != ap {
				t.Errorf("Local %v for dial %s", r.Local, r.Dial)
			}
		})
	}
}

func TestHostsNames(t *testing.T) {
	f := filepath.Join(t.TempDir(), "hosts")
	os.WriteFile(f, []byte("127.0.0.1 localhost\n# ::ffff:127.0.0.1 commented\n::1\tlocalhost ip6-localhost # trailing\n10.0.0.9\n"), 0o644)
	defer func(old string) { hostsFile = old }(hostsFile)
	hostsFile = f
	for a, want := range map[string]bool{"127.0.0.1": true, "::1": true, "::ffff:127.0.0.1": false, "10.0.0.9": false} {
		if got := hostsNames(netip.MustParseAddr(a)); got != want {
			t.Errorf("%s: %v, want %v", a, got, want)
		}
	}
}

// TestRouterTellsWhatTheStoreSees: against a real [::] listener, the router dials [::1], logs why,
// and warns when the hosts file does not name the address the store will see.
func TestRouterTellsWhatTheStoreSees(t *testing.T) {
	if !hasIPv6Loopback() {
		t.Skip("no ::1 here")
	}
	ln, err := net.Listen("tcp", "[::]:0")
	if err != nil {
		t.Skip(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	defer func(old string) { hostsFile = old }(hostsFile)
	for _, tc := range []struct {
		hosts string
		level string
	}{
		{"127.0.0.1 localhost\n::1 localhost\n", "INFO"},
		{"127.0.0.1 localhost\n", "WARN"}, // this machine's: no ::1
	} {
		hostsFile = filepath.Join(t.TempDir(), "hosts")
		os.WriteFile(hostsFile, []byte(tc.hosts), 0o644)
		var logged bytes.Buffer
		cfg := config.Default()
		cfg.Upstream = "127.0.0.1:" + port
		r := NewRouter(func() config.Config { return cfg }, slog.New(slog.NewTextHandler(&logged, nil)))
		if got := r.Route().Dial; got != "[::1]:"+port {
			t.Errorf("dial %s", got)
		}
		out := logged.String()
		if !strings.Contains(out, "level="+tc.level) || !strings.Contains(out, "dialing the store at [::1]:"+port) {
			t.Errorf("hosts %q: logged %s", tc.hosts, out)
		}
		if tc.level == "WARN" && !strings.Contains(out, `add a line \"::1 localhost\"`) {
			t.Errorf("the warning does not say what to add: %s", out)
		}
		logged.Reset()
		r.Set(cfg)
		if logged.Len() != 0 {
			t.Errorf("the same choice was logged again: %s", logged.String())
		}
		cfg.UpstreamLoopback = config.UpstreamLoopbackAsWritten
		r.Set(cfg)
		if got := r.Route().Dial; got != cfg.Upstream {
			t.Errorf("as-written dials %s", got)
		}
		if !strings.Contains(logged.String(), "::ffff:127.0.0.1") {
			t.Errorf("as-written: the store's view of the guard was not warned of: %s", logged.String())
		}
	}
}
