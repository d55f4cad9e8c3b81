package proxy

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
)

// Bans never cut off a job, and a job cannot switch them off: a scan from the address a job's
// ranks use (this host, or a NAT gateway) bans it all the same, but the job's live connection is
// still served and the source may still open ban.serving-rate new connections a second (a rank
// restarting); once no job is served from there, it is refused outright. Loopback is exempt by
// default. Before, a source with a working connection was never banned: an attacker holding one
// valid connection probed without limit.
func TestBansThrottleAServingSource(t *testing.T) { run(t, testBansThrottleAServingSource) }

func testBansThrottleAServingSource(t *testing.T, m mode) {
	scan := func(h *harness, n int) {
		for range n {
			c := h.dial()
			c.Write([]byte{0xff})
			closedByPeer(t, c)
		}
	}
	served := func(c net.Conn) error {
		c.Write(enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys}))
		c.SetReadDeadline(time.Now().Add(patience))
		_, err := io.ReadFull(c, make([]byte, 2))
		return err
	}
	ban := func(exempt []netip.Prefix, rate float64) func(*config.Config) {
		return func(c *config.Config) {
			c.Generation = "1.13"
			c.Ban.Violations, c.Ban.Window, c.Ban.Duration = 2, time.Minute, time.Minute
			c.Ban.Exempt = exempt
			c.Ban.ServingRate, c.Ban.ServingBurst = rate, 1
		}
	}
	working := func(h *harness) net.Conn {
		t.Helper()
		job := h.dial() // a rank, working
		if err := served(job); err != nil {
			t.Fatal(err)
		}
		return job
	}

	t.Run("loopback is exempt by default", func(t *testing.T) {
		h := start(t, m, ban(config.Default().Ban.Exempt, 1))
		h.store.SetReply([]byte("ok"))
		scan(h, 5)
		if err := served(h.dial()); err != nil {
			t.Fatalf("a new rank was not served: %v", err)
		}
		if v := h.metric(`storeguard_bans_total`); v != "0" {
			t.Errorf("bans %q", v)
		}
	})

	t.Run("a source serving a job is banned and throttled", func(t *testing.T) {
		h := start(t, m, ban(nil, 0.01)) // a token every 100 s: none within the test
		h.store.SetReply([]byte("ok"))
		job := working(h)
		scan(h, 2)
		if v := h.metric(`storeguard_bans_total`); v != "1" {
			t.Fatalf("bans %q with a job running from the source, want 1", v)
		}
		scan(h, 5) // refused at accept now
		if v := h.metric(`storeguard_connections_refused_total{reason="ban_throttled"}`); v != "5" {
			t.Errorf("throttled %q, want 5", v)
		}
		if v := h.metric(`storeguard_violations_total{mode="enforce",rule="unknown_opcode"}`); v != "2" {
			t.Errorf("violations %q, want 2: the refused connections' bytes never reach a decoder", v)
		}
		if err := served(job); err != nil {
			t.Fatalf("the job's live connection was not served after the ban: %v", err)
		}
		job.Close()
		eventually(t, "the job's connection gone", func() bool { return h.metric("storeguard_connections_active") == "0" })
		scan(h, 1)
		if v := h.metric(`storeguard_connections_refused_total{reason="banned"}`); v != "1" {
			t.Errorf("banned %q once the job ended, want 1", v)
		}
	})

	t.Run("a banned source serving a job gets a new rank in", func(t *testing.T) {
		h := start(t, m, ban(nil, 100))
		h.store.SetReply([]byte("ok"))
		working(h)
		scan(h, 2)
		if v := h.metric(`storeguard_bans_total`); v != "1" {
			t.Fatalf("bans %q, want 1", v)
		}
		eventually(t, "a new rank served", func() bool {
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				return false
			}
			defer c.Close()
			return served(c) == nil
		})
	})
}
