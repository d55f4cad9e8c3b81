//go:build linux

package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/upgrade"
)

// takeOver starts a second server with h's configuration (changed by mutate) that takes
// everything over from h's (HandOver, TakeOver), as a new process would, and serves.
func (h *harness) takeOver(t *testing.T, mutate func(*config.Config)) (*harness, error) {
	t.Helper()
	mine, theirs, err := fdpass.Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	defer theirs.Close()
	cfg := h.srv.set.Load().cfg
	if mutate != nil {
		mutate(&cfg)
	}
	next := &harness{t: t, audit: &syncBuffer{}, done: make(chan struct{}), store: h.store, ids: h.ids}
	srv, err := New(parsed(t, cfg), Options{Audit: audit.New(next.audit, audit.Options{}), Identity: h.ids})
	if err != nil {
		t.Fatal(err)
	}
	took := make(chan error, 1)
	go func() {
		err := srv.TakeOver(theirs)
		if err != nil {
			theirs.Close() // as the new process's end closes it when it exits
		}
		took <- err
	}()
	_, herr := h.srv.HandOver(mine, nil)
	terr := <-took
	if herr != nil {
		upgrade.Thaw(herr)
		return nil, herr
	}
	if terr != nil {
		t.Fatalf("the new server failed (%v) though the old one handed over", terr)
	}
	next.srv, next.addr = srv, srv.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	next.cancel = cancel
	go func() { srv.Serve(ctx); close(next.done) }()
	t.Cleanup(func() {
		cancel()
		<-next.done
	})
	return next, nil
}

// TestUpgradeKeepsEveryConnection: connections in every state go on through the new server as if
// nothing happened: no byte lost, none forwarded twice, a message half-received before the
// hand-over completed after it, replies flowing, and the old server's Serve returns.
func TestUpgradeKeepsEveryConnection(t *testing.T) { run(t, testUpgradeKeepsEveryConnection) }

func testUpgradeKeepsEveryConnection(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "2.6" })
	h.store.Answer(protocol.GenSetting{Gen: protocol.G3})
	hs := protocol.AppendHandshake(nil, protocol.G3, 1)
	set := func(k string) []byte {
		return enc(t, protocol.G3, protocol.Request{Op: protocol.OpSet, Key: []byte(k), Value: bytes.Repeat([]byte("v"), 300)})
	}
	add := enc(t, protocol.G3, protocol.Request{Op: protocol.OpAdd, Key: []byte("/ctr"), Int: 1})

	// whole: between messages, a reply read. half: the first 100 bytes of a SET held. silent:
	// connected, nothing sent (no store connection yet).
	whole, half, silent := h.dial(), h.dial(), h.dial()
	whole.Write(append(append([]byte{}, hs...), add...))
	readReply(t, whole, 8)
	partial := append(append([]byte{}, hs...), set("/half")...)
	half.Write(partial[:len(hs)+100])
	eventually(t, "two store connections", func() bool { return h.store.NumConns() == 2 })
	eventually(t, "the handshakes", func() bool { return len(h.store.Received(1)) == len(hs) })

	next, err := h.takeOver(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.done:
	case <-time.After(patience):
		t.Fatal("the old server's Serve did not return after handing over")
	}

	whole.Write(add)
	readReply(t, whole, 8)
	half.Write(partial[len(hs)+100:])
	silent.Write(append(append([]byte{}, hs...), add...))
	readReply(t, silent, 8)
	eventually(t, "every byte at the store once", func() bool {
		return bytes.Equal(h.store.Received(0), append(append(append([]byte{}, hs...), add...), add...)) &&
			bytes.Equal(h.store.Received(1), partial) && h.store.NumConns() == 3
	})
	// A new connection is accepted on the same address by the new server.
	fresh := next.dial()
	fresh.Write(append(append([]byte{}, hs...), add...))
	readReply(t, fresh, 8)

	var handover map[string]any
	eventually(t, "the hand-over's audit event", func() bool {
		for _, e := range next.audit.events(t) {
			if e["event.action"] == "handover" {
				handover = e
			}
		}
		return handover != nil
	})
	if handover["storeguard.connections"] != float64(3) || handover["event.reason"] != "upgrade" {
		t.Errorf("handover event %v, want 3 connections for an upgrade", handover)
	}
	if v := next.metric(`storeguard_handovers_total{result="ok"}`); v != "1" {
		t.Errorf("handovers_total ok = %q, want 1", v)
	}
	// The flow records span both processes: the half connection's bytes from before and after.
	half.Close()
	var flow map[string]any
	eventually(t, "the half connection's flow record", func() bool {
		for _, f := range next.audit.flows(t) {
			if f["source.port"] == float64(half.LocalAddr().(*net.TCPAddr).Port) {
				flow = f
			}
		}
		return flow != nil
	})
	if flow["source.bytes"] != float64(len(partial)) || flow["storeguard.store_bytes"] != float64(len(partial)) ||
		flow["storeguard.messages"] != float64(3) || flow["storeguard.verdict"] != "passed" {
		t.Errorf("flow %v; want %d bytes from the client and to the store, 3 messages (VALIDATE, PING, SET)", flow, len(partial))
	}
	if fs := h.audit.flows(t); len(fs) != 0 {
		t.Errorf("the old process wrote flow records for connections it handed over: %v", fs)
	}
}

