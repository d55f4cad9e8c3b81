package proxy

import (
	"bytes"
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
