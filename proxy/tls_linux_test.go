package proxy

import (
	"bytes"
	"testing"
	"time"

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
		case <-time.After(5 * time.Second):
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
