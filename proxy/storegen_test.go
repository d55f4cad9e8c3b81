package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
)

func autoGuard(t *testing.T, m mode, upstream string) *harness {
	return startOn(t, m, upstream, func(c *config.Config) { c.Generation = "auto"; c.Timeouts.UpstreamDial = 10 * time.Second })
}

func waitStore(t *testing.T, h *harness, want protocol.Generation) {
	t.Helper()
	eventually(t, "the store's generation learned", func() bool {
		info, ok := h.srv.Store()
		return ok && info.Gen == want
	})
}

func send(t *testing.T, c net.Conn, b []byte, want int) []byte {
	t.Helper()
	c.SetDeadline(time.Now().Add(patience))
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, want)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reply to %x: %v", b, err)
	}
	return got
}

// TestAutoHoldsConnectionsUntilTheStoreIsKnown: the sidecar order. A torch 2.1 client connects
// before the store listens; its G1 ops (APPEND 0x08, MULTI_GET 0x09, which G0 reads otherwise)
// wait, then are framed as G1 and answered.
func TestAutoHoldsConnectionsUntilTheStoreIsKnown(t *testing.T) {
	run(t, testAutoHoldsConnectionsUntilTheStoreIsKnown)
}

func testAutoHoldsConnectionsUntilTheStoreIsKnown(t *testing.T, m mode) {
	addr := reservedAddr(t)
	h := autoGuard(t, m, addr)
	c := h.dial()
	ops := enc(t, protocol.G1, protocol.Request{Op: protocol.OpAppend, Key: []byte("k"), Value: []byte("ab")},
		protocol.Request{Op: protocol.OpAppend, Key: []byte("j"), Value: []byte("ab")},
		protocol.Request{Op: protocol.OpMultiGet, Keys: [][]byte{[]byte("k"), []byte("j")}})
	c.Write(ops)
	time.Sleep(300 * time.Millisecond)
	if _, ok := h.srv.Store(); ok {
		t.Fatal("a generation was known with no store")
	}
	storesim.StartT(t, addr, protocol.G1, protocol.BackendLegacy)
	c.SetReadDeadline(time.Now().Add(patience))
	want := []byte("\x02\x00\x00\x00\x00\x00\x00\x00ab\x02\x00\x00\x00\x00\x00\x00\x00ab")
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("MULTI_GET reply %x, %v; want %x", got, err, want)
	}
	if v := h.metric(`storeguard_store_info{backend="legacy",generation="G1"}`); v != "1" {
		t.Errorf("store_info = %q", v)
	}
	if v := h.metric(`storeguard_store_generation_waits_total{result="learned"}`); v != "1" {
		t.Errorf("waits learned = %q", v)
	}
	h.assertNoEvents()
}

// TestAutoRefusesBytesTheStoreWouldMisread: with the store learned, a client whose bytes do not
// fit its generation is refused before one byte reaches it.
func TestAutoRefusesBytesTheStoreWouldMisread(t *testing.T) {
	run(t, testAutoRefusesBytesTheStoreWouldMisread)
}

func testAutoRefusesBytesTheStoreWouldMisread(t *testing.T, m mode) {
	validateG6Set := append(protocol.AppendHandshake(nil, protocol.G2, 0), enc(t, protocol.G6,
		protocol.Request{Op: protocol.OpSet})...)
	cases := []struct {
		name  string
		store protocol.Generation
		b     protocol.Backend
		bytes []byte
		rule  protocol.Rule
	}{
		{"VALIDATE held open to G0", protocol.G0, protocol.BackendLegacy, protocol.AppendHandshake(nil, protocol.G2, 0), protocol.RuleValidateToLegacyStore},
		{"VALIDATE+G6 SET to G1", protocol.G1, protocol.BackendLegacy, validateG6Set, protocol.RuleValidateToLegacyStore},
		{"nmap 106294 to G6 libuv", protocol.G6, protocol.BackendLibuv, unhex(t, "0300000b06e00000000000"), protocol.RuleValidateMissing},
		{"G1 APPEND head to G1 then stall", protocol.G1, protocol.BackendLegacy, unhex(t, "08 0100000000000000 6b"), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := storesim.StartT(t, "127.0.0.1:0", tc.store, tc.b)
			h := autoGuard(t, m, s.Addr())
			waitStore(t, h, tc.store)
			before := s.NumConns()
			c := h.dial()
			c.Write(tc.bytes)
			if tc.rule == "" {
				time.Sleep(200 * time.Millisecond)
			} else {
				closedByPeer(t, c)
			}
			for i := before; i < s.NumConns(); i++ {
				if got := s.Received(i); len(got) != 0 {
					t.Fatalf("the store received %x", got)
				}
			}
			// The store still answers.
			b := h.dial()
			hs := protocol.AppendHandshake(nil, tc.store, 1)
			numKeys, _ := protocol.Append(nil, tc.store, protocol.Request{Op: protocol.OpGetNumKeys})
			pong := 0
			if tc.store >= protocol.G3 {
				pong = 4
			}
			send(t, b, append(hs, numKeys...), pong+8)
			if tc.rule == "" {
				return
			}
			evs := h.audit.events(t)
			if len(evs) != 1 || evs[0]["event.reason"] != string(tc.rule) || evs[0]["storeguard.generation"] != tc.store.String() {
				t.Fatalf("audit %v; want one %s event for %s", evs, tc.rule, tc.store)
			}
		})
	}
}

