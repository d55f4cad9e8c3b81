package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
)

// A connection costs the store a connection only once it has sent a valid message: a scanner's
// connect-and-close, a silent connection and a hostile first message never reach the store, so
// that a flood of them can exhaust neither the store's descriptors (torch 1.13 aborts on EMFILE)
// nor its accept path (torch 2.15 accepts about 10 a second). A valid client is then connected
// and served as before.
func TestStoreConnectionsOnlyForValidMessages(t *testing.T) {
	run(t, testStoreConnectionsOnlyForValidMessages)
}

func testStoreConnectionsOnlyForValidMessages(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Generation = "2.6"
		c.Ban.Violations = 0 // every hostile connection reaches the decoder
	})
	h.store.SetReply([]byte("ok"))
	for range 20 {
		h.dial().Close() // connect and close
	}
	silent := make([]interface{ Close() error }, 0, 20)
	for range 20 {
		silent = append(silent, h.dial()) // connected, silent
	}
	for range 20 {
		c := h.dial()
		c.Write([]byte{0xff}) // unknown opcode
		closedByPeer(t, c)
	}
	partial := h.dial()
	partial.Write(protocol.AppendHandshake(nil, protocol.G3, 1)[:3]) // a VALIDATE that never completes
	time.Sleep(200 * time.Millisecond)
	if n := h.store.NumConns(); n != 0 {
		t.Fatalf("the store has %d connections from clients that sent no valid message", n)
	}
	c := h.dial()
	msgs := append(protocol.AppendHandshake(nil, protocol.G3, 7), enc(t, protocol.G3,
		protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: []byte("v")})...)
	c.Write(msgs)
	eventually(t, "the valid client at the store", func() bool { return bytes.Equal(h.store.Received(0), msgs) })
	if n := h.store.NumConns(); n != 1 {
		t.Fatalf("the store has %d connections, want the valid client's only", n)
	}
	for _, s := range silent {
		s.Close()
	}
}

// dialFrom connects to the guard from source ip (any 127/8 address is this host's).
func (h *harness) dialFrom(ip string) net.Conn {
	h.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp4", h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// Store connections are capped in all and per source: a client whose first valid message finds a
// cap full waits for a store connection to close and then gets it, or is closed after
// timeouts.upstream-dial, counted and audited, never as a violation.
func TestStoreConnectionCaps(t *testing.T) { run(t, testStoreConnectionCaps) }

func testStoreConnectionCaps(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Caps.MaxStoreConnections = config.AutoCount{N: 3}
		c.Caps.PerSourceStoreConnections = 2
	})
	client, atStore := namedClients(t, h)
	waits := func(name, why string) {
		t.Helper()
		time.Sleep(200 * time.Millisecond)
		if atStore(name) {
			t.Fatalf("%s reached the store: %s", name, why)
		}
	}
	a1, a2 := client("a1", "127.0.0.1"), client("a2", "127.0.0.1")
	eventually(t, "two clients of one source at the store", func() bool { return atStore("a1") && atStore("a2") })
	a3 := client("a3", "127.0.0.1")
	waits("a3", "caps.per-source-store-connections is 2")
	b1 := client("b1", "127.0.0.2")
	eventually(t, "another source's client at the store", func() bool { return atStore("b1") })
	c1 := client("c1", "127.0.0.3")
	waits("c1", "caps.max-store-connections is 3")
	if n := h.store.NumOpen(); n != 3 {
		t.Fatalf("the store has %d connections, want 3", n)
	}
	if v := h.metric("storeguard_store_connections"); v != "3" {
		t.Errorf("store_connections = %q, want 3", v)
	}
	if v := h.metric("storeguard_store_connections_limit"); v != "3" {
		t.Errorf("store_connections_limit = %q, want 3", v)
	}

	b1.Close() // 127.0.0.3's client takes the slot; 127.0.0.1 still has its 2
	eventually(t, "the waiting client of the third source at the store", func() bool { return atStore("c1") })
	if atStore("a3") {
		t.Fatal("a3 reached the store while its source held 2")
	}
	a1.Close() // now 127.0.0.1's waiting client
	eventually(t, "the waiting client of the full source at the store", func() bool { return atStore("a3") })
	eventually(t, "a1 and b1 gone from the store", func() bool { return h.store.NumOpen() == 3 })

	cfg := h.srv.set.Load().cfg
	cfg.Timeouts.UpstreamDial = 300 * time.Millisecond
	if err := h.srv.Reload(parsed(t, cfg)); err != nil {
		t.Fatal(err)
	}
	d1 := client("d1", "127.0.0.1") // 127.0.0.1 holds 2 (a2, a3)
	closedByPeer(t, d1)
	if v := h.metric(`storeguard_store_connections_refused_total{reason="source_store_connections"}`); v != "1" {
		t.Errorf("refusals by the source cap = %q, want 1", v)
	}
	var denied int
	for _, e := range h.audit.events(t) {
		if e["event.action"] == "denied" && e["event.reason"] == "source_store_connections" {
			denied++
		}
		if e["event.action"] == "blocked" {
			t.Errorf("a client refused a store connection was recorded as a violation: %v", e)
		}
	}
	if denied != 1 {
		t.Errorf("%d denied events for the source cap, want 1", denied)
	}
	if v := h.metric("storeguard_bans_total"); v != "0" {
		t.Errorf("bans_total = %q", v)
	}
	if got := h.store.NumOpen(); got != 3 {
		t.Errorf("the store has %d connections after the refusal, want 3", got)
	}
	a2.Close()
	a3.Close()
	c1.Close()
	eventually(t, "every store connection given back", func() bool {
		return h.srv.slots.InUse() == 0 && h.store.NumOpen() == 0
	})
}