// TestFailedUpgradeKeepsServing: when the new server cannot take over (here its new listen address
// is taken), the old one thaws and serves on: the connection's half message completes through it.
func TestFailedUpgradeKeepsServing(t *testing.T) { run(t, testFailedUpgradeKeepsServing) }

func testFailedUpgradeKeepsServing(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "1.13" })
	set := enc(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: []byte("value")})
	get := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	c := h.dial()
	c.Write(append(append([]byte{}, get...), set[:5]...))
	eventually(t, "the first message", func() bool { return bytes.Equal(h.store.Received(0), get) })

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	if _, err := h.takeOver(t, func(c *config.Config) { c.Listen = taken.Addr().String() }); err == nil {
		t.Fatal("the hand-over succeeded though the new server could not listen")
	}
	c.Write(set[5:])
	eventually(t, "the SET completed through the old server", func() bool {
		return bytes.Equal(h.store.Received(0), append(get, set...))
	})
	c2 := h.dial() // and it accepts again
	c2.Write(get)
	eventually(t, "a new connection", func() bool { return bytes.Equal(h.store.Received(1), get) })
	if v := h.metric(`storeguard_handovers_total{result="failed"}`); v != "1" {
		t.Errorf("handovers_total failed = %q, want 1", v)
	}
}

// repliesQueued is the most reply bytes one of h's connections holds for its client.
func (h *harness) repliesQueued() int {
	h.srv.reg.mu.Lock()
	defer h.srv.reg.mu.Unlock()
	most := 0
	for cc := range h.srv.reg.conns {
		cc.rep.mu.Lock()
		most = max(most, cc.rep.queued)
		cc.rep.mu.Unlock()
	}
	return most
}

// TestUpgradeCarriesRepliesAndBans: replies the client had not taken yet reach it from the new
// server, and a source banned by the old server stays banned.
func TestUpgradeCarriesRepliesAndBans(t *testing.T) {
	h := start(t, goroutineMode, func(c *config.Config) {
		c.Generation = "1.13"
		c.Ban.Violations, c.Ban.Window, c.Ban.Duration, c.Ban.Exempt = 1, time.Minute, time.Hour, nil
	})
	big := bytes.Repeat([]byte("r"), 16<<20) // more than the sockets hold: most of it waits in the guard
	h.store.SetReply(big)
	c := h.dial()
	c.Write(enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys}))
	eventually(t, "replies queued in the guard", func() bool { return h.repliesQueued() > 1<<20 })
	// Another source: one with a rank's connection that sent valid messages is never banned.
	other := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	bad, err := other.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	bad.Write([]byte{0xff})
	closedByPeer(t, bad)
	eventually(t, "the ban", func() bool {
		for _, e := range h.audit.events(t) {
			if e["event.action"] == "banned" {
				return true
			}
		}
		return false
	})

	next, err := h.takeOver(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(io.LimitReader(c, int64(len(big))))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("client read %d of %d reply bytes (%v)", len(got), len(big), err)
	}
	again, err := other.Dial("tcp", next.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	closedByPeer(t, again) // refused: still banned
	eventually(t, "the refusal as banned", func() bool {
		for _, e := range next.audit.events(t) {
			if e["event.action"] == "denied" && e["event.reason"] == "banned" {
				return true
			}
		}
		return false
	})
}

