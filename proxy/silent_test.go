package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
)

// At caps.max-connections a new connection takes the place of the newest silent connection of a
// source that holds more silent connections than working ones plus caps.per-source-silent: a flood
// of idle connections from other sources cannot refuse a new rank, while a job's host (one working
// connection, its torch <= 2.0 callback, a rank not started yet) keeps every connection. Two ranks
// arriving at once both get in (each is admitted in place of its own victim: with the victim's
// slot freed first, the other took it and one rank was refused). Once no source is over, the cap
// refuses as before. Before, the first new rank was refused (max_connections).
func TestSilentFloodMakesRoomForANewRank(t *testing.T) { run(t, testSilentFloodMakesRoomForANewRank) }

func testSilentFloodMakesRoomForANewRank(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Caps.MaxConnections, c.Caps.PerSourceSilent = config.AutoCount{N: 6}, 1
		c.Caps.PerPrefixConnections = config.AutoCount{} // its sources share one /24
	})
	h.store.SetReply([]byte("ok"))
	served := func(c net.Conn) error {
		c.Write(enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys}))
		c.SetReadDeadline(time.Now().Add(patience))
		_, err := io.ReadFull(c, make([]byte, 2))
		return err
	}
	open := func(c net.Conn) bool { // still open: nothing to read, no end of stream
		c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		return errors.Is(err, os.ErrDeadlineExceeded)
	}
	active := func(n string) {
		eventually(t, n+" connections open", func() bool { return h.metric("storeguard_connections_active") == n })
	}

	job := []net.Conn{h.dialFrom("127.0.0.2"), h.dialFrom("127.0.0.2"), h.dialFrom("127.0.0.2")}
	if err := served(job[0]); err != nil { // working; then its callback and a rank yet to speak
		t.Fatal(err)
	}
	var flood []net.Conn
	for range 3 {
		flood = append(flood, h.dialFrom("127.0.0.3"))
		active(strconv.Itoa(3 + len(flood)))
	}

	ranks := make(chan error, 2)
	for _, src := range []string{"127.0.0.4", "127.0.0.5"} {
		rank := h.dialFrom(src)
		go func() { ranks <- served(rank) }()
	}
	for range 2 {
		if err := <-ranks; err != nil {
			t.Fatalf("a new rank: %v", err)
		}
	}
	closedByPeer(t, flood[1]) // the newest of the flood's
	closedByPeer(t, flood[2])
	if !open(flood[0]) {
		t.Error("the flood's oldest connection was closed: its source is within caps.per-source-silent now")
	}
	for i, c := range job {
		if !open(c) {
			t.Errorf("the job's connection %d was closed", i)
		}
	}
	if err := served(job[0]); err != nil {
		t.Fatalf("the job's working connection: %v", err)
	}
	late := h.dialFrom("127.0.0.6") // no source is over: the cap refuses
	closedByPeer(t, late)
	if v := h.metric("storeguard_silent_evictions_total"); v != "2" {
		t.Errorf("evictions %q, want 2", v)
	}
	if v := h.metric(`storeguard_connections_refused_total{reason="max_connections"}`); v != "1" {
		t.Errorf("refused %q, want 1", v)
	}
	flood[1].Close()
	eventually(t, "two flow records of evicted connections", func() bool {
		n := 0
		for _, f := range h.audit.flows(t) {
			if f["event.reason"] == reasonSilentEvicted && f["storeguard.verdict"] == "refused" {
				n++
			}
		}
		return n == 2
	})
}
