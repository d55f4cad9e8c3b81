package proxy

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/storeguard/storeguard/internal/testpki"
	"github.com/storeguard/storeguard/protocol"
)

// TestUpgradeKeepsMutualTLSConnections: a mutual-TLS connection, one message whole and one half
// sent before an upgrade, goes on through the new server: its TLS session continues (the
// client's crypto/tls sees nothing), and every byte reaches the store once.
func TestUpgradeKeepsMutualTLSConnections(t *testing.T) { run(t, testUpgradeKeepsMutualTLSConnections) }

func testUpgradeKeepsMutualTLSConnections(t *testing.T, m mode) {
	ca := testpki.NewCA(t, "sg.test CA")
	h := startTLS(t, m, ca)
	h.store.Answer(protocol.GenSetting{Gen: protocol.G0})
	c, err := h.dialTLS(ca, leaf(t, ca, workerID, time.Now().Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	add := enc(t, protocol.G0, protocol.Request{Op: protocol.OpAdd, Key: []byte("/ctr"), Int: 1})
	set := enc(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: bytes.Repeat([]byte("v"), 50000)})
	c.Write(add)
	readReply(t, c, 8)
	c.Write(set[:30000]) // half a SET: held by the guard, or in the relay, or in the socket pair
	time.Sleep(50 * time.Millisecond)
	var next *harness
	for i := 0; i < 2; i++ { // two upgrades in a row
		if next, err = h.takeOver(t, nil); err != nil {
			t.Fatal(err)
		}
		h = next
		select {
		case <-h.srv.serving:
		case <-time.After(patience):
			t.Fatal("the new server does not serve")
		}
	}
	c.Write(set[30000:])
	c.Write(add)
	readReply(t, c, 8)
	want := append(append(append([]byte{}, add...), set...), add...)
	eventually(t, "every byte at the store once", func() bool { return bytes.Equal(h.store.Received(0), want) })
	if n := h.store.NumConns(); n != 1 {
		t.Fatalf("%d store connections, want 1", n)
	}
	// The new server goes on accepting mutual TLS.
	c2, err := h.dialTLS(ca, leaf(t, ca, workerID, time.Now().Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	c2.Write(add)
	readReply(t, c2, 8)
}

// tlsPaths counts h's live mutual-TLS connections by how they carry their plaintext: read and
// written by the connection itself (a tlsrelay.End), or through a relay's loopback pair.
func (h *harness) tlsPaths() (ends, relays int) {
	h.srv.reg.mu.Lock()
	defer h.srv.reg.mu.Unlock()
	for c := range h.srv.reg.conns {
		switch {
		case c.cl.tls == nil:
		case c.cl.tls.end != nil:
			ends++
		case c.cl.tls.relay != nil:
			relays++
		}
	}
	return ends, relays
}

// relayPairHolds is how many bytes wait for h's relays in their pairs.
func (h *harness) relayPairHolds() (n int) {
	h.srv.reg.mu.Lock()
	defer h.srv.reg.mu.Unlock()
	for c := range h.srv.reg.conns {
		if c.cl.tls == nil || c.cl.tls.relay == nil {
			continue
		}
		if _, plain, err := c.cl.tls.relay.Fds(); err == nil {
			q, _ := unix.IoctlGetInt(plain, unix.SIOCINQ)
			n += q
		}
	}
	return n
}

// TestUpgradeCarriesMutualTLSReplies: a mutual-TLS client that does not read has 16 MiB of
// replies waiting, partly in the guard, partly in a record its End had written part of when the
// freeze stopped it. An upgrade hands the End over as a relay and its pair; the new process,
// told to keep relays as a build before EndFrom did, relays it, and its pair fills with replies.
// The next upgrade makes it an End again, taking what its pair held ahead of the replies handed
// over, and so does a third. The client then reads every byte, once and in order, and its TLS
// session goes on.
func TestUpgradeCarriesMutualTLSReplies(t *testing.T) {
	ca := testpki.NewCA(t, "sg.test CA")
	h := startTLS(t, goroutineMode, ca)
	h.store.Answer(protocol.GenSetting{Gen: protocol.G0})
	big := make([]byte, 16<<20) // more than the sockets hold: most of it waits in the guard
	for i := range big {
		big[i] = byte(i * 7 / 13)
	}
	h.store.SetReply(big)
	c, err := h.dialTLS(ca, leaf(t, ca, workerID, time.Now().Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	c.Write(enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys}))
	eventually(t, "replies queued in the guard", func() bool { return h.repliesQueued() > 1<<20 })
	if ends, relays := h.tlsPaths(); ends != 1 || relays != 0 {
		t.Fatalf("before the upgrade: %d Ends and %d relays, want the one connection an End", ends, relays)
	}
	upgradeTo := func(h *harness, wantEnd bool) *harness {
		t.Helper()
		next, err := h.takeOver(t, nil)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, fmt.Sprintf("the connection an End (%t) in the new server", wantEnd), func() bool {
			ends, relays := next.tlsPaths()
			return wantEnd && ends == 1 && relays == 0 || !wantEnd && ends == 0 && relays == 1
		})
		return next
	}
	relaysStay.Store(true)
	t.Cleanup(func() { relaysStay.Store(false) })
	next := upgradeTo(h, false)
	eventually(t, "replies waiting in the relay's pair", func() bool { return next.relayPairHolds() > 0 })
	relaysStay.Store(false)
	next = upgradeTo(next, true)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(io.LimitReader(c, int64(len(big))))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("client read %d of %d reply bytes (%v)", len(got), len(big), err)
	}
	add := enc(t, protocol.G0, protocol.Request{Op: protocol.OpAdd, Key: []byte("/ctr"), Int: 1})
	next.store.SetReply(nil)
	c.Write(add)
	readReply(t, c, 8)
	next = upgradeTo(next, true)
	c.Write(add)
	readReply(t, c, 8)
}

// TestMutualTLSEndInALoop: an event loop takes a mutual-TLS connection (its End detached from Go's
// poller) and opens and seals its records itself; 8 MiB of replies the client reads slowly hand
// it back to goroutines part way through a record, which finish that record; the connection
// goes on, and every byte reaches each side once and in order.
func TestMutualTLSEndInALoop(t *testing.T) {
	ca := testpki.NewCA(t, "sg.test CA")
	h := startTLS(t, loopMode, ca)
	h.store.Answer(protocol.GenSetting{Gen: protocol.G0})
	c, err := h.dialTLS(ca, leaf(t, ca, workerID, time.Now().Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	add := enc(t, protocol.G0, protocol.Request{Op: protocol.OpAdd, Key: []byte("/ctr"), Int: 1})
	inLoop := func() bool {
		h.srv.reg.mu.Lock()
		defer h.srv.reg.mu.Unlock()
		for cc := range h.srv.reg.conns {
			cc.mu.Lock()
			own := cc.own
			cc.mu.Unlock()
			if cc.cl.tls != nil && cc.cl.tls.end != nil && own == ownLoop {
				return true
			}
		}
		return false
	}
	var sent []byte
	deadline := time.Now().Add(patience)
	for !inLoop() {
		if time.Now().After(deadline) {
			t.Fatal("no event loop took the mutual-TLS connection")
		}
		c.Write(add)
		sent = append(sent, add...)
		readReply(t, c, 8)
	}
	for range 50 { // forwarded by the loop
		c.Write(add)
		sent = append(sent, add...)
		readReply(t, c, 8)
	}
	big := make([]byte, 8<<20)
	for i := range big {
		big[i] = byte(i * 7 / 13)
	}
	h.store.SetReply(big)
	get := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	c.Write(get)
	sent = append(sent, get...)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got := make([]byte, 0, len(big))
	buf := make([]byte, 1000)
	for len(got) < len(big) { // slowly at first: the socket fills, and the loop hands it back
		n, err := c.Read(buf[:min(len(buf), len(big)-len(got))])
		if err != nil {
			t.Fatalf("client read %d of %d reply bytes: %v", len(got), len(big), err)
		}
		got = append(got, buf[:n]...)
		if len(got) < 1<<20 {
			time.Sleep(50 * time.Microsecond)
		} else {
			buf = make([]byte, 1<<16)
		}
	}
	if !bytes.Equal(got, big) {
		t.Fatal("the replies came back different")
	}
	h.store.SetReply(nil)
	for range 20 {
		c.Write(add)
		sent = append(sent, add...)
		readReply(t, c, 8)
	}
	eventually(t, "every request at the store once", func() bool { return bytes.Equal(h.store.Received(0), sent) })
	if v := h.handbacks("backpressure"); v == "" || v == "0" {
		t.Fatalf("the loop never handed the connection back for backpressure (%q): the test did not test it", v)
	}
}

// TestMutualTLSRecordsReadAhead: records a client sent back to back, which an End in an event loop
// reads in one read, are all answered: the loop opens every whole record it has read, since epoll
// does not say again that they are there. (For the same reason a loop takes no End that has
// records read and not opened: adoptable.)
func TestMutualTLSRecordsReadAhead(t *testing.T) {
	ca := testpki.NewCA(t, "sg.test CA")
	h := startTLS(t, loopMode, ca)
	h.store.Answer(protocol.GenSetting{Gen: protocol.G0})
	add := enc(t, protocol.G0, protocol.Request{Op: protocol.OpAdd, Key: []byte("/ctr"), Int: 1})
	for i := range 20 {
		c, err := h.dialTLS(ca, leaf(t, ca, workerID, time.Now().Add(-time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 { // three records, written at once
			c.Write(add)
		}
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 3*8)); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		c.Close()
	}
}
