package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/internal/killload"
	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
)

// recorder starts a store at addr that records what each connection sends and answers nothing
// unless told to (storesim.StartRecorder). It is a stand-in for unit tests; the interop suite runs
// real torch.
func recorder(t *testing.T, addr string) *storesim.Store {
	t.Helper()
	s, err := storesim.StartRecorder(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// reservedAddr is an address on this host for a store that comes up later in the test, or goes
// away and comes back: nothing listens there, so a dial is refused, but the port stays bound until
// the test ends. A port merely closed can meanwhile become another socket's (the kernel hands it
// out as an ephemeral port, or to a listener on port 0), and the store's listen then fails with
// "address already in use", or the guard dials somebody else's store.
func reservedAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { syscall.Close(fd) })
	// SO_REUSEADDR on both sides lets a store listen on the port while this socket holds it.
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// mode is how a test server forwards connections: on event loops, or on two goroutines each.
type mode string

const (
	loopMode      mode = "loops"
	goroutineMode mode = "goroutines"
)

// eventLoops is config.EventLoops for m: none for goroutines; for loops two, whatever the
// machine's CPU count, so that connections spread over more than one.
func (m mode) eventLoops() int {
	if m == goroutineMode {
		return -1
	}
	return 2
}

type runOption int

const (
	// loopsOnly: the test is about what only an event loop does (adopting a connection, handing
	// it back, forwarding it without a goroutine); the goroutine path has none of it.
	loopsOnly runOption = iota + 1
	// serially: the test changes or measures the whole process (its descriptor limit, its CPU
	// time), so its modes must not run at the same time.
	serially
)

// run runs f once per forwarding mode, as a subtest named for the mode, so that every test passes
// on both paths by default (net/http's clientserver_test.go runs HTTP/1 and HTTP/2 so). A test's
// modes run in parallel with each other, not with other tests: most tests wait on a timeout.
func run(t *testing.T, f func(t *testing.T, m mode), opts ...runOption) {
	t.Helper()
	modes, parallel := []mode{loopMode, goroutineMode}, true
	if testing.Short() { // make quick: one transport (the loops, where Linux has them)
		modes = modes[:1]
	}
	for _, o := range opts {
		switch o {
		case loopsOnly:
			modes = []mode{loopMode}
		case serially:
			parallel = false
		}
	}
	if testing.Short() && parallel {
		// One subtest each: without this, the tests would run one after the other (a test's
		// parallel subtests run only beside each other). make quick runs them beside each other.
		t.Parallel()
	}
	for _, m := range modes {
		t.Run(string(m), func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			f(t, m)
		})
	}
}

// syncBuffer is the audit log of a test's server, read while the server writes it.
type syncBuffer struct{ killload.Log }

// events are the audit events but flow records and scan notices (flows).
func (s *syncBuffer) events(t *testing.T) []map[string]any {
	return s.select_(t, func(m map[string]any) bool {
		return m["event.action"] != "flow" && m["event.action"] != "scan_detected"
	})
}

// flows are the flow records and scan notices.
func (s *syncBuffer) flows(t *testing.T) []map[string]any {
	return s.select_(t, func(m map[string]any) bool {
		return m["event.action"] == "flow" || m["event.action"] == "scan_detected"
	})
}

func (s *syncBuffer) select_(t *testing.T, keep func(map[string]any) bool) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		if keep(m) {
			out = append(out, m)
		}
	}
	return out
}

type harness struct {
	t      *testing.T
	srv    *Server
	store  *storesim.Store
	audit  *syncBuffer
	addr   string
	cancel context.CancelFunc
	done   chan struct{}   // closed when Serve returns
	ids    identity.Source // mutual TLS's (tls_test.go), nil without
}

func testConfig(m mode, upstream string) config.Config {
	c := config.Default()
	c.EventLoops = m.eventLoops()
	c.Listen, c.Upstream, c.MetricsListen = "127.0.0.1:0", upstream, "127.0.0.1:0"
	c.Generation = "1.13"
	c.Timeouts.Drain = 2 * time.Second
	// The recorder answers nothing unless told (storesim.Store.Answer): tests of the bound on
	// requests awaiting replies (replies_test.go) set the default back.
	c.Limits.MaxPendingReplies = protocol.MaxAwaited
	return c
}

