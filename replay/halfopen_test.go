package replay

import (
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/replay/internal/gencap"
)

// halfOpenEnd is how a handshake that never completes ends.
type halfOpenEnd int

const (
	clientRST  halfOpenEnd = iota // SYN, SYN-ACK, the client's RST: nmap's SYN scan
	serverRST                     // SYN, the store's RST: a closed port
	synAckOnly                    // SYN, SYN-ACK, then nothing
	synOnly                       // SYN, then nothing
)

// halfOpen writes a connection attempt from cl at at whose handshake never completes, ending as
// end has it 10 µs after the SYN.
func halfOpen(t testing.TB, w *gencap.Writer, cl netip.AddrPort, at time.Time, end halfOpenEnd) {
	t.Helper()
	const cisn, sisn = 1000, 5000
	must(t, w.WriteSegment(at, cl, server, gencap.Segment{Seq: cisn, Flags: gencap.SYN}))
	switch end {
	case serverRST:
		must(t, w.WriteSegment(at.Add(5*time.Microsecond), server, cl, gencap.Segment{Ack: cisn + 1, Flags: gencap.RST | gencap.ACK}))
	case clientRST, synAckOnly:
		must(t, w.WriteSegment(at.Add(5*time.Microsecond), server, cl, gencap.Segment{Seq: sisn, Ack: cisn + 1,
			Flags: gencap.SYN | gencap.ACK}))
	}
	if end == clientRST {
		must(t, w.WriteSegment(at.Add(10*time.Microsecond), cl, server, gencap.Segment{Seq: cisn + 1, Flags: gencap.RST}))
	}
}

// TestHalfOpen: a connection attempt whose handshake never completes (nmap's SYN scan, a closed
// port, a SYN unanswered or not followed up) never reaches serve's accept; replay writes one
// half_open flow record for it, nothing decoded, no admission asked. Before, replay admitted it
// at its SYN and reported an empty flow (pass) that serve never writes.
func TestHalfOpen(t *testing.T) {
	for _, tc := range []struct {
		name     string
		end      halfOpenEnd
		closedBy string
		at       time.Duration // of the flow's end, after the SYN
	}{
		{"syn_scan", clientRST, audit.ClosedByClient, 10 * time.Microsecond},
		{"closed_port", serverRST, audit.ClosedByStore, 5 * time.Microsecond},
		{"syn_ack_then_capture_end", synAckOnly, "", 0},
		{"syn_then_capture_end", synOnly, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			results, events := flowRun(t, nil, func(t testing.TB, w *gencap.Writer) {
				halfOpen(t, w, client(0), ms(0), tc.end)
			})
			if len(results) != 1 || results[0].Verdict != VerdictHalfOpen || results[0].FlowVerdict != audit.VerdictHalfOpen ||
				results[0].Bytes != 0 || len(results[0].Messages) != 0 {
				t.Fatalf("results %+v, want one half_open", results)
			}
			f := onlyFlow(t, events)
			checkFlow(t, f, flowWant{verdict: audit.VerdictHalfOpen, closedBy: tc.closedBy, start: ms(0),
				end: ms(0).Add(tc.at)})
			if f.Outcome != "failure" || f.Severity != audit.SeverityLow || f.RuleName != "" {
				t.Errorf("event.outcome %q severity %d rule %q, want failure, %d, none", f.Outcome, f.Severity, f.RuleName,
					audit.SeverityLow)
			}
			if len(events) != 1 {
				t.Errorf("%d events, want the flow record alone: %+v", len(events), events)
			}
		})
	}
}

// TestHalfOpenFromBannedSource: a banned source's SYN scan gets no denied event nor refused flow,
// as serve never accepts it: a half_open flow each; its completed connection is still refused.
// Before, each scanned port got a denied event and a refused flow at its SYN.
func TestHalfOpenFromBannedSource(t *testing.T) {
	results, events := flowRun(t, g0, func(t testing.TB, w *gencap.Writer) {
		for i := range 5 {
			session(t, w, from(scanner, i), server, sec(i), probe106294)
		}
		for i := range 3 {
			halfOpen(t, w, from(scanner, 5+i), sec(5+i), clientRST)
		}
		session(t, w, from(scanner, 8), server, sec(8), probe106294)
	})
	var got []Verdict
	for _, r := range results {
		got = append(got, r.Verdict)
	}
	want := []Verdict{VerdictReject, VerdictReject, VerdictReject, VerdictReject, VerdictReject, VerdictHalfOpen,
		VerdictHalfOpen, VerdictHalfOpen, VerdictRefused}
	if !slices.Equal(got, want) {
		t.Fatalf("verdicts %v, want %v", got, want)
	}
	denied := ofAction(events, audit.ActionDenied)
	if len(denied) != 1 || denied[0].SourcePort != from(scanner, 8).Port() {
		t.Errorf("denied events %+v, want one, of the completed connection", denied)
	}
	var flows []audit.Verdict
	for _, f := range ofAction(events, audit.ActionFlow) {
		flows = append(flows, f.Verdict)
	}
	if wantFlows := []audit.Verdict{"blocked", "blocked", "blocked", "blocked", "blocked", "half_open", "half_open",
		"half_open", "refused"}; !slices.Equal(flows, wantFlows) {
		t.Errorf("flow verdicts %q, want %q", flows, wantFlows)
	}
}