// TestUpgradeInMonitorMode: a stream that passes undecoded after a violation (monitor mode) goes
// on passing through the new server, and a decoded one goes on decoding.
func TestUpgradeInMonitorMode(t *testing.T) { run(t, testUpgradeInMonitorMode) }

func testUpgradeInMonitorMode(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Generation, c.Mode = "1.13", config.ModeMonitor
	})
	get := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	passing, decoded := h.dial(), h.dial()
	passing.Write(append(append([]byte{}, get...), 0xfe, 0x01))
	decoded.Write(get)
	eventually(t, "both streams at the store", func() bool {
		return h.store.NumConns() == 2 && len(h.store.Received(0))+len(h.store.Received(1)) == 2*len(get)+2
	})
	next, err := h.takeOver(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	passing.Write([]byte{0xfd, 0x02})
	decoded.Write([]byte{0xfc})
	want := map[string]bool{string(append(append([]byte{}, get...), 0xfe, 0x01, 0xfd, 0x02)): true,
		string(append(append([]byte{}, get...), 0xfc)): true}
	eventually(t, "both streams' bytes after the hand-over", func() bool {
		return want[string(h.store.Received(0))] && want[string(h.store.Received(1))] &&
			!bytes.Equal(h.store.Received(0), h.store.Received(1))
	})
	eventually(t, "the decoded stream's violation recorded by the new server", func() bool {
		for _, e := range next.audit.events(t) {
			if e["event.action"] == "would_block" && e["event.reason"] == "unknown_opcode" {
				return true
			}
		}
		return false
	})
}

// TestListensAt: the configured listen address names the socket handed over however it is
// written (the sidecar's ":29499" is the socket "[::]:29499"); another port or address does not.
func TestListensAt(t *testing.T) {
	any6, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer any6.Close()
	port := any6.Addr().(*net.TCPAddr).Port
	lo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lo.Close()
	loPort := lo.Addr().(*net.TCPAddr).Port
	for _, c := range []struct {
		addr string
		ln   net.Listener
		want bool
	}{
		{fmt.Sprintf(":%d", port), any6, true},
		{fmt.Sprintf("0.0.0.0:%d", port), any6, true},
		{fmt.Sprintf("[::]:%d", port), any6, true},
		{"", any6, true},
		{fmt.Sprintf(":%d", port+1), any6, false},
		{fmt.Sprintf("127.0.0.1:%d", loPort), lo, true},
		{fmt.Sprintf("127.0.0.2:%d", loPort), lo, false},
		{fmt.Sprintf(":%d", loPort), lo, false},
	} {
		if got := listensAt(c.addr, c.ln); got != c.want {
			t.Errorf("listensAt(%q, %s) = %v, want %v", c.addr, c.ln.Addr(), got, c.want)
		}
	}
}

// TestUpgradeToANewListenAddress: a restart for a new listen address goes through the same
// hand-over: the connections made on the old address go on, new ones are accepted on the new
// address, and the old address stops accepting.
func TestUpgradeToANewListenAddress(t *testing.T) { run(t, testUpgradeToANewListenAddress) }

