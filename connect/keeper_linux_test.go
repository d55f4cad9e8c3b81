package connect

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/internal/killload"
	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/proxy"
)

// TestKilledClientGuardLosesNothing runs the real binary as `storeguard connect --keeper` between
// 4 ranks that add as fast as the store answers and a serving guard (mutual TLS) in front of a
// recording store, and kills its forwarding process 4 times: each time the keeper starts another,
// which takes every relay back from its slot in the shared ledger and its sockets' byte counts.
// The ranks' connections and their TLS sessions stay open: no request fails, and the store gets
// every ADD exactly once.
func TestKilledClientGuardLosesNothing(t *testing.T) {
	r := newKillRig(t)
	r.addAndKill(t, r.clientGuard(t), "took every relay back from the keeper\" relays=4")
}

// TestKilledServingGuardLosesNothing: the same with the other end, `storeguard serve --keeper`
// (mutual TLS) behind a client guard in this process, killed 4 times: the keeper gives the next
// process each TLS connection's relay sockets and slot, its guard's end of the relay's pair and its
// store socket; the relay goes on from its slot, the connection from its sockets' byte counts.
func TestKilledServingGuardLosesNothing(t *testing.T) {
	r := newKillRig(t)
	r.addAndKill(t, r.servingGuard(t), "took every connection back from the keeper\" connections=4")
}

// clientGuard runs the binary as `storeguard connect --keeper` in front of a serving guard in this
// process (mutual TLS), and returns its address.
func (r *killRig) clientGuard(t *testing.T) string {
	srv := r.inProcessServer(t)
	addr := freeAddr(t)
	r.run(t, "connect", "--keeper", "--listen", addr, "--server", srv,
		"--tls-cert", filepath.Join(r.pki, "worker.pem"), "--tls-key", filepath.Join(r.pki, "worker.key"),
		"--tls-ca", filepath.Join(r.pki, "ca.pem"), "--tls-allow", "spiffe://sg.test/master")
	return addr
}

// servingGuard runs the binary as `storeguard serve --keeper` with mutual TLS from everywhere but
// 127.0.0.2, in front of the recording store, and a client guard in this process in front of it;
// it returns the client guard's address.
func (r *killRig) servingGuard(t *testing.T) string {
	guard := freeAddr(t)
	r.run(t, "serve", "--keeper", "--listen", guard, "--upstream", r.store.Addr(), "--generation", "1.13",
		"--metrics-listen", "", "--log-format", "text", "--tls-mode", "on", "--tls-plaintext-sources", "127.0.0.2/32",
		"--tls-cert", filepath.Join(r.pki, "master.pem"), "--tls-key", filepath.Join(r.pki, "master.key"),
		"--tls-ca", filepath.Join(r.pki, "ca.pem"), "--tls-allow", "spiffe://sg.test/worker/*")
	allow, _ := identity.ParseAllow([]string{"spiffe://sg.test/master"})
	c, err := New(Options{Listen: "127.0.0.1:0", Server: guard, Identity: files(t, r.pki, "worker"), Allow: allow})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go c.Serve(ctx, time.Second)
	return c.Addr().String()
}

// TestUpgradedThenKilledClientGuardLosesNothing: `storeguard connect --keeper` is upgraded in
// place 6 times under 32 ranks' load, and each new process is killed (kill -9): twice within a
// millisecond of writing its pid file, then at times from before it took over to after
// (upgradesThenKills). The keeper starts another whenever the new one had taken over, which takes
// the relays back from the same ledger slots the upgraded one wrote. No request fails; every ADD
// arrives once.
func TestUpgradedThenKilledClientGuardLosesNothing(t *testing.T) {
	r := newKillRig(t)
	r.addThen(t, r.clientGuard(t), 32, r.upgradesThenKills, "took every relay back from the keeper\" relays=32", -2)
}

// TestUpgradedThenKilledServingGuardLosesNothing: the same with `storeguard serve --keeper`
// (mutual TLS) behind a client guard in this process.
func TestUpgradedThenKilledServingGuardLosesNothing(t *testing.T) {
	r := newKillRig(t)
	c := r.servingGuard(t)
	r.addThen(t, c, 32, r.upgradesThenKills, "took every connection back from the keeper\" connections=32", -2)
}