// TestHalfOpenTakesNoSlot: with caps.per-source-connections 1, attempts whose handshakes never
// complete (one still waiting when the real connection comes) hold no connection slot: serve's
// accept never saw them. Before, the first SYN took the slot and the real connection was refused.
func TestHalfOpenTakesNoSlot(t *testing.T) {
	src := client(0).Addr()
	results, events := flowRun(t, func(c *config.Config) { c.Caps.PerSourceConnections = 1 }, func(t testing.TB, w *gencap.Writer) {
		halfOpen(t, w, netip.AddrPortFrom(src, 50000), ms(0), synOnly) // waits to the capture's end
		halfOpen(t, w, netip.AddrPortFrom(src, 50001), ms(1), clientRST)
		halfOpen(t, w, netip.AddrPortFrom(src, 50002), ms(2), serverRST)
		session(t, w, netip.AddrPortFrom(src, 50003), server, ms(10), traffic(t, protocol.G3))
	})
	for _, r := range results {
		want := VerdictHalfOpen
		if r.Src.Port() == 50003 {
			want = VerdictPass
		}
		if r.Verdict != want {
			t.Errorf("%v: %s (%s), want %s", r.Src, r.Verdict, r.Reason, want)
		}
	}
	if len(results) != 4 {
		t.Errorf("%d results, want 4", len(results))
	}
	if d := ofAction(events, audit.ActionDenied); len(d) != 0 {
		t.Errorf("denied events %+v, want none", d)
	}
}

// TestAdmitAtAccept: admission is asked when the handshake completes (the client's ACK), as
// serve's accept returns then, not at the SYN: a ban that ends between the two lets the connection
// in, and a connection that closes between them frees its slot in time. The SYN still starts the
// stream (event.start).
func TestAdmitAtAccept(t *testing.T) {
	// slowHandshake writes a handshake whose last ACK comes 5 ms after the SYN, then payload and a
	// close; between, in the capture's order, the SYN-ACK and the ACK.
	slowHandshake := func(t testing.TB, w *gencap.Writer, cl netip.AddrPort, syn time.Time, payload []byte,
		between func()) {
		c := w.Conn(cl, server, 1000, 5000)
		must(t, w.WriteSegment(syn, cl, server, gencap.Segment{Seq: c.CSeq, Flags: gencap.SYN}))
		c.CSeq++
		must(t, w.WriteSegment(syn.Add(50*time.Microsecond), server, cl, gencap.Segment{Seq: c.SSeq, Ack: c.CSeq,
			Flags: gencap.SYN | gencap.ACK}))
		c.SSeq++
		between()
		must(t, c.Write(syn.Add(5*time.Millisecond), gencap.Segment{Seq: c.CSeq, Ack: c.SSeq, Flags: gencap.ACK}))
		must(t, c.Send(syn.Add(6*time.Millisecond), payload, 1448))
		must(t, c.Close(syn.Add(7*time.Millisecond)))
	}
	t.Run("ban_ends_before_the_ack", func(t *testing.T) {
		// banned at sec(4)+1ms for 30 s: the SYN comes 1 ms before the ban ends, the ACK 4 ms after
		results, events := flowRun(t, func(c *config.Config) { g0(c); c.Ban.Duration = 30 * time.Second },
			func(t testing.TB, w *gencap.Writer) {
				for i := range 5 {
					session(t, w, from(scanner, i), server, sec(i), probe106294)
				}
				slowHandshake(t, w, from(scanner, 5), sec(34), probe106294, func() {})
			})
		if last := results[len(results)-1]; last.Verdict != VerdictReject || !last.Start.Equal(sec(34)) {
			t.Errorf("last stream %s (%s) from %v, want reject, judged after the ban, starting at its SYN", last.Verdict,
				last.Reason, last.Start)
		}
		if d := ofAction(events, audit.ActionDenied); len(d) != 0 {
			t.Errorf("denied events %+v, want none", d)
		}
	})
	t.Run("slot_freed_before_the_ack", func(t *testing.T) {
		src := client(0).Addr()
		results, _ := flowRun(t, func(c *config.Config) { c.Caps.PerSourceConnections = 1 }, func(t testing.TB, w *gencap.Writer) {
			first := w.Conn(netip.AddrPortFrom(src, 50000), server, 1000, 5000)
			must(t, first.Open(ms(0)))
			slowHandshake(t, w, netip.AddrPortFrom(src, 50001), ms(10), traffic(t, protocol.G3), func() {
				must(t, first.Close(ms(12))) // after the second's SYN, before its ACK
			})
		})
		for _, r := range results {
			if r.Verdict != VerdictPass {
				t.Errorf("%v: %s (%s), want pass", r.Src, r.Verdict, r.Reason)
			}
		}
	})
}

// TestHalfOpenScan: a SYN scan of eight ports within scan.window is a scan, as Zeek counts it:
// one scan_detected notice right after the eighth half_open flow. Before, the same capture made
// one too, but of empty flows serve never writes.
func TestHalfOpenScan(t *testing.T) {
	src := client(0).Addr()
	_, events := flowRun(t, nil, func(t testing.TB, w *gencap.Writer) {
		for i := range 8 {
			halfOpen(t, w, netip.AddrPortFrom(src, uint16(50000+i)), ms(100*i), clientRST)
		}
	})
	notices := ofAction(events, audit.ActionScan)
	if len(notices) != 1 {
		t.Fatalf("%d scan notices, want 1", len(notices))
	}
	n := notices[0]
	if val(n.ScanConnections) != "8" || !maps.Equal(n.ScanVerdicts, map[string]uint64{"half_open": 8}) ||
		!n.Timestamp.Equal(ms(700).Add(10*time.Microsecond)) {
		t.Errorf("notice %+v, want 8 half_open connections, at the eighth's RST", n)
	}
}