// parsed is cfg parsed (config.Parse), as serve gives it to New; the test fails if it is invalid.
func parsed(t testing.TB, cfg config.Config) *config.Parsed {
	t.Helper()
	p, err := config.Parse(cfg)
	if err != nil {
		t.Fatalf("invalid test configuration: %v", err)
	}
	return p
}

// start starts a server forwarding in mode m in front of a recorder at a reserved address, where
// a test may close it and start another.
func start(t *testing.T, m mode, mutate func(*config.Config)) *harness {
	t.Helper()
	store := recorder(t, reservedAddr(t))
	h := startOn(t, m, store.Addr(), mutate)
	h.store = store
	return h
}

// startOn starts a server forwarding in mode m in front of upstream, whatever listens there.
func startOn(t *testing.T, m mode, upstream string, mutate func(*config.Config)) *harness {
	t.Helper()
	cfg := testConfig(m, upstream)
	if mutate != nil {
		mutate(&cfg)
	}
	return startWith(t, cfg, nil)
}

// startWith starts a server with cfg and, for mutual TLS, ids.
func startWith(t *testing.T, cfg config.Config, ids identity.Source) *harness {
	t.Helper()
	return startWithOptions(t, cfg, Options{Identity: ids})
}

// startWithOptions is startWith with more of the server's options (its audit sink is the
// harness's).
func startWithOptions(t *testing.T, cfg config.Config, opts Options) *harness {
	t.Helper()
	return startParsed(t, parsed(t, cfg), opts)
}

// startParsed is startWithOptions with the configuration parsed already.
func startParsed(t *testing.T, p *config.Parsed, opts Options) *harness {
	t.Helper()
	h := &harness{t: t, audit: &syncBuffer{}, done: make(chan struct{}), ids: opts.Identity}
	opts.Audit = audit.New(h.audit, audit.Options{})
	srv, err := New(p, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	h.srv, h.addr = srv, srv.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { srv.Serve(ctx); close(h.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after cancel")
		}
	})
	return h
}

func (h *harness) dial() net.Conn {
	h.t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// closedByPeer waits for the proxy to close c, failing if it sends anything or stays open.
func closedByPeer(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(patience))
	b := make([]byte, 64)
	n, err := c.Read(b)
	if n > 0 {
		t.Fatalf("proxy sent %x toward the client", b[:n])
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("connection still open")
	}
}

// patience is how long a test waits for what must happen. Only a failing test waits it out, so it
// is as long as a loaded machine may need: waits of 5 s failed under -race beside other packages.
const patience = 30 * time.Second

// eventually polls cond until it holds or patience runs out.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, patience, what, cond)
}

// eventuallyWithin is eventually with a wait of its own, for a transfer whose time grows with the
// machine's load (megabytes under -race beside the other packages' tests).
func eventuallyWithin(t *testing.T, wait time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(wait); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func (h *harness) metric(name string) string {
	h.t.Helper()
	resp, err := http.Get("http://" + h.srv.MetricsAddr().String() + "/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+" ") {
			return strings.TrimPrefix(line, name+" ")
		}
	}
	return ""
}

// readReply reads n bytes of replies from c, failing after patience.
func readReply(t *testing.T, c net.Conn, n int) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(patience))
	if _, err := io.ReadFull(c, make([]byte, n)); err != nil {
		t.Fatalf("reply: %v", err)
	}
}

