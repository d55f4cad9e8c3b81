//go:build linux

package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/upgrade"
)

// waiters is a server with a connection of each kind that waits: for buffer budget (its source's
// share is held by a partial SET of its own), and for a store slot (its source's one slot is
// held). Measured before: neither could park, and every upgrade failed after the freeze timeout.
type waiters struct {
	h                        *harness
	holder, budget           net.Conn // 127.0.0.2: a partial SET holding the share, one waiting for budget
	slotHolder, slotWaiter   net.Conn // 127.0.0.3: connected to the store, and a SET waiting for a slot
	held, waiting, get, slot []byte
}

func startWaiters(t *testing.T, m mode) *waiters {
	h := start(t, m, func(c *config.Config) {
		c.Caps.BufferBudgetBytes, c.Caps.PerSourceBudgetBytes = 1<<20, 64<<10
		// a maximal message within the budget (config.Parse)
		c.Limits.MaxKeyBytes, c.Limits.MaxValueBytes, c.Limits.MaxMessageBytes = 1024, 512<<10, 1<<20
		c.Caps.PerSourceStoreConnections = 1
		c.Timeouts.Message = time.Minute
	})
	h.srv.cont.freezeTimeout = 2 * time.Second // a connection that cannot park fails the hand-over soon
	set := func(key string, n int) []byte {
		b := protocol.AppendBytes([]byte{0x00}, []byte(key))
		return append(binary.LittleEndian.AppendUint64(b, uint64(n)), bytes.Repeat([]byte{'v'}, n)...)
	}
	w := &waiters{h: h, held: set("/held", 60<<10), waiting: set("/waiting", 60<<10), slot: set("/slot", 10),
		get: enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})}
	w.holder, w.budget = h.dialFrom("127.0.0.2"), h.dialFrom("127.0.0.2")
	w.holder.Write(w.held[:100])
	eventually(t, "the share held", func() bool { return h.srv.buf.inUse() >= 60<<10 })
	w.budget.Write(w.waiting[:100])
	w.slotHolder = h.dialFrom("127.0.0.3")
	w.slotHolder.Write(w.get)
	eventually(t, "a store connection", func() bool { return w.atStore(w.get) })
	w.slotWaiter = h.dialFrom("127.0.0.3")
	w.slotWaiter.Write(w.slot)
	time.Sleep(200 * time.Millisecond) // both wait by now
	if w.atStore(w.slot) || h.store.NumConns() != 1 {
		t.Fatal("the slot waiter reached the store past caps.per-source-store-connections")
	}
	return w
}

func (w *waiters) atStore(msg []byte) bool {
	for i := range w.h.store.NumConns() {
		if bytes.Equal(w.h.store.Received(i), msg) {
			return true
		}
	}
	return false
}

// release lets both waits end, one by one: the holder's SET completes and it leaves (its share
// and its source's store slot go back), then the budget waiter's, then the slot holder leaves.
// Each message reaches the store once, whole.
func (w *waiters) release(t *testing.T) {
	t.Helper()
	w.holder.Write(w.held[100:])
	eventually(t, "the held SET at the store", func() bool { return w.atStore(w.held) })
	w.holder.Close()
	w.budget.Write(w.waiting[100:])
	eventually(t, "the SET that waited for budget at the store", func() bool { return w.atStore(w.waiting) })
	w.slotHolder.Close()
	eventually(t, "the SET that waited for a slot at the store", func() bool { return w.atStore(w.slot) })
	if n := w.h.store.NumConns(); n != 4 {
		t.Errorf("the store had %d connections, want 4", n)
	}
}

// TestUpgradeWhileConnectionsWaitForBudgetAndSlots: a wait for buffer budget or for a store slot
// parks, so a client cannot make an upgrade fail by holding its source's share and keeping a
// second connection waiting (issue #25: every upgrade failed, each freezing all traffic 5 s). The
// new server waits on where the old one stopped, and both messages complete through it.
func TestUpgradeWhileConnectionsWaitForBudgetAndSlots(t *testing.T) {
	run(t, testUpgradeWhileConnectionsWaitForBudgetAndSlots)
}

func testUpgradeWhileConnectionsWaitForBudgetAndSlots(t *testing.T, m mode) {
	w := startWaiters(t, m)
	next, err := w.h.takeOver(t, nil)
	if err != nil {
		t.Fatalf("the hand-over failed: %v", err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("new buffered %d; events %v flows %v", next.srv.buf.inUse(), next.audit.events(t), next.audit.flows(t))
		}
	}()
	w.release(t)
	if v := next.metric(`storeguard_handovers_total{result="ok"}`); v != "1" {
		t.Errorf("handovers_total ok = %q, want 1", v)
	}
	if v := next.metric("storeguard_handover_frozen_seconds"); v == "" || v == "0" {
		t.Errorf("handover_frozen_seconds = %q, want the freeze's length", v)
	}
}

// TestFailedUpgradeWhileConnectionsWait: after a hand-over that fails (the new server cannot
// listen), the connections that waited when the freeze began wait on in the old server, and
// complete there.
func TestFailedUpgradeWhileConnectionsWait(t *testing.T) {
	run(t, testFailedUpgradeWhileConnectionsWait)
}

func testFailedUpgradeWhileConnectionsWait(t *testing.T, m mode) {
	w := startWaiters(t, m)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	if _, err := w.h.takeOver(t, func(c *config.Config) { c.Listen = taken.Addr().String() }); err == nil {
		t.Fatal("the hand-over succeeded though the new server could not listen")
	}
	time.Sleep(100 * time.Millisecond) // the waits begin again
	if w.atStore(w.slot) {
		t.Fatal("the slot waiter reached the store past its cap after the thaw")
	}
	w.release(t)
}

// TestFreezeEndsWhenTheNewProcessExits: a freeze held up by a connection that cannot park (here
// one that waits for the store's generation, auto mode with no store: the store's state, not a
// client's) ends as soon as the new process is gone, not after the freeze timeout.
func TestFreezeEndsWhenTheNewProcessExits(t *testing.T) {
	h := startOn(t, goroutineMode, reservedAddr(t), func(c *config.Config) {
		c.Generation, c.Timeouts.UpstreamDial = "auto", time.Hour
	})
	h.srv.cont.freezeTimeout = time.Hour
	h.dial()
	eventually(t, "a connection waiting for the store", func() bool { return h.metric("storeguard_connections_active") == "1" })

	mine, theirs, err := fdpass.Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	go func() { // the new process: ready, then gone while the old one freezes
		defer theirs.Close()
		p, err := fdpass.New(theirs)
		if err != nil {
			return
		}
		defer p.Close()
		p.Send('R', upgrade.Ready{})
		for !h.srv.frozen() {
			time.Sleep(time.Millisecond)
		}
	}()
	done := make(chan error, 1)
	go func() { _, err := h.srv.HandOver(mine, nil); done <- err }()
	select {
	case err := <-done:
		upgrade.Thaw(err)
		if !errors.Is(err, errPeerGone) {
			t.Fatalf("HandOver: %v, want %v", err, errPeerGone)
		}
	case <-time.After(30 * time.Second): // far from the hour of the freeze timeout
		t.Fatal("the freeze went on after the new process was gone")
	}
	if h.srv.frozen() {
		t.Fatal("still frozen after the failed hand-over")
	}
}
