package replay

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/replay/internal/gencap"
)

// scanner is a source no default ban.exempt covers.
var scanner = netip.MustParseAddr("10.9.0.7")

func from(a netip.Addr, n int) netip.AddrPort { return netip.AddrPortFrom(a, uint16(41000+n)) }

// g0 is a 1.13 (G0) guard's configuration, with every audit event written.
func g0(c *config.Config) { c.Generation = "1.13" }

// afterBan is what the scanner sends once banned in scanThenBanned: the TerminalServer probe, more
// than admission.PeekBytes of garbage, a valid SET, and nothing (a connect-and-close).
func afterBan(t testing.TB) [][]byte {
	set := mustAppend(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("rank0/addr"), Value: []byte("10.0.0.2:41000")})
	return [][]byte{probe106294, bytes.Repeat([]byte{0xff}, 100), set, nil}
}

// scanThenBanned: src's first 5 connections, 1 s apart, each send the TerminalServer probe (a
// violation as G0); then, 1 s apart, the connections of afterBan. Each closes 3 ms after its SYN.
func scanThenBanned(src netip.Addr) scenario {
	return func(t testing.TB, w *gencap.Writer) {
		for i := range 5 {
			session(t, w, from(src, i), server, sec(i), probe106294)
		}
		for i, p := range afterBan(t) {
			at := sec(5 + i)
			if p == nil {
				c := w.Conn(from(src, 5+i), server, 1000, 5000)
				must(t, c.Open(at))
				must(t, c.Close(at.Add(3*time.Millisecond)))
				continue
			}
			session(t, w, from(src, 5+i), server, at, p)
		}
	}
}