func enc(t *testing.T, g protocol.Generation, rs ...protocol.Request) []byte {
	t.Helper()
	var b []byte
	for _, r := range rs {
		var err error
		if b, err = protocol.Append(b, g, r); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func unhex(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestForwardsValidTrafficBothWays(t *testing.T) { run(t, testForwardsValidTrafficBothWays) }

func testForwardsValidTrafficBothWays(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "2.6" })
	h.store.SetReply([]byte("reply"))
	c := h.dial()
	msgs := protocol.AppendHandshake(nil, protocol.G3, 77)
	msgs = append(msgs, enc(t, protocol.G3,
		protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: []byte("v")},
		protocol.Request{Op: protocol.OpMultiSet, Keys: [][]byte{[]byte("/a"), []byte("/b")}, Values: [][]byte{{1}, {}}})...)
	// Byte by byte: the store must still see whole messages only, and all of them.
	for _, b := range msgs {
		if _, err := c.Write([]byte{b}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "all bytes at the store", func() bool { return bytes.Equal(h.store.Received(0), msgs) })
	c.SetReadDeadline(time.Now().Add(patience))
	got := make([]byte, 5)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "reply" {
		t.Fatalf("client read %q, %v", got, err)
	}
	if v := h.metric(`storeguard_messages_total{generation="G3",op="multi_set"}`); v != "1" {
		t.Errorf("multi_set counted %q", v)
	}
}

func TestPartialMessageNeverReachesStore(t *testing.T) { run(t, testPartialMessageNeverReachesStore) }

func testPartialMessageNeverReachesStore(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "1.13" })
	c := h.dial()
	set := enc(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("/key"), Value: []byte("value")})
	get := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	c.Write(append(get, set[:len(set)-1]...))
	eventually(t, "the complete message", func() bool { return bytes.Equal(h.store.Received(0), get) })
	time.Sleep(50 * time.Millisecond)
	if got := h.store.Received(0); !bytes.Equal(got, get) {
		t.Fatalf("store received %x; the partial SET must stay in the proxy", got)
	}
	c.Write(set[len(set)-1:])
	eventually(t, "the completed SET", func() bool { return bytes.Equal(h.store.Received(0), append(get, set...)) })
}

// TestEveryRuleBlocks: for each rule, valid messages before the bad one reach the store, not one
// byte of the bad one does, the client sees a close and nothing else, and the audit log and the
// metrics have it.
func TestEveryRuleBlocks(t *testing.T) { run(t, testEveryRuleBlocks) }

func testEveryRuleBlocks(t *testing.T, m mode) {
	g3valid := append(protocol.AppendHandshake(nil, protocol.G3, 1), enc(t, protocol.G3,
		protocol.Request{Op: protocol.OpAdd, Key: []byte("init/"), Int: 1})...)
	g0valid := enc(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: []byte("v")})
	cases := []struct {
		rule   protocol.Rule
		gen    string
		mutate func(*config.Config)
		valid  []byte
		bad    string
		offset uint64
	}{
		{rule: protocol.RuleKeyTooLong, gen: "1.13", valid: g0valid, bad: "03 00000b06e0000000 000000", offset: 21},
		{rule: protocol.RuleValueTooLong, gen: "2.6", valid: g3valid, bad: "01 0100000000000000 6b 0000000001000000",
			offset: uint64(len(g3valid)) + 10},
		{rule: protocol.RuleTooManyKeys, gen: "2.6", valid: g3valid, bad: "06 0000000001000000", offset: uint64(len(g3valid)) + 1},
		{rule: protocol.RuleMessageTooLarge, gen: "2.6", valid: g3valid, bad: "06 0010000000000000",
			mutate: func(c *config.Config) {
				c.Limits.MaxKeyBytes, c.Limits.MaxValueBytes, c.Limits.MaxMessageBytes = 1024, 16<<10, 20000
			}, offset: uint64(len(g3valid)) + 1},
		{rule: protocol.RuleUnknownOpcode, gen: "2.6", valid: g3valid, bad: "0e", offset: uint64(len(g3valid))},
		{rule: protocol.RuleValidateMissing, gen: "2.6", bad: "0d 01000000"[0:0] + "03 0100000000000000 6b"},
		{rule: protocol.RuleValidateBadMagic, gen: "2.6", bad: "00 cef78500", offset: 1},
		{rule: protocol.RuleValidateRepeated, gen: "2.6", valid: g3valid, bad: "00 cef7853c", offset: uint64(len(g3valid))},
		{rule: protocol.RulePingBeforeValidate, gen: "2.6", bad: "0d 01000000"},
		{rule: protocol.RuleOpNotInBackend, gen: "2.9", valid: g3valid, bad: "0f 0100000000000000 71",
			mutate: func(c *config.Config) { c.Backend = config.BackendLegacy }, offset: uint64(len(g3valid))},
		{rule: protocol.RuleWatchKeyBlocked, gen: "G0", valid: g0valid, bad: "07 0200000000000000 2f77", offset: 20},
		{rule: protocol.RuleZeroCount, gen: "G0", valid: g0valid, bad: "04 0000000000000000",
			mutate: func(c *config.Config) { c.Limits.RejectZeroCount = true }, offset: 21},
		{rule: protocol.RuleMessageTimeout, gen: "G0", valid: g0valid, bad: "00 0300000000000000 2f6b",
			mutate: func(c *config.Config) { c.Timeouts.Message = 200 * time.Millisecond }, offset: 20},
		{rule: protocol.RuleFirstMessageTimeout, gen: "2.6",
			mutate: func(c *config.Config) { c.Timeouts.FirstMessage = 200 * time.Millisecond }},
	}
	for _, tc := range cases {
		t.Run(string(tc.rule)+"/"+tc.gen, func(t *testing.T) {
			h := start(t, m, func(c *config.Config) {
				c.Generation = tc.gen
				if tc.mutate != nil {
					tc.mutate(c)
				}
			})
			c := h.dial()
			if len(tc.valid) > 0 {
				c.Write(tc.valid)
				eventually(t, "the valid messages", func() bool { return bytes.Equal(h.store.Received(0), tc.valid) })
			}
			bad := unhex(t, tc.bad)
			c.Write(bad)
			closedByPeer(t, c)
			if got := h.store.Received(0); !bytes.Equal(got, tc.valid) {
				t.Fatalf("store received %x, want exactly the valid prefix %x", got, tc.valid)
			}
			var ev map[string]any
			eventually(t, "the audit event", func() bool {
				evs := h.audit.events(t)
				if len(evs) > 0 {
					ev = evs[0]
				}
				return ev != nil
			})
			if ev["event.action"] != "blocked" || ev["event.reason"] != string(tc.rule) ||
				ev["storeguard.offset"] != float64(tc.offset) || ev["source.ip"] != "127.0.0.1" ||
				ev["network.community_id"] == "" || ev["storeguard.mode"] != "enforce" {
				t.Errorf("audit event %v; want rule %s offset %d", ev, tc.rule, tc.offset)
			}
			if len(bad) > 0 && tc.rule != protocol.RuleFirstMessageTimeout {
				want := hex.EncodeToString(bad[:min(len(bad), 32)])
				if tc.rule == protocol.RuleValidateBadMagic || tc.rule == protocol.RuleUnknownOpcode {
					want = hex.EncodeToString(bad)
				}
				if ev["storeguard.first_bytes"] != want {
					t.Errorf("first bytes %v, want %s", ev["storeguard.first_bytes"], want)
				}
			}
			if v := h.metric(`storeguard_violations_total{mode="enforce",rule="` + string(tc.rule) + `"}`); v != "1" {
				t.Errorf("violations metric %q", v)
			}
		})
	}
}