// TestAutoLearnsAgainAfterTheStoreRestarts: rank 0 comes back on another torch at the same
// address; the guard forgets what it knew the moment the store goes away and frames the new
// store's clients by its generation.
func TestAutoLearnsAgainAfterTheStoreRestarts(t *testing.T) {
	run(t, testAutoLearnsAgainAfterTheStoreRestarts)
}

func testAutoLearnsAgainAfterTheStoreRestarts(t *testing.T, m mode) {
	addr := reservedAddr(t)
	s := storesim.StartT(t, addr, protocol.G1, protocol.BackendLegacy)
	h := autoGuard(t, m, addr)
	waitStore(t, h, protocol.G1)
	s.Close()
	eventually(t, "the store forgotten", func() bool { _, ok := h.srv.Store(); return !ok })
	storesim.StartT(t, addr, protocol.G6, protocol.BackendLibuv)
	waitStore(t, h, protocol.G6)
	c := h.dial()
	hs := protocol.AppendHandshake(nil, protocol.G6, 7)
	add, _ := protocol.Append(nil, protocol.G6, protocol.Request{Op: protocol.OpAdd, Key: []byte("n"), Int: 3})
	if got := send(t, c, append(hs, add...), 4+8); got[4] != 3 {
		t.Fatalf("ADD through the guard after the restart: %x", got)
	}
	h.assertNoEvents()
}

// setHeader is a SET of key whose value is declared n bytes long, as generation g frames it, up to
// the value's bytes.
func setHeader(t *testing.T, g protocol.Generation, key string, n uint64) []byte {
	t.Helper()
	op, ok := protocol.WireOf(g, protocol.OpSet)
	if !ok {
		t.Fatalf("%s has no SET", g)
	}
	return binary.LittleEndian.AppendUint64(protocol.AppendBytes([]byte{op}, []byte(key)), n)
}

// TestAutoValueLimitFollowsTheBackend: with limits.max-value-bytes auto (the default), the value
// limit is the learned store's: a legacy store (any generation) takes a value over libuv's 8 MiB,
// up to 64 MiB; a libuv store gets none over 8 MiB, which it would close the connection for.
func TestAutoValueLimitFollowsTheBackend(t *testing.T) { run(t, testAutoValueLimitFollowsTheBackend) }

func testAutoValueLimitFollowsTheBackend(t *testing.T, m mode) {
	const legacy, libuv = protocol.BackendLegacy, protocol.BackendLibuv
	cases := []struct {
		g        protocol.Generation
		b        protocol.Backend
		declared uint64 // the SET's value length
		limit    uint64 // value_too_long's limit; 0: the SET is forwarded
	}{
		{protocol.G0, legacy, 9 << 20, 0},
		{protocol.G6, legacy, 9 << 20, 0},
		{protocol.G6, legacy, 64<<20 + 1, 64 << 20},
		{protocol.G6, libuv, 9 << 20, 8 << 20},
		{protocol.G6, libuv, 8 << 20, 0},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s-%s-%d", tc.g, tc.b, tc.declared), func(t *testing.T) {
			s := storesim.StartT(t, "127.0.0.1:0", tc.g, tc.b)
			h := autoGuard(t, m, s.Addr())
			waitStore(t, h, tc.g)
			checkValueLimit(t, h, s, tc.g, tc.declared, tc.limit)
		})
	}
}

// checkValueLimit sends a SET of a declared-long value through h to s, a store of generation g,
// and checks that it is forwarded (limit 0: the store then counts one key more) or refused as
// value_too_long at limit, with none of it reaching the store.
func checkValueLimit(t *testing.T, h *harness, s *storesim.Store, g protocol.Generation, declared, limit uint64) {
	t.Helper()
	c := h.dial()
	hs := protocol.AppendHandshake(nil, g, 7)
	pong := 0
	if g >= protocol.G3 {
		pong = 4
	}
	if len(hs) > 0 {
		send(t, c, hs, pong)
	}
	key := fmt.Sprintf("v%d", declared)
	head := setHeader(t, g, key, declared)
	keys := s.NumKeys()
	if limit == 0 {
		c.Write(head)
		numKeys := enc(t, g, protocol.Request{Op: protocol.OpGetNumKeys})
		got := send(t, c, append(make([]byte, declared), numKeys...), 8)
		if n := binary.LittleEndian.Uint64(got); n != uint64(keys+1) {
			t.Fatalf("the store has %d keys after the SET, want %d", n, keys+1)
		}
		h.assertNoEvents()
		return
	}
	c.Write(head)
	closedByPeer(t, c)
	for i := 0; i < s.NumConns(); i++ {
		if bytes.Contains(s.Received(i), []byte(key)) {
			t.Fatalf("the store received the refused SET: %x", s.Received(i))
		}
	}
	evs := h.audit.events(t)
	if len(evs) != 1 || evs[0]["event.reason"] != string(protocol.RuleValueTooLong) || evs[0]["storeguard.limit"] != strconv.FormatUint(limit, 10) {
		t.Fatalf("audit %v; want one value_too_long event at limit %d", evs, limit)
	}
}

