package proxy

import (
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
)

// Bans never cut off a job: a scan from the address a job's ranks use (this host, or a NAT
// gateway) is refused connection by connection, but a new rank from there is still admitted.
func TestBansSpareTheJob(t *testing.T) { run(t, testBansSpareTheJob) }

func testBansSpareTheJob(t *testing.T, m mode) {
	scan := func(h *harness, n int) {
		for range n {
			c := h.dial()
			c.Write([]byte{0xff})
			closedByPeer(t, c)
		}
	}
	rankServed := func(h *harness) {
		t.Helper()
		c := h.dial()
		c.Write(enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys}))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
			t.Fatalf("a new rank was not served: %v", err)
		}
		c.Close()
	}
	ban := func(exempt []netip.Prefix) func(*config.Config) {
		return func(c *config.Config) {
			c.Generation = "1.13"
			c.Ban.Violations, c.Ban.Window, c.Ban.Duration = 2, time.Minute, time.Minute
			c.Ban.Exempt = exempt
		}
	}

	t.Run("loopback is exempt by default", func(t *testing.T) {
		h := start(t, m, ban(config.Default().Ban.Exempt))
		h.store.SetReply([]byte("ok"))
		scan(h, 5)
		rankServed(h)
		if v := h.metric(`storeguard_bans_total`); v != "0" {
			t.Errorf("bans %q", v)
		}
	})

	t.Run("a source serving a job is not banned", func(t *testing.T) {
		h := start(t, m, ban(nil))
		h.store.SetReply([]byte("ok"))
		job := h.dial() // a rank, working
		job.Write(enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys}))
		job.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(job, make([]byte, 2)); err != nil {
			t.Fatal(err)
		}
		scan(h, 5)
		rankServed(h)
		if v := h.metric(`storeguard_bans_total`); v != "0" {
			t.Errorf("bans %q with a job running from the source", v)
		}
		job.Close()
		eventually(t, "the job's connection gone", func() bool { return h.metric("storeguard_connections_active") == "0" })
		scan(h, 2) // the job is gone: the scan is banned as before
		if v := h.metric(`storeguard_bans_total`); v != "1" {
			t.Errorf("bans %q after the job ended", v)
		}
	})
}