func TestMonitorModeForwardsAndRecords(t *testing.T) { run(t, testMonitorModeForwardsAndRecords) }

func testMonitorModeForwardsAndRecords(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "1.13"; c.Mode = config.ModeMonitor })
	c := h.dial()
	probe := unhex(t, "03 00000b06e0000000 000000")
	more := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	c.Write(probe)
	c.Write(more)
	want := append(append([]byte{}, probe...), more...)
	eventually(t, "everything forwarded", func() bool { return bytes.Equal(h.store.Received(0), want) })
	// The guard sends the offending message on before it writes the event.
	eventually(t, "the audit event", func() bool { return len(h.audit.events(t)) > 0 })
	evs := h.audit.events(t)
	if len(evs) != 1 || evs[0]["event.action"] != "would_block" || evs[0]["event.reason"] != "key_too_long" ||
		evs[0]["storeguard.declared"] != "962174058496" || evs[0]["storeguard.limit"] != "8192" {
		t.Fatalf("events %v", evs)
	}
	if v := h.metric(`storeguard_violations_total{mode="monitor",rule="key_too_long"}`); v != "1" {
		t.Errorf("metric %q", v)
	}
	if v := h.metric(`storeguard_bans_total`); v != "0" {
		t.Errorf("monitor mode banned: %q", v)
	}
}

func TestAccessLists(t *testing.T) { run(t, testAccessLists) }

