package proxy

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
)

// A client that pipelines GETs of a large value and reads none of the replies: the guard forwards
// only limits.max-pending-replies of them ahead of their replies, drains the store's replies into
// at most caps.reply-buffer-bytes, and closes the client as replies_unread. A client from another
// address is served meanwhile.
func TestRepliesNobodyReads(t *testing.T) { run(t, testRepliesNobodyReads) }

func testRepliesNobodyReads(t *testing.T, m mode) {
	h, store := startSim(t, m, func(c *config.Config) {
		c.Limits.MaxPendingReplies = config.Default().Limits.MaxPendingReplies
		c.Caps.ReplyBufferBytes = 1 << 20
	})
	const size = 1 << 20
	get := enc(t, protocol.G3, protocol.Request{Op: protocol.OpGet, Key: []byte("/big")})
	c := h.dial()
	c.(*net.TCPConn).SetReadBuffer(4096)
	c.Write(append(protocol.AppendHandshake(nil, protocol.G3, 1), enc(t, protocol.G3,
		protocol.Request{Op: protocol.OpSet, Key: []byte("/big"), Value: make([]byte, size)})...))
	c.Write(bytes.Repeat(get, 50)) // 50 MiB of replies, for about 500 bytes
	eventually(t, "replies_unread", func() bool {
		return h.metric(`storeguard_violations_total{mode="enforce",rule="replies_unread"}`) == "1"
	})
	// What reached the store: the handshake, the SET, and the GETs the guard let ahead of their
	// replies while the buffer filled (each reply is as large as the buffer), far from 50.
	got := bytes.Count(store.Received(0), get)
	if got > 6 {
		t.Fatalf("%d GETs reached the store for a client that read no reply", got)
	}
	if h.metric("storeguard_reply_stalls_total") == "0" {
		t.Fatal("the client's requests never waited for a reply")
	}
	other := h.dial()
	other.Write(append(protocol.AppendHandshake(nil, protocol.G3, 2), get...))
	other.SetReadDeadline(time.Now().Add(patience))
	buf := make([]byte, 4+8+size)
	if _, err := readFull(other, buf); err != nil {
		t.Fatalf("another client's GET: %v", err)
	}
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