// The store is dialled no faster than the dial rates: a client past its source's tokens waits, its
// message held, while another source's client goes through; a raised rate lets it through, and a
// client that waits timeouts.upstream-dial in vain is closed, counted and audited, never as a
// violation.
func TestStoreDialRate(t *testing.T) { run(t, testStoreDialRate) }

func testStoreDialRate(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Caps.StoreDialRate = config.AutoRate{}
		c.Caps.PerSourceStoreDialRate, c.Caps.PerSourceStoreDialBurst = 0.001, 2 // a token in 1000 s
	})
	client, atStore := namedClients(t, h)
	reload := func(rate float64, burst int, dial time.Duration) {
		cfg := h.srv.set.Load().cfg
		cfg.Caps.PerSourceStoreDialRate, cfg.Caps.PerSourceStoreDialBurst, cfg.Timeouts.UpstreamDial = rate, burst, dial
		if err := h.srv.Reload(parsed(t, cfg)); err != nil {
			t.Fatal(err)
		}
	}
	client("a1", "127.0.0.1")
	client("a2", "127.0.0.1")
	eventually(t, "a source's burst at the store", func() bool { return atStore("a1") && atStore("a2") })
	client("a3", "127.0.0.1")
	eventually(t, "a3 waiting", func() bool { return h.srv.slots.Waiting() == 1 })
	client("b1", "127.0.0.2")
	eventually(t, "another source's client at the store", func() bool { return atStore("b1") })
	if atStore("a3") {
		t.Fatal("a3 reached the store past its source's dial tokens")
	}
	if v := h.metric(`storeguard_store_connection_waits_total{reason="source_store_dial_rate"}`); v != "1" {
		t.Errorf("waits for the source's dial rate = %q, want 1", v)
	}
	if v := h.metric("storeguard_store_connections_waiting"); v != "1" {
		t.Errorf("store_connections_waiting = %q, want 1", v)
	}

	reload(1000, 1, h.srv.set.Load().cfg.Timeouts.UpstreamDial)
	eventually(t, "the waiting client at the store once the rate is raised", func() bool { return atStore("a3") })

	reload(0.001, 1, 300*time.Millisecond) // one token left, none more for 1000 s
	client("a4", "127.0.0.1")
	eventually(t, "a4 at the store", func() bool { return atStore("a4") })
	closedByPeer(t, client("a5", "127.0.0.1"))
	if atStore("a5") {
		t.Fatal("a5 reached the store")
	}
	if v := h.metric(`storeguard_store_connections_refused_total{reason="source_store_dial_rate"}`); v != "1" {
		t.Errorf("refusals by the source's dial rate = %q, want 1", v)
	}
	var denied int
	for _, e := range h.audit.events(t) {
		if e["event.action"] == "denied" && e["event.reason"] == "source_store_dial_rate" {
			denied++
		}
		if e["event.action"] == "blocked" {
			t.Errorf("a client paced off the store was recorded as a violation: %v", e)
		}
	}
	if denied != 1 {
		t.Errorf("%d denied events for the source's dial rate, want 1", denied)
	}
}

// Every way a connection with a store connection ends gives its slot back, exactly once, on both
// transports: a count that leaked would lock a job out of its store for good.
func TestStoreSlotsAllGivenBack(t *testing.T) { run(t, testStoreSlotsAllGivenBack) }