func testAccessLists(t *testing.T, m mode) {
	for _, tc := range []struct {
		name   string
		mutate func(*config.Config)
		reason string
	}{
		{"deny", func(c *config.Config) { c.Access.Deny = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")} }, "denied"},
		{"allow", func(c *config.Config) { c.Access.Allow = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")} }, "not_allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, m, tc.mutate)
			c := h.dial()
			c.Write([]byte{0x06})
			closedByPeer(t, c)
			if n := h.store.NumConns(); n != 0 {
				t.Fatalf("store saw %d connections", n)
			}
			if v := h.metric(`storeguard_connections_refused_total{reason="` + tc.reason + `"}`); v != "1" {
				t.Errorf("refused metric %q", v)
			}
			evs := h.audit.events(t)
			if len(evs) != 1 || evs[0]["event.action"] != "denied" || evs[0]["event.reason"] != tc.reason {
				t.Errorf("events %v", evs)
			}
		})
	}
}

func TestPerSourceConnectionCap(t *testing.T) { run(t, testPerSourceConnectionCap) }

func testPerSourceConnectionCap(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Caps.PerSourceConnections = 2 })
	a, b := h.dial(), h.dial()
	a.Write([]byte{0x06})
	b.Write([]byte{0x06})
	eventually(t, "two upstream connections", func() bool { return h.store.NumConns() == 2 })
	third := h.dial()
	closedByPeer(t, third)
	if v := h.metric(`storeguard_connections_refused_total{reason="source_connections"}`); v != "1" {
		t.Errorf("refused metric %q", v)
	}
	a.Close()
	eventually(t, "a slot freed", func() bool { return h.metric("storeguard_connections_active") == "1" })
	d := h.dial()
	d.Write([]byte{0x06})
	eventually(t, "a new upstream connection", func() bool { return h.store.NumConns() == 3 })
}

func TestBanAfterRepeatedViolations(t *testing.T) { run(t, testBanAfterRepeatedViolations) }

func testBanAfterRepeatedViolations(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Generation = "1.13"
		c.Ban.Violations, c.Ban.Window, c.Ban.Duration = 2, time.Minute, time.Minute
		c.Ban.Exempt = nil // the test's clients are on loopback, exempt by default
	})
	for range 2 {
		c := h.dial()
		c.Write(unhex(t, "ff"))
		closedByPeer(t, c)
	}
	c := h.dial()
	closedByPeer(t, c)
	if v := h.metric(`storeguard_connections_refused_total{reason="banned"}`); v != "1" {
		t.Errorf("refused metric %q", v)
	}
	if v := h.metric(`storeguard_bans_total`); v != "1" {
		t.Errorf("bans %q", v)
	}
	if v := h.metric(`storeguard_bans_active`); v != "1" {
		t.Errorf("active bans %q", v)
	}
	var banned int
	for _, e := range h.audit.events(t) {
		if e["event.action"] == "banned" {
			banned++
		}
	}
	if banned != 1 {
		t.Errorf("%d banned events", banned)
	}
}

func TestReload(t *testing.T) { run(t, testReload) }

func testReload(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "1.13" })
	live := h.dial()
	live.Write([]byte{0x06})
	eventually(t, "live connection", func() bool { return h.store.NumConns() == 1 })

	bad := testConfig(m, h.store.Addr())
	bad.Generation = "1.13"
	bad.Listen = "127.0.0.1:1" // valid, and not the address it listens on
	if err := h.srv.Reload(parsed(t, bad)); err == nil {
		t.Fatal("a new listen address reloaded")
	}
	if v := h.metric(`storeguard_config_reloads_total{result="failed"}`); v != "1" {
		t.Errorf("failed reloads %q", v)
	}
	good := testConfig(m, h.store.Addr())
	good.Generation = "1.13"
	good.Access.Deny = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	if err := h.srv.Reload(parsed(t, good)); err != nil {
		t.Fatal(err)
	}
	if v := h.metric(`storeguard_config_reloads_total{result="ok"}`); v != "1" {
		t.Errorf("ok reloads %q", v)
	}
	closedByPeer(t, h.dial())
	// The live connection keeps running under the config it was accepted with.
	live.Write([]byte{0x06})
	eventually(t, "live connection still forwards", func() bool { return bytes.Equal(h.store.Received(0), []byte{6, 6}) })
}

func TestDrainOnShutdown(t *testing.T) { run(t, testDrainOnShutdown) }

func testDrainOnShutdown(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "1.13"; c.Timeouts.Drain = 300 * time.Millisecond })
	c := h.dial()
	c.Write([]byte{0x06})
	eventually(t, "connection up", func() bool { return h.store.NumConns() == 1 })
	began := time.Now()
	h.cancel()
	if _, err := net.DialTimeout("tcp", h.addr, time.Second); err == nil {
		// The listener may take a moment to close; a second try must fail.
		time.Sleep(100 * time.Millisecond)
		if c2, err := net.Dial("tcp", h.addr); err == nil {
			c2.Close()
			t.Error("still accepting after shutdown")
		}
	}
	closedByPeer(t, c)
	if d := time.Since(began); d < 250*time.Millisecond {
		t.Errorf("connection closed after %v, before the drain time", d)
	}
	select {
	case <-h.done:
	case <-time.After(patience):
		t.Fatal("Serve did not return")
	}
}