// TestBanAfterViolations: as serve, replay bans a source at its 5th violation within ban.window
// (a banned event right after the 5th blocked one) and refuses its later connections: a denied
// event at each SYN, and a refused flow (reason banned) with the bytes serve would have read for
// ban.peek, at most admission.PeekBytes, named and judged, never decoded as a stream. Before,
// replay judged every stream: 9 blocked events, no banned or denied event, no refused flow.
func TestBanAfterViolations(t *testing.T) {
	results, events := flowRun(t, g0, scanThenBanned(scanner))
	if len(results) != 9 {
		t.Fatalf("%d results, want 9", len(results))
	}
	for i, r := range results {
		switch {
		case i < 5 && (r.Verdict != VerdictReject || r.Violation == nil || r.Violation.Rule != protocol.RuleKeyTooLong):
			t.Errorf("stream %d: %s %+v, want reject by key_too_long", i, r.Verdict, r.Violation)
		case i >= 5 && (r.Verdict != VerdictRefused || r.Reason != "banned" || r.FlowVerdict != audit.VerdictRefused ||
			r.Violation != nil || len(r.Messages) != 0):
			t.Errorf("stream %d: %+v, want refused (banned), nothing decoded", i, r)
		}
	}
	if j := results[5].Judged; j == nil || j.Rule != protocol.RuleKeyTooLong || j.Declared != 962174058496 {
		t.Errorf("the probe's result judged %+v, want key_too_long, declared 962174058496", j)
	}
	if results[7].Judged != nil || results[8].Judged != nil {
		t.Errorf("a valid SET and nothing judged %+v and %+v, want no violation", results[7].Judged, results[8].Judged)
	}

	blocked := ofAction(events, audit.ActionBlocked)
	if len(blocked) != 5 {
		t.Fatalf("%d blocked events, want 5 (the connections before the ban)", len(blocked))
	}
	banned := ofAction(events, audit.ActionBanned)
	if len(banned) != 1 {
		t.Fatalf("%d banned events, want 1", len(banned))
	}
	b := banned[0]
	if b.SourceIP != scanner || b.SourcePort != from(scanner, 4).Port() || b.DestIP != server.Addr() ||
		b.DestPort != server.Port() || b.Reason != string(protocol.RuleKeyTooLong) || b.ConnID != results[4].ID ||
		b.Mode != audit.ModeReplay || !b.Timestamp.Equal(sec(4).Add(time.Millisecond)) ||
		b.CommunityID != audit.CommunityID(scanner, from(scanner, 4).Port(), server.Addr(), server.Port()) {
		t.Errorf("banned event %+v, want the 5th connection's, at its violation", b)
	}
	if i, j := slices.IndexFunc(events, func(e audit.Event) bool { return e.Action == audit.ActionBanned }),
		slices.IndexFunc(events, func(e audit.Event) bool { return e.ID == blocked[4].ID }); i != j+1 {
		t.Errorf("banned event at %d, want right after the 5th blocked event (%d)", i, j)
	}

	denied := ofAction(events, audit.ActionDenied)
	if len(denied) != 4 {
		t.Fatalf("%d denied events, want 4 (the connections after the ban)", len(denied))
	}
	for i, d := range denied {
		src := from(scanner, 5+i)
		if d.SourceIP != src.Addr() || d.SourcePort != src.Port() || d.Reason != "banned" || d.ConnID != 0 ||
			!d.Timestamp.Equal(sec(5+i).Add(100*time.Microsecond)) {
			t.Errorf("denied event %d: %+v, want %v's, at its handshake's last ACK", i, d, src)
		}
	}

	flows := ofAction(events, audit.ActionFlow)
	if len(flows) != 9 {
		t.Fatalf("%d flow records, want 9", len(flows))
	}
	for i, p := range afterBan(t) {
		f := flows[5+i]
		n := min(len(p), 64)
		want := flowWant{verdict: audit.VerdictRefused, reason: "banned", closedBy: audit.ClosedByGuard,
			fromClient: uint64(n), first: p[:min(n, audit.MaxFirstBytes)], start: sec(5 + i),
			end: sec(5 + i).Add(3 * time.Millisecond)} // the client's FIN
		if n == 64 {
			want.end = sec(5 + i).Add(time.Millisecond) // the bytes that made admission.PeekBytes
		}
		if n == 0 {
			want.first = nil
		}
		checkFlow(t, f, want)
		if f.ConnID != 0 || f.Ops != nil || f.Generation != "" {
			t.Errorf("refused flow %d: conn_id %d, ops %v, generation %q, want none (serve's has none)", i, f.ConnID, f.Ops,
				f.Generation)
		}
	}
	probe := flows[5]
	if probe.Op != "add" || probe.Field != "key" || probe.Declared == nil || uint64(*probe.Declared) != 962174058496 ||
		probe.Probe != blocked[0].Probe {
		t.Errorf("the probe's refused flow: op %q field %q declared %v probe %q, want add, key, 962174058496, %q",
			probe.Op, probe.Field, probe.Declared, probe.Probe, blocked[0].Probe)
	}
	if set := flows[7]; set.Op != "" || set.Field != "" {
		t.Errorf("a valid SET's refused flow: op %q field %q, want none", set.Op, set.Field)
	}
}