func testStoreSlotsAllGivenBack(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Caps.MaxStoreConnections = config.AutoCount{N: 12}
		c.Caps.PerSourceStoreConnections = 6
		c.Ban.Violations = 0
	})
	h.store.SetReply(make([]byte, 64<<10)) // a client that does not read makes the loop hand it back
	numkeys := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	set := enc(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: make([]byte, 1000)})
	violation := append(append([]byte(nil), numkeys...), 0xff)
	ends := []func(c net.Conn){
		func(c net.Conn) { c.Close() },                                                               // before a byte
		func(c net.Conn) { c.Write(numkeys); c.Close() },                                             // after a valid message
		func(c net.Conn) { c.Write(violation); c.Close() },                                           // a violation after it
		func(c net.Conn) { c.Write(numkeys); c.(*net.TCPConn).CloseWrite(); io.Copy(io.Discard, c) }, // half-close
		func(c net.Conn) { // a message in pieces, then another in pieces, cut short
			for _, b := range set {
				c.Write([]byte{b})
			}
			c.Write(set[:5])
			c.Close()
		},
		func(c net.Conn) { // replies never read: the loop hands it back to goroutines
			for range 40 {
				if _, err := c.Write(numkeys); err != nil {
					break
				}
				time.Sleep(time.Millisecond)
			}
			c.Close()
		},
	}
	var wg sync.WaitGroup
	for round := range 8 {
		for i, end := range ends {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+(round+i)%3))}}
				c, err := d.Dial("tcp4", h.addr) // more than the caps at once: some wait
				if err != nil {
					t.Error(err)
					return
				}
				end(c)
			}()
		}
	}
	wg.Wait()
	eventually(t, "every slot given back", func() bool { return h.srv.slots.InUse() == 0 })
	eventually(t, "every store connection closed", func() bool { return h.store.NumOpen() == 0 })
	if v := h.metric("storeguard_store_connections"); v != "0" {
		t.Errorf("store_connections = %q at the end", v)
	}
	// The store ends connections itself too: each client's slot comes back.
	var open []net.Conn
	for i := range 6 {
		c := h.dialFrom(fmt.Sprintf("127.0.0.%d", 1+i%2))
		c.Write(numkeys)
		open = append(open, c)
	}
	eventually(t, "six clients at the store", func() bool { return h.srv.slots.InUse() == 6 && h.store.NumOpen() == 6 })
	h.store.Close()
	eventually(t, "the slots of connections the store closed given back", func() bool { return h.srv.slots.InUse() == 0 })
}

// namedClients gives a test clients that each send one SET of their own name, from an address of
// its choosing (client), and tells whether a client's message reached the store (atStore).
func namedClients(t *testing.T, h *harness) (client func(name, ip string) net.Conn, atStore func(name string) bool) {
	msg := func(name string) []byte { // each client's own first message
		return enc(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("/" + name), Value: []byte("v")})
	}
	client = func(name, ip string) net.Conn {
		c := h.dialFrom(ip)
		c.Write(msg(name))
		return c
	}
	atStore = func(name string) bool {
		for i := range h.store.NumConns() {
			if bytes.Equal(h.store.Received(i), msg(name)) {
				return true
			}
		}
		return false
	}
	return client, atStore
}

// caps.store-dial-rate auto (the default) paces store dials by the store's answers: a store that
// answers gets every client of a large job's start; one that stops answering gets few dials at a
// time (the window halves, the rate is capped) while the others wait in the queue, never as a
// violation, and every one of them is served once it answers again.
func TestStorePacing(t *testing.T) { run(t, testStorePacing) }

func testStorePacing(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Generation = "1.13"
		c.Caps.StoreDialSlow = 100 * time.Millisecond
	})
	h.store.SetReply(make([]byte, 8))
	numKeys := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	pacing := func(v string) float64 {
		var f float64
		fmt.Sscan(h.metric(`storeguard_store_pacing{value="`+v+`"}`), &f)
		return f
	}
	for _, c := range clientsOf(t, h, numKeys, 0, 600) {
		readReply(t, c, 8)
	}

	h.store.Pause() // the store stalls: it reads each connection's first message and answers none
	stalled := clientsOf(t, h, numKeys, 600, 200)
	eventually(t, "the window halved and the dials capped for the stalled store", func() bool {
		return pacing("window") < 200 && pacing("rate") > 0
	})
	stalled = append(stalled, clientsOf(t, h, numKeys, 800, 50)...)
	eventually(t, "clients waiting for the stalled store", func() bool {
		return h.metric("storeguard_store_connections_waiting") != "0"
	})
	h.store.Resume()
	for _, c := range stalled {
		readReply(t, c, 8)
	}
	var refused, violations float64
	fmt.Sscan(h.metric(`storeguard_store_connections_refused_total{reason="store_pacing"}`), &refused)
	fmt.Sscan(h.metric(`storeguard_violations_total{mode="enforce",rule="message_timeout"}`), &violations)
	if refused != 0 || violations != 0 {
		t.Errorf("%v clients refused for pacing, %v message timeouts", refused, violations)
	}
}

// clientsOf connects n clients, 8 a loopback source from 127.10.0.1 on (client from on), each
// sending msg.
func clientsOf(t *testing.T, h *harness, msg []byte, from, n int) []net.Conn {
	t.Helper()
	cs := make([]net.Conn, n)
	for i := range cs {
		host := (from+i)/8 + 1
		cs[i] = h.dialFrom(fmt.Sprintf("127.10.%d.%d", host/256, host%256))
		cs[i].Write(msg)
	}
	return cs
}