func TestUpstreamDownAndBack(t *testing.T) { run(t, testUpstreamDownAndBack) }

func testUpstreamDownAndBack(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "1.13"; c.Timeouts.UpstreamDial = time.Second })
	addr := h.store.Addr()
	h.store.Close()
	c := h.dial()
	c.Write([]byte{0x06}) // the store is dialled for a client's first valid message
	closedByPeer(t, c)
	if v := h.metric("storeguard_upstream_dial_failures_total"); v != "1" {
		t.Errorf("dial failures %q", v)
	}
	resp, err := http.Get("http://" + h.srv.MetricsAddr().String() + "/readyz")
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("readyz with the store down: %v %v", resp.Status, err)
	}
	store := recorder(t, addr)
	c = h.dial()
	c.Write([]byte{0x06})
	eventually(t, "forwarded to the store that came back", func() bool { return bytes.Equal(store.Received(0), []byte{6}) })
	resp, err = http.Get("http://" + h.srv.MetricsAddr().String() + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("readyz with the store up: %v %v", resp.Status, err)
	}
}

// TestSilentG0CallbackConnectionSpared: torch <= 2.0 opens a second connection per store that
// never sends a byte; with a first-message deadline it must survive when its source has a working
// connection, and a lone silent connection must not.
func TestSilentG0CallbackConnectionSpared(t *testing.T) { run(t, testSilentG0CallbackConnectionSpared) }

func testSilentG0CallbackConnectionSpared(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "1.13"; c.Timeouts.FirstMessage = 150 * time.Millisecond })
	lone := h.dial()
	closedByPeer(t, lone)
	main := h.dial()
	main.Write([]byte{0x06})
	eventually(t, "main connection forwarded", func() bool {
		for i := range h.store.NumConns() {
			if bytes.Equal(h.store.Received(i), []byte{6}) {
				return true
			}
		}
		return false
	})
	callback := h.dial()
	time.Sleep(400 * time.Millisecond)
	callback.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := callback.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("silent callback connection closed: %v", err)
	}
}

func TestBudgetBoundsBufferedBytes(t *testing.T) { run(t, testBudgetBoundsBufferedBytes) }

func testBudgetBoundsBufferedBytes(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Generation = "1.13"
		c.Caps.BufferBudgetBytes = 64 << 10
		// a maximal message within the budget (config.Parse)
		c.Limits.MaxKeyBytes, c.Limits.MaxValueBytes, c.Limits.MaxMessageBytes = 1024, 60<<10, 64<<10
		c.Timeouts.Message = 1500 * time.Millisecond // the second client may wait this, then stall as long
	})
	// Two clients each start a 48 KiB value: the second must wait for budget, and both partial
	// messages time out without the budget ever being exceeded.
	head := func() []byte {
		b := protocol.AppendBytes([]byte{0x00}, []byte("/big"))
		return append(b, 0x00, 0xC0, 0, 0, 0, 0, 0, 0) // value length 48 KiB
	}
	for range 2 {
		c := h.dial()
		c.Write(append(head(), make([]byte, 40<<10)...))
	}
	buffered := func() float64 {
		var v float64
		fmt.Sscan(h.metric("storeguard_buffered_bytes"), &v)
		return v
	}
	eventually(t, "partial messages held", func() bool { return buffered() > 0 })
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if v := buffered(); v > 64<<10 {
			t.Fatalf("buffered %v bytes, budget %d", v, 64<<10)
		}
	}
	eventually(t, "budget released after the message deadline", func() bool { return buffered() == 0 })
	// The first client's stalled message is its violation. The second waited for budget, which
	// is not: it either got the budget when the first let go and then stalled on its own, or was
	// closed after waiting timeouts.message in vain, without a violation.
	var timeouts, waits int
	eventually(t, "both clients judged", func() bool {
		fmt.Sscan(h.metric(`storeguard_violations_total{mode="enforce",rule="message_timeout"}`), &timeouts)
		fmt.Sscan(h.metric(`storeguard_budget_wait_timeouts_total`), &waits)
		return timeouts+waits == 2
	})
	if timeouts < 1 {
		t.Errorf("message timeouts %d, budget wait timeouts %d: the stalled holder's violation is missing", timeouts, waits)
	}
}