// TestBanPeekEnds: a banned source's connection is read as serve reads it: until
// admission.PeekBytes came, admission.PeekRest after its first bytes, ban.peek after its accept (the
// handshake's last ACK), or its end, whichever comes first; not at all with ban.peek 0 (closed at
// its accept). What it sends later is not counted.
func TestBanPeekEnds(t *testing.T) {
	garbage := bytes.Repeat([]byte{0xfe}, 40)
	for _, tc := range []struct {
		name   string
		peek   time.Duration
		send   func(t testing.TB, c *gencap.Conn, syn time.Time) // then the capture goes on for 10 s
		end    time.Duration                                     // after the SYN
		client uint64
		accept bool // end is after the accept, 100 µs after the SYN
	}{
		{"nothing, open", 2 * time.Second, func(testing.TB, *gencap.Conn, time.Time) {}, 2 * time.Second, 0, true},
		{"bytes, open", 2 * time.Second, func(t testing.TB, c *gencap.Conn, syn time.Time) {
			must(t, c.Send(syn.Add(500*time.Millisecond), garbage, 1448))
			must(t, c.Send(syn.Add(550*time.Millisecond), garbage, 1448)) // within PeekRest: read, up to 64
			must(t, c.Send(syn.Add(700*time.Millisecond), garbage, 1448))
		}, 550 * time.Millisecond, 64, false},
		{"bytes within PeekRest", 2 * time.Second, func(t testing.TB, c *gencap.Conn, syn time.Time) {
			must(t, c.Send(syn.Add(500*time.Millisecond), garbage[:10], 1448))
			must(t, c.Send(syn.Add(590*time.Millisecond), garbage[:10], 1448))
			must(t, c.Send(syn.Add(610*time.Millisecond), garbage[:10], 1448)) // after PeekRest
		}, 600 * time.Millisecond, 20, false},
		{"bytes after ban.peek", 2 * time.Second, func(t testing.TB, c *gencap.Conn, syn time.Time) {
			must(t, c.Send(syn.Add(3*time.Second), garbage, 1448))
		}, 2 * time.Second, 0, true},
		{"bytes, then a reset", 2 * time.Second, func(t testing.TB, c *gencap.Conn, syn time.Time) {
			must(t, c.Send(syn.Add(10*time.Millisecond), garbage[:10], 1448))
			reset(t, c, syn.Add(20*time.Millisecond), false)
		}, 20 * time.Millisecond, 10, false},
		{"ban.peek 0", 0, func(t testing.TB, c *gencap.Conn, syn time.Time) {
			must(t, c.Send(syn.Add(time.Millisecond), garbage, 1448))
		}, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			syn := sec(10)
			_, events := flowRun(t, func(c *config.Config) { g0(c); c.Ban.Peek = tc.peek },
				func(t testing.TB, w *gencap.Writer) {
					for i := range 5 {
						session(t, w, from(scanner, i), server, sec(i), probe106294)
					}
					c := w.Conn(from(scanner, 5), server, 1000, 5000)
					must(t, c.Open(syn))
					tc.send(t, c, syn)
					// the capture goes on: another source's connection
					session(t, w, client(0), server, sec(20), traffic(t, protocol.G0))
				})
			flows := ofAction(events, audit.ActionFlow)
			i := slices.IndexFunc(flows, func(e audit.Event) bool { return e.SourcePort == from(scanner, 5).Port() })
			if i < 0 {
				t.Fatal("no flow record of the banned source's connection")
			}
			var first []byte
			if tc.client > 0 {
				first = garbage[:min(tc.client, audit.MaxFirstBytes)]
			}
			end := syn.Add(tc.end)
			if tc.accept {
				end = end.Add(100 * time.Microsecond)
			}
			checkFlow(t, flows[i], flowWant{verdict: audit.VerdictRefused, reason: "banned", closedBy: audit.ClosedByGuard,
				fromClient: tc.client, first: first, start: syn, end: end})
			if n := len(ofAction(events, audit.ActionBlocked)); n != 5 {
				t.Errorf("%d blocked events, want 5: a banned source's bytes are not judged as a stream", n)
			}
		})
	}
}