// TestReloadValueLimit: a reload that sets limits.max-value-bytes applies to new connections to the
// learned store, and one back to auto restores the backend's.
func TestReloadValueLimit(t *testing.T) { run(t, testReloadValueLimit) }

func testReloadValueLimit(t *testing.T, m mode) {
	s := storesim.StartT(t, "127.0.0.1:0", protocol.G6, protocol.BackendLegacy)
	h := autoGuard(t, m, s.Addr())
	waitStore(t, h, protocol.G6)
	reload := func(value config.ByteLimit) {
		cfg := testConfig(m, s.Addr())
		cfg.Listen, cfg.MetricsListen = h.addr, h.srv.MetricsAddr().String()
		cfg.Generation, cfg.Timeouts.UpstreamDial = "auto", 10*time.Second
		cfg.Limits.MaxValueBytes = value
		if err := h.srv.Reload(parsed(t, cfg)); err != nil {
			t.Fatal(err)
		}
	}
	checkValueLimit(t, h, s, protocol.G6, 9<<20, 0)
	reload(1 << 20)
	checkValueLimit(t, h, s, protocol.G6, 1<<20, 0)
	reload(config.AutoLimit)
	checkValueLimit(t, h, s, protocol.G6, 10<<20, 0)
	reload(1 << 20)
	checkValueLimit(t, h, s, protocol.G6, 2<<20, 1<<20)
}

func (h *harness) assertNoEvents() {
	h.t.Helper()
	if evs := h.audit.events(h.t); len(evs) != 0 {
		h.t.Fatalf("audit events on benign traffic: %v", evs)
	}
}

// TestReloadToAutoLearnsTheStore: a reload from a configured generation to auto starts learning;
// connections then wait for it and are framed by the store's generation.
func TestReloadToAutoLearnsTheStore(t *testing.T) { run(t, testReloadToAutoLearnsTheStore) }

func testReloadToAutoLearnsTheStore(t *testing.T, m mode) {
	s := storesim.StartT(t, "127.0.0.1:0", protocol.G6, protocol.BackendLibuv)
	h := startOn(t, m, s.Addr(), func(c *config.Config) { c.Generation = "1.13" })
	if _, ok := h.srv.Store(); ok {
		t.Fatal("a generation learned with one configured")
	}
	cfg := testConfig(m, s.Addr())
	cfg.Listen, cfg.MetricsListen = h.addr, h.srv.MetricsAddr().String()
	cfg.Generation = "auto"
	if err := h.srv.Reload(parsed(t, cfg)); err != nil {
		t.Fatal(err)
	}
	waitStore(t, h, protocol.G6)
	c := h.dial()
	hs := protocol.AppendHandshake(nil, protocol.G6, 7)
	n, _ := protocol.Append(nil, protocol.G6, protocol.Request{Op: protocol.OpGetNumKeys})
	send(t, c, append(hs, n...), 4+8)
	h.assertNoEvents()
}

// TestDrainEndsConnectionsWaitingForTheStore: a connection held for the store's generation does
// not keep a stopping server past its drain.
func TestDrainEndsConnectionsWaitingForTheStore(t *testing.T) {
	run(t, testDrainEndsConnectionsWaitingForTheStore)
}

func testDrainEndsConnectionsWaitingForTheStore(t *testing.T, m mode) {
	h := startOn(t, m, reservedAddr(t), func(c *config.Config) {
		c.Generation = "auto"
		c.Timeouts.UpstreamDial = time.Minute
		c.Timeouts.Drain = 200 * time.Millisecond
	})
	c := h.dial()
	c.Write([]byte{0x06})
	eventually(t, "the connection held", func() bool { return h.metric("storeguard_connections_active") == "1" })
	h.cancel()
	select {
	case <-h.done:
	case <-time.After(patience): // short of the dial's minute: the drain ended the wait, not the dial
		t.Fatalf("Serve still waits for a held connection %v after its 200 ms drain", patience)
	}
	closedByPeer(t, c)
}