// One source's stalled messages take at most its share of the budget: another source's message
// goes through at once. Measured before the share: 40 partial 8 MiB SETs from one host pinned the
// whole default budget and a benign 1 MiB SET waited 14.6 s.
func TestBudgetShareOfOneSource(t *testing.T) { run(t, testBudgetShareOfOneSource) }

func testBudgetShareOfOneSource(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Generation = "1.13"
		c.Caps.BufferBudgetBytes, c.Caps.PerSourceBudgetBytes = 256<<10, 64<<10
		// a maximal message within the budget (config.Parse)
		c.Limits.MaxKeyBytes, c.Limits.MaxValueBytes, c.Limits.MaxMessageBytes = 1024, 128<<10, 256<<10
		c.Timeouts.Message = 10 * time.Minute // the held messages keep their share for the whole test
	})
	head := func(n int) []byte {
		b := protocol.AppendBytes([]byte{0x00}, []byte("/big"))
		return binary.LittleEndian.AppendUint64(b, uint64(n))
	}
	for range 8 { // 8 × 40 KiB held of 48 KiB values: more than the whole budget
		c := h.dial()
		c.Write(append(head(48<<10), make([]byte, 40<<10)...))
	}
	time.Sleep(300 * time.Millisecond)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}} // another source
	other, err := d.Dial("tcp4", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	set := append(head(100<<10), make([]byte, 100<<10)...)
	other.Write(set)
	// Without the share it waits for the held messages' timeout, 10 minutes away.
	eventually(t, "the other source's SET at the store, while one source's messages stall", func() bool {
		for i := range h.store.NumConns() {
			if bytes.Equal(h.store.Received(i), set) {
				return true
			}
		}
		return false
	})
}

func TestWatchReloadOnFileChangeAndSignal(t *testing.T) { run(t, testWatchReloadOnFileChangeAndSignal) }

func testWatchReloadOnFileChangeAndSignal(t *testing.T, m mode) {
	h := start(t, m, nil)
	path := t.TempDir() + "/storeguard.yaml"
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := "listen: " + h.addr + "\nupstream: " + h.store.Addr() + "\nmetrics-listen: " +
		h.srv.MetricsAddr().String() + "\ngeneration: \"1.13\"\nevent-loops: " + fmt.Sprint(m.eventLoops()) + "\n"
	write(base)
	load := func() (*config.Parsed, error) { return config.LoadParsed(config.Options{File: path, Env: []string{}}) }
	hup := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.srv.WatchReload(ctx, load, path, hup)
	time.Sleep(100 * time.Millisecond) // let it hash the file as it is now

	write(base + "access:\n  deny: [127.0.0.1/32]\n")
	eventually(t, "reload on file change", func() bool {
		return h.metric(`storeguard_config_reloads_total{result="ok"}`) == "1"
	})
	closedByPeer(t, h.dial())

	write(base + "limits:\n  max-key-bytes: 0\n")
	eventually(t, "failed reload on a bad file", func() bool {
		return h.metric(`storeguard_config_reloads_total{result="failed"}`) == "1"
	})
	closedByPeer(t, h.dial()) // the deny list of the last good config still holds

	write(base)
	hup <- syscall.SIGHUP
	eventually(t, "reload on SIGHUP", func() bool {
		return h.metric(`storeguard_config_reloads_total{result="ok"}`) == "2"
	})
	c := h.dial()
	c.Write([]byte{0x06})
	eventually(t, "forwarding after the deny list was lifted", func() bool { return h.store.NumConns() == 1 })
}

// TestWorkerBeforeStore: a client that connects before the store listens is held until the store
// comes up, not closed (torch retries a refused connect, not a closed connection).
func TestWorkerBeforeStore(t *testing.T) { run(t, testWorkerBeforeStore) }