// upgradesThenKills upgrades the guard in place twice and kills each new worker within a
// millisecond of its writing the pid file (each time the keeper starts another, which takes every
// connection back), then 4 times more, killing each new worker 0 to 120 ms after it started:
// before it took over (the old worker goes on), as it takes over, or after.
func (r *killRig) upgradesThenKills() error {
	if err := killload.UpgradeThenKill(r.pidFile, 2, 1100*time.Millisecond); err != nil {
		return err
	}
	delays := []time.Duration{0, 40 * time.Millisecond, 80 * time.Millisecond, 120 * time.Millisecond}
	return killload.UpgradeThenKillAfter(r.pidFile, r.keeper.Process.Pid, delays, 1100*time.Millisecond)
}

// build is the binary, built once for the package's tests (TestMain removes it).
var build struct {
	sync.Once
	bin string
	err error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if build.bin != "" {
		os.RemoveAll(filepath.Dir(build.bin))
	}
	os.Exit(code)
}

// killRig is a recording store, certificates and the binary, for a guard that is killed.
type killRig struct {
	pki, bin, pidFile string
	store             *storesim.Store
	logs              *killload.Log
	keeper            *exec.Cmd // the binary run (with --keeper: the keeper)
}

func newKillRig(t *testing.T) *killRig {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	r := &killRig{pki: pki(t, map[string]string{"master": "spiffe://sg.test/master", "worker": "spiffe://sg.test/worker/w1"})}
	build.Do(func() {
		dir, err := os.MkdirTemp("", "storeguard-connect-test")
		if err != nil {
			build.err = err
			return
		}
		build.bin = filepath.Join(dir, "storeguard")
		if out, err := exec.Command("go", "build", "-o", build.bin, "../cmd/storeguard").CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	r.bin = build.bin
	r.pidFile = filepath.Join(t.TempDir(), "guard.pid")
	var err error
	if r.store, err = storesim.StartRecorder("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.store.Close)
	r.store.Answer(protocol.GenSetting{Gen: protocol.G0})
	return r
}

// inProcessServer is a serving guard (mutual TLS from everywhere but 127.0.0.2) in this process.
func (r *killRig) inProcessServer(t *testing.T) string {
	cfg := config.Default()
	cfg.Listen, cfg.Upstream, cfg.MetricsListen, cfg.Generation = "127.0.0.1:0", r.store.Addr(), "", "1.13"
	cfg.TLS = config.TLS{Mode: "on", CertFile: "x", KeyFile: "x", CAFile: "x", Allow: []string{"spiffe://sg.test/worker/*"},
		PlaintextSources: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, HandshakeTimeout: 2 * time.Second}
	srv, err := proxy.New(config.MustParse(cfg), proxy.Options{Identity: files(t, r.pki, "master")})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go srv.Serve(ctx)
	return srv.Addr().String()
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// run starts the binary with args and --pid-file, until the test ends.
func (r *killRig) run(t *testing.T, args ...string) {
	r.keeper = exec.Command(r.bin, append(args, "--pid-file", r.pidFile, "--log-format", "text")...)
	r.logs = killload.Process(t, r.keeper)
}

// addAndKill runs 4 ranks that add through addr while the guard's forwarding process is killed 4
// times; then no rank failed, the store got every ADD exactly once, and the log says restored 4
// times (restored).
func (r *killRig) addAndKill(t *testing.T, addr, restored string) {
	r.addThen(t, addr, 4, func() error { return killload.Kill(r.pidFile, 4, 1100*time.Millisecond) }, restored, 4)
}

// addThen runs ranks that add through addr while act happens to the guard; then no rank failed,
// the store got every ADD exactly once, and the log says restored restarts times (at least
// -restarts times, if negative).
func (r *killRig) addThen(t *testing.T, addr string, ranks int, act func() error, restored string, restarts int) {
	add := enc(t, protocol.Request{Op: protocol.OpAdd, Key: []byte("/ctr"), Int: 1})
	adds, err := killload.RunWith(addr, ranks, add, 8, act)
	if err != nil {
		t.Fatal(err)
	}
	var got int64
	for i := range r.store.NumConns() {
		got += int64(bytes.Count(r.store.Received(i), add)) // ADDs of one key and value: no other message contains one
	}
	if got != adds || adds < 200 {
		t.Fatalf("the store got %d ADDs; the ranks completed %d", got, adds)
	}
	n := strings.Count(r.logs.String(), restored)
	if n != restarts && (restarts >= 0 || n < -restarts) {
		t.Errorf("%d restarts with every connection in the log (%s), want %d (negative: at least)", n, restored, restarts)
	}
	t.Logf("%d ADDs through %d restarts", got, n)
}