// TestBanSpares: no ban for a source in ban.exempt (loopback by default), in monitor mode, or for
// streams cut short inside a message (truncated_message never counts).
func TestBanSpares(t *testing.T) {
	loopback := netip.MustParseAddr("127.0.0.1")
	get := mustAppend(t, protocol.G0, protocol.Request{Op: protocol.OpGet, Key: []byte("k")})
	for _, tc := range []struct {
		name  string
		mod   func(*config.Config)
		build scenario
	}{
		{"exempt loopback", g0, func(t testing.TB, w *gencap.Writer) {
			scanThenBanned(loopback)(t, w)
			for i := range 5 { // more than ban.violations within ban.window
				session(t, w, from(loopback, 10+i), server, sec(10+i), probe106294)
			}
		}},
		{"monitor mode", func(c *config.Config) { g0(c); c.Mode = config.ModeMonitor }, scanThenBanned(scanner)},
		{"truncated messages", g0, func(t testing.TB, w *gencap.Writer) {
			for i := range 9 {
				session(t, w, from(scanner, i), server, sec(i), get[:5])
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			results, events := flowRun(t, tc.mod, tc.build)
			for _, a := range []audit.Action{audit.ActionBanned, audit.ActionDenied} {
				if e := ofAction(events, a); len(e) != 0 {
					t.Errorf("%d %s events, want none: %+v", len(e), a, e)
				}
			}
			for _, r := range results {
				if r.Verdict == VerdictRefused {
					t.Errorf("%v refused (%s), want every stream judged", r.Src, r.Reason)
				}
			}
		})
	}
}

// TestBanThrottlesAServingSource: as serve, a source with a stream open that completed a valid
// message (a job's rank, behind NAT with a scanner) is banned by its violations all the same; the
// job's stream goes on, and the source's new streams are throttled to ban.serving-rate (refused,
// ban_throttled, until a token has built up since the ban) while it serves the job, then refused
// (banned) once the job is gone. Before, its violations did not count: no ban at all.
func TestBanThrottlesAServingSource(t *testing.T) {
	job := from(scanner, 99)
	results, events := flowRun(t, func(c *config.Config) { g0(c); c.Ban.ServingRate = 0.1 },
		func(t testing.TB, w *gencap.Writer) {
			j := w.Conn(job, server, 1000, 5000)
			must(t, j.Open(ms(0)))
			must(t, j.Send(ms(1), traffic(t, protocol.G0), 1448))
			scanThenBanned(scanner)(t, w)                                              // the ban at 4 s; 4 streams from 5 s to 8 s
			session(t, w, from(scanner, 20), server, sec(20), traffic(t, protocol.G0)) // 1.6 tokens
			must(t, j.Close(sec(30)))
			session(t, w, from(scanner, 31), server, sec(31), traffic(t, protocol.G0))
		})
	if banned := ofAction(events, audit.ActionBanned); len(banned) != 1 || banned[0].SourcePort != from(scanner, 4).Port() {
		t.Fatalf("banned events %+v, want one, at the 5th violation", banned)
	}
	want := map[netip.AddrPort]string{job: "pass", from(scanner, 20): "pass", from(scanner, 31): "refused banned"}
	for i := range 4 {
		want[from(scanner, 5+i)] = "refused ban_throttled"
	}
	for _, r := range results {
		w, ok := want[r.Src]
		if !ok {
			continue
		}
		got := string(r.Verdict)
		if r.Verdict == VerdictRefused {
			got += " " + r.Reason
		}
		if got != w {
			t.Errorf("%v: %s, want %s", r.Src, got, w)
		}
		delete(want, r.Src)
	}
	if len(want) != 0 {
		t.Errorf("no result for %v", want)
	}
}

// TestBanExpires: a ban lasts ban.duration of capture time; then the source's streams are judged
// again.
func TestBanExpires(t *testing.T) {
	results, _ := flowRun(t, func(c *config.Config) { g0(c); c.Ban.Duration = 30 * time.Second },
		func(t testing.TB, w *gencap.Writer) {
			for i := range 5 {
				session(t, w, from(scanner, i), server, sec(i), probe106294)
			}
			session(t, w, from(scanner, 5), server, sec(20), probe106294) // banned
			session(t, w, from(scanner, 6), server, sec(40), probe106294) // 36 s after the ban
		})
	var got []Verdict
	for _, r := range results {
		got = append(got, r.Verdict)
	}
	want := []Verdict{VerdictReject, VerdictReject, VerdictReject, VerdictReject, VerdictReject, VerdictRefused, VerdictReject}
	if !slices.Equal(got, want) {
		t.Errorf("verdicts %v, want %v", got, want)
	}
}

// TestAdmissionRefusals: access lists and caps refuse a stream as serve refuses the
// connection at accept (the handshake's last ACK): a denied event with the reason, a refused flow
// with no bytes that ends there, no judgement of what it sends.
func TestAdmissionRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mod    func(*config.Config)
		reason string
	}{
		{"access.deny", func(c *config.Config) { c.Access.Deny = []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")} }, "denied"},
		{"access.allow", func(c *config.Config) { c.Access.Allow = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")} }, "not_allowed"},
		{"caps.per-source-connections", func(c *config.Config) { c.Caps.PerSourceConnections = 1 }, "source_connections"},
		{"caps.max-connections", func(c *config.Config) { c.Caps.MaxConnections = config.AutoCount{N: 1} }, "max_connections"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			results, events := flowRun(t, func(c *config.Config) { g0(c); tc.mod(c) }, func(t testing.TB, w *gencap.Writer) {
				open := w.Conn(from(scanner, 0), server, 1000, 5000) // admitted unless the access lists say no
				must(t, open.Open(ms(0)))
				session(t, w, from(scanner, 1), server, ms(10), probe106294)
				must(t, open.Close(ms(100)))
			})
			lists := tc.reason == "denied" || tc.reason == "not_allowed" // the first stream is refused too
			for _, r := range results {
				if r.Src == from(scanner, 0) && (r.Verdict == VerdictRefused) != lists {
					t.Errorf("the first stream %s (%s)", r.Verdict, r.Reason)
				}
			}
			var denied []audit.Event
			for _, e := range ofAction(events, audit.ActionDenied) {
				if e.SourcePort == from(scanner, 1).Port() {
					denied = append(denied, e)
				}
			}
			accept := ms(10).Add(100 * time.Microsecond) // the handshake's last ACK
			if len(denied) != 1 || denied[0].Reason != tc.reason || !denied[0].Timestamp.Equal(accept) {
				t.Fatalf("denied events %+v, want one, reason %s, at the accept", denied, tc.reason)
			}
			for _, r := range results {
				if r.Src == from(scanner, 1) && (r.Verdict != VerdictRefused || r.Reason != tc.reason || r.Judged != nil) {
					t.Errorf("%+v, want refused (%s), nothing judged", r, tc.reason)
				}
			}
			if n := len(ofAction(events, audit.ActionBlocked)); n != 0 {
				t.Errorf("%d blocked events, want none: a refused stream is not judged", n)
			}
			for _, f := range ofAction(events, audit.ActionFlow) {
				if f.SourcePort == from(scanner, 1).Port() {
					checkFlow(t, f, flowWant{verdict: audit.VerdictRefused, reason: tc.reason, closedBy: audit.ClosedByGuard,
						start: ms(10), end: accept})
				}
			}
		})
	}
}

// TestBanPeeksAtOnce: as serve, replay reads at most admission.MaxPeeks banned connections at once;
// one more is closed at its accept, unread.
func TestBanPeeksAtOnce(t *testing.T) {
	n := admission.MaxPeeks + 1
	_, events := flowRun(t, g0, func(t testing.TB, w *gencap.Writer) {
		for i := range 5 {
			session(t, w, from(scanner, i), server, sec(i), probe106294)
		}
		conns := make([]*gencap.Conn, n)
		for i := range conns { // all open at once
			conns[i] = w.Conn(netip.AddrPortFrom(scanner, uint16(50000+i)), server, 1000, 5000)
			must(t, conns[i].Open(sec(10).Add(time.Duration(i)*time.Microsecond)))
		}
		for _, c := range conns {
			must(t, c.Send(sec(10).Add(10*time.Millisecond), probe106294, 1448))
			must(t, c.Close(sec(10).Add(20*time.Millisecond)))
		}
	})
	var read, unread int
	fin := sec(10).Add(20 * time.Millisecond) // give or take the others' packets just before
	for _, f := range ofAction(events, audit.ActionFlow) {
		if f.Verdict != audit.VerdictRefused {
			continue
		}
		switch {
		case val(f.SourceBytes) == "11" && !f.Timestamp.Before(fin) && f.Timestamp.Before(fin.Add(time.Millisecond)):
			read++
		case val(f.SourceBytes) == "0" && f.SourcePort == uint16(50000+n-1) &&
			f.Timestamp.Equal(sec(10).Add(time.Duration(n-1+100)*time.Microsecond)): // its accept
			unread++
		default:
			t.Errorf("refused flow from port %d: %s bytes, %v to %v", f.SourcePort, val(f.SourceBytes), f.Start, f.Timestamp)
		}
	}
	if read != admission.MaxPeeks || unread != 1 {
		t.Errorf("%d connections read and %d not, want %d and 1", read, unread, admission.MaxPeeks)
	}
}