func testWorkerBeforeStore(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Timeouts.UpstreamDial = 10 * time.Second })
	addr := h.store.Addr()
	h.store.Close()
	c := h.dial()
	c.Write([]byte{0x06})
	time.Sleep(300 * time.Millisecond)
	store := recorder(t, addr)
	store.SetReply([]byte("12345678"))
	eventually(t, "the held message at the late store", func() bool { return bytes.Equal(store.Received(0), []byte{6}) })
	c.SetReadDeadline(time.Now().Add(patience))
	if _, err := io.ReadFull(c, make([]byte, 8)); err != nil {
		t.Fatalf("no reply through the late store: %v", err)
	}
	if v := h.metric("storeguard_upstream_dial_failures_total"); v != "0" {
		t.Errorf("dial failures %q", v)
	}
}

// TestHostileBeforeStoreIsUp: while the store is not up yet, a hostile message is refused at
// once, not held for the dial.
func TestHostileBeforeStoreIsUp(t *testing.T) { run(t, testHostileBeforeStoreIsUp) }

func testHostileBeforeStoreIsUp(t *testing.T, m mode) {
	// Held for the dial, the client would wait 10 minutes; closedByPeer waits patience.
	h := start(t, m, func(c *config.Config) { c.Timeouts.UpstreamDial = 10 * time.Minute })
	h.store.Close()
	c := h.dial()
	c.Write(unhex(t, "03 00000b06e0000000 000000"))
	closedByPeer(t, c)
	if v := h.metric("storeguard_upstream_dial_failures_total"); v != "0" {
		t.Errorf("a refused client counted as a dial failure: %q", v)
	}
}

// Out of descriptors, accepting fails with EMFILE while the connection waits in the listen queue:
// the proxy backs off instead of spinning on a listener that stays readable, and serves the
// connection once descriptors are free again. Both accept paths: the loops' and Serve's.
func TestAcceptOutOfDescriptorsBacksOff(t *testing.T) {
	run(t, testAcceptOutOfDescriptorsBacksOff, serially)
}

func testAcceptOutOfDescriptorsBacksOff(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "2.6" })
	// A first connection served end to end: Serve is accepting (and its loops started) before
	// descriptors run out.
	hs := protocol.AppendHandshake(nil, protocol.G3, 5)
	h.dial().Write(hs)
	eventually(t, "a first connection served", func() bool { return bytes.Equal(h.store.Received(0), hs) })
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	restored := true
	restore := func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	// Room for exactly one more descriptor: the test's client socket. The proxy's accept fails. The
	// process may open a descriptor of its own meanwhile (the store's probes, /proc reads): then the
	// dial finds none, and the test makes room again.
	before := testutil.ToFloat64(h.srv.m.acceptErrors)
	var c net.Conn
	for try := 1; ; try++ {
		low, err := syscall.Dup(0) // the lowest free descriptor
		if err != nil {
			t.Fatal(err)
		}
		syscall.Close(low)
		tight := lim
		tight.Cur = uint64(low) + 1
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &tight); err != nil {
			t.Fatal(err)
		}
		restored = false
		if c, err = net.Dial("tcp", h.addr); err == nil {
			break
		}
		restore()
		if !errors.Is(err, syscall.EMFILE) || try == 50 {
			t.Fatalf("dial with one descriptor free (try %d): %v", try, err)
		}
		t.Logf("the dial found no descriptor free (try %d): making room again", try)
		time.Sleep(10 * time.Millisecond)
		before = testutil.ToFloat64(h.srv.m.acceptErrors)
	}
	defer c.Close()
	// Out of descriptors, each failed accept pauses its acceptor for acceptPause: counted, not timed (a
	// loaded machine makes fewer attempts, never more). The test's servers have at most two acceptors
	// (eventLoops); the bound allows four. A spinning accept failed 408 times in 400 ms even pausing
	// 50 µs. (Read from the counter: scraping /metrics would need a descriptor.)
	time.Sleep(400 * time.Millisecond)
	failed := testutil.ToFloat64(h.srv.m.acceptErrors) - before
	restore()
	const bound = 4 * (400/50 + 2) // acceptors, each failing at most once in 50 ms
	if failed > bound {
		t.Errorf("%v failed accepts in 400 ms out of descriptors (at most %v, pausing 50 ms): accepting spins", failed, bound)
	}
	if failed == 0 {
		t.Errorf("no failed accept counted in 400 ms out of descriptors")
	}
	if _, err := c.Write(hs); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the connection served once descriptors are free", func() bool {
		return bytes.Equal(h.store.Received(1), hs)
	})
}