func testUpgradeToANewListenAddress(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "1.13" })
	get := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	old := h.dial()
	old.Write(get)
	eventually(t, "the first message", func() bool { return bytes.Equal(h.store.Received(0), get) })
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	newAddr := free.Addr().String()
	free.Close()
	next, err := h.takeOver(t, func(c *config.Config) { c.Listen = newAddr })
	if err != nil {
		t.Fatal(err)
	}
	if next.addr != newAddr {
		t.Fatalf("the new server listens on %s, want %s", next.addr, newAddr)
	}
	old.Write(get)
	eventually(t, "the old connection's second message", func() bool {
		return bytes.Equal(h.store.Received(0), append(append([]byte{}, get...), get...))
	})
	fresh := next.dial()
	fresh.Write(get)
	eventually(t, "a connection on the new address", func() bool { return bytes.Equal(h.store.Received(1), get) })
	eventually(t, "the old address closed", func() bool {
		c, err := net.DialTimeout("tcp", h.addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
}

// TestUpgradeWhileAStoreDoesNotRead: a connection whose guard is writing to a store that does not
// read (16 MiB of SETs: more than the sockets hold) parks too: the freeze stops the write, and what
// it did not write waits, like a loop's unwritten bytes, for the thaw or the next process. It used
// to fail every upgrade after the freeze timeout. Whether the hand-over succeeds or fails (the new
// server cannot listen), once the store reads again every byte of both connections reaches it once,
// in order, and a read the freeze woke is no idle timeout.
func TestUpgradeWhileAStoreDoesNotRead(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(map[bool]string{false: "handed over", true: "failed"}[fail], func(t *testing.T) {
			run(t, func(t *testing.T, m mode) { testUpgradeWhileAStoreDoesNotRead(t, m, fail) })
		})
	}
}

func testUpgradeWhileAStoreDoesNotRead(t *testing.T, m mode, fail bool) {
	h := start(t, m, func(c *config.Config) { c.Generation = "1.13" })
	h.srv.cont.freezeTimeout = 2 * time.Second // a connection that cannot park fails the hand-over soon
	get := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	set := enc(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: make([]byte, 1<<20)})
	idle, busy := h.dial(), h.dial()
	idle.Write(get)
	busy.Write(get)
	eventually(t, "both connected", func() bool { return h.store.NumConns() == 2 })
	h.store.Pause()
	var sent []byte
	wrote := make(chan struct{})
	go func() { // 16 MiB of SETs: more than the sockets hold, so the guard's write to the store waits
		defer close(wrote)
		for range 16 {
			busy.Write(set)
		}
	}()
	for range 16 {
		sent = append(sent, set...)
	}
	time.Sleep(300 * time.Millisecond)

	var mutate func(*config.Config)
	if fail {
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		mutate = func(c *config.Config) { c.Listen = taken.Addr().String() }
	}
	next, err := h.takeOver(t, mutate)
	if (err != nil) != fail {
		t.Fatalf("the hand-over: %v; want it to fail: %v", err, fail)
	}
	serving := h.srv
	if !fail {
		serving = next.srv
	}
	h.store.Resume()
	time.Sleep(200 * time.Millisecond)
	idle.Write(get)
	select { // the last GET after every SET, as want has it: not written into their middle
	case <-wrote:
	case <-time.After(30 * time.Second):
		t.Fatal("the client's 16 MiB of SETs were not all taken in 30 s after the store resumed")
	}
	busy.Write(get)
	want := append(append(append([]byte{}, get...), sent...), get...)
	// Waiting on the lengths: copying 16 MiB every few milliseconds (Received) holds the store's
	// lock and slows the very transfer waited for.
	eventuallyWithin(t, 30*time.Second, "every byte of both connections", func() bool {
		return h.store.ReceivedLen(0)+h.store.ReceivedLen(1) == len(want)+2*len(get)
	})
	if a, b := h.store.Received(0), h.store.Received(1); !bytes.Equal(a, want) && !bytes.Equal(b, want) {
		t.Fatalf("neither store connection got the busy connection's bytes as sent (%d and %d bytes)", len(a), len(b))
	}
	// Between messages again, the connections hold no budget: what the write left pending gave
	// its carry's budget back once written.
	eventually(t, "no budget held", func() bool { return serving.buf.inUse() == 0 })
}
