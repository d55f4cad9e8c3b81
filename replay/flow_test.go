package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/replay/internal/gencap"
)

// flowRun replays build's capture with the default configuration (sampling off, so that every
// event is written), changed by mod, and returns the results and the audit events.
func flowRun(t *testing.T, mod func(*config.Config), build scenario) ([]StreamResult, []audit.Event) {
	t.Helper()
	cfg := config.Default()
	cfg.Audit.SampleWindow = 0
	if mod != nil {
		mod(&cfg)
	}
	var buf bytes.Buffer
	w, err := gencap.NewWriter(&buf, gencap.Pcap, gencap.Ethernet)
	must(t, err)
	build(t, w)
	must(t, w.Flush())
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	var got []StreamResult
	r, err := New(cfg, Options{AuditFile: path, OnStream: func(res StreamResult) error { got = append(got, res); return nil }})
	must(t, err)
	must(t, r.ReadCapture(context.Background(), "flows.cap", &buf))
	must(t, r.Close())
	return got, readEvents(t, path)
}

// readEvents reads every event of the audit log at path, its passed flows included (auditLines).
func readEvents(t *testing.T, path string) []audit.Event {
	t.Helper()
	var events []audit.Event
	for e, err := range audit.Events(strings.NewReader(strings.Join(auditLines(t, path), "\n"))) {
		must(t, err)
		events = append(events, e)
	}
	return events
}

// auditLines are the lines of the audit log at path and of its passed flows (audit.FlowsPath,
// which the writer keeps apart), merged by time: the audit log's first at equal times.
func auditLines(t testing.TB, path string) []string {
	t.Helper()
	var lines []string
	for _, p := range []string{path, audit.FlowsPath(path)} {
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) && p != path {
			continue
		}
		must(t, err)
		for line := range strings.Lines(string(b)) {
			lines = append(lines, strings.TrimSuffix(line, "\n"))
		}
	}
	at := func(line string) time.Time {
		var e struct {
			At time.Time `json:"@timestamp"`
		}
		must(t, json.Unmarshal([]byte(line), &e))
		return e.At
	}
	slices.SortStableFunc(lines, func(a, b string) int { return at(a).Compare(at(b)) })
	return lines
}

// ofAction returns the events of action a.
func ofAction(events []audit.Event, a audit.Action) []audit.Event {
	var out []audit.Event
	for _, e := range events {
		if e.Action == a {
			out = append(out, e)
		}
	}
	return out
}

// onlyFlow returns the one flow record of events, failing the test if there is not exactly one.
func onlyFlow(t *testing.T, events []audit.Event) audit.Event {
	t.Helper()
	flows := ofAction(events, audit.ActionFlow)
	if len(flows) != 1 {
		t.Fatalf("%d flow records, want 1: %+v", len(flows), flows)
	}
	return flows[0]
}

func val(p *uint64) string {
	if p == nil {
		return "absent"
	}
	return fmt.Sprint(*p)
}

// flowWant is what a flow record must say; empty fields are not checked but for the byte
// counts, which are always.
type flowWant struct {
	verdict    audit.Verdict
	reason     string
	closedBy   string
	fromClient uint64
	fromStore  uint64
	toStore    uint64
	messages   uint64
	first      []byte // nil: no storeguard.first_bytes
	start, end time.Time
}

func checkFlow(t *testing.T, e audit.Event, w flowWant) {
	t.Helper()
	if e.Verdict != w.verdict || e.Reason != w.reason || e.ClosedBy != w.closedBy {
		t.Errorf("flow verdict %q reason %q closed by %q, want %q %q %q", e.Verdict, e.Reason, e.ClosedBy, w.verdict,
			w.reason, w.closedBy)
	}
	for _, c := range []struct {
		name string
		got  *uint64
		want uint64
	}{{"source.bytes", e.SourceBytes, w.fromClient}, {"destination.bytes", e.DestBytes, w.fromStore},
		{"storeguard.store_bytes", e.StoreBytes, w.toStore}, {"storeguard.messages", e.Messages, w.messages},
		{"network.bytes", e.NetBytes, w.fromClient + w.fromStore}} {
		if c.got == nil || *c.got != c.want {
			t.Errorf("%s %s, want %d", c.name, val(c.got), c.want)
		}
	}
	if !bytes.Equal(e.FirstBytes, w.first) {
		t.Errorf("first_bytes %x, want %x", []byte(e.FirstBytes), w.first)
	}
	if e.Mode != audit.ModeReplay {
		t.Errorf("mode %q, want replay", e.Mode)
	}
	if !w.start.IsZero() && !e.Start.Equal(w.start) {
		t.Errorf("event.start %v, want %v", e.Start, w.start)
	}
	if !w.end.IsZero() {
		if !e.Timestamp.Equal(w.end) {
			t.Errorf("@timestamp %v, want the flow's end %v", e.Timestamp, w.end)
		}
		wantEnd := w.end
		if w.verdict == audit.VerdictOpen {
			wantEnd = time.Time{} // an open flow has not ended
		}
		if !e.End.Equal(wantEnd) {
			t.Errorf("event.end %v, want %v", e.End, wantEnd)
		}
	}
}

func mustAppend(t testing.TB, g protocol.Generation, r protocol.Request) []byte {
	t.Helper()
	b, err := protocol.Append(nil, g, r)
	must(t, err)
	return b
}

// reset writes a RST from the client (or, fromStore, from the store) at t.
func reset(t testing.TB, c *gencap.Conn, at time.Time, fromStore bool) {
	t.Helper()
	if fromStore {
		must(t, c.W.WriteSegment(at, c.Server, c.Client, gencap.Segment{Seq: c.SSeq, Ack: c.CSeq, Flags: gencap.RST | gencap.ACK}))
		return
	}
	must(t, c.W.WriteSegment(at, c.Client, c.Server, gencap.Segment{Seq: c.CSeq, Ack: c.SSeq, Flags: gencap.RST | gencap.ACK}))
}

// storeFIN writes the store's FIN at t (the store closing first).
func storeFIN(t testing.TB, c *gencap.Conn, at time.Time) {
	t.Helper()
	must(t, c.W.WriteSegment(at, c.Server, c.Client, gencap.Segment{Seq: c.SSeq, Ack: c.CSeq, Flags: gencap.FIN | gencap.ACK}))
	c.SSeq++
}

// TestTruncatedAtClientEnd: a client that ends its stream (FIN or RST) after 1 to 19 bytes of a
// SET, ADD or WAIT, alone or after a whole GET, is truncated_message at the message's start, a
// blocked event in either mode: before, replay reported such a stream pass with no messages.
func TestTruncatedAtClientEnd(t *testing.T) {
	get := mustAppend(t, protocol.G0, protocol.Request{Op: protocol.OpGet, Key: []byte("k")})
	for _, op := range []protocol.Op{protocol.OpSet, protocol.OpAdd, protocol.OpWait} {
		msg := mustAppend(t, protocol.G0, protocol.Request{Op: op, Key: []byte("rank0/addr"), Value: []byte("10.0.0.2:41000"),
			Int: 1, Keys: [][]byte{[]byte("a")}})
		for _, before := range [][]byte{nil, get} {
			for _, rst := range []bool{false, true} {
				for _, monitor := range []bool{false, true} {
					for n := 1; n < min(len(msg), 20); n++ {
						name := fmt.Sprintf("%s/%d_bytes/after_%d/rst_%v/monitor_%v", op, n, len(before), rst, monitor)
						sent := append(slices.Clone(before), msg[:n]...)
						t.Run(name, func(t *testing.T) {
							checkTruncated(t, op, before, sent, rst, monitor)
						})
					}
				}
			}
		}
	}
}

func checkTruncated(t *testing.T, op protocol.Op, before, sent []byte, rst, monitor bool) {
	results, events := flowRun(t, func(c *config.Config) {
		if monitor {
			c.Mode = config.ModeMonitor
		}
	}, func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		must(t, c.Send(ms(1), sent, 1448))
		if rst {
			reset(t, c, ms(2), false)
		} else {
			must(t, c.Close(ms(2)))
		}
	})
	if len(results) != 1 {
		t.Fatalf("%d results", len(results))
	}
	r := results[0]
	off, n := uint64(len(before)), uint64(len(sent))
	var index uint64
	if len(before) > 0 {
		index = 1
	}
	wantOp := op.String()
	if r.Generation == "unknown" {
		// generation auto: a lone 0x00 may be G0's SET or a later generation's VALIDATE
		wantOp = protocol.OpInvalid.String()
	}
	if r.Verdict != VerdictReject || r.Violation == nil || r.Violation.Rule != protocol.RuleTruncatedMessage ||
		r.Violation.Offset != off || r.Violation.MessageIndex != index || r.Violation.Op != wantOp {
		t.Fatalf("result %+v violation %+v, want reject: truncated_message at %d (message %d, %s)", r, r.Violation,
			off, index, wantOp)
	}
	if r.FlowVerdict != audit.VerdictTruncated || !r.End.Equal(ms(2)) {
		t.Errorf("flow verdict %q end %v, want truncated at %v", r.FlowVerdict, r.End, ms(2))
	}
	// blocked in monitor mode too, as serve records it: nothing of the message was forwarded
	vs := ofAction(events, audit.ActionBlocked)
	if len(vs) != 1 || len(ofAction(events, audit.ActionWouldBlock)) != 0 {
		t.Fatalf("events %+v, want one blocked", events)
	}
	e := vs[0]
	if e.Reason != string(protocol.RuleTruncatedMessage) || val(e.Offset) != fmt.Sprint(off) ||
		val(e.MessageIndex) != fmt.Sprint(index) || e.Op != wantOp || val(e.BytesSeen) != fmt.Sprint(n) ||
		!bytes.Equal(e.FirstBytes, sent[off:]) || !e.Timestamp.Equal(ms(2)) {
		t.Errorf("event %+v: want truncated_message at offset %d, message %d, op %s, bytes_seen %d, first bytes %x, at %v",
			e, off, index, wantOp, n, sent[off:], ms(2))
	}
	var messages uint64
	if len(before) > 0 {
		messages = 1
	}
	checkFlow(t, onlyFlow(t, events), flowWant{verdict: audit.VerdictTruncated, reason: string(protocol.RuleTruncatedMessage),
		closedBy: audit.ClosedByClient, fromClient: n, toStore: off, messages: messages, first: sent[:min(len(sent), 32)],
		fromStore: 0, start: ms(0), end: ms(2)})
}

// TestTruncatedAtStoreEnd: the store resetting (0.23 ms after a 2-byte partial message) or closing a
// stream ends it for the guard too: truncated_message at the store's RST or FIN. Before, replay
// ignored the store's side and, the capture going on, reported message_timeout 30 s later.
func TestTruncatedAtStoreEnd(t *testing.T) {
	partial := mustAppend(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("v")})[:2]
	at := ms(1).Add(230 * time.Microsecond)
	for _, rst := range []bool{true, false} {
		t.Run(fmt.Sprintf("rst_%v", rst), func(t *testing.T) {
			results, events := flowRun(t, nil, func(t testing.TB, w *gencap.Writer) {
				c := w.Conn(client(0), server, 1000, 5000)
				must(t, c.Open(ms(0)))
				must(t, c.Send(ms(1), partial, 1448))
				if rst {
					reset(t, c, at, true)
				} else {
					storeFIN(t, c, at)
				}
				session(t, w, client(1), server, sec(40), traffic(t, protocol.G0)) // the capture goes on past the deadline
			})
			if len(results) != 2 {
				t.Fatalf("%d results", len(results))
			}
			r := results[0]
			if r.Verdict != VerdictReject || r.Violation == nil || r.Violation.Rule != protocol.RuleTruncatedMessage ||
				r.Violation.Offset != 0 || !r.End.Equal(at) || r.FlowVerdict != audit.VerdictTruncated {
				t.Fatalf("result %+v violation %+v, want reject: truncated_message at offset 0, ended %v", r, r.Violation, at)
			}
			vs := ofAction(events, audit.ActionBlocked)
			if len(vs) != 1 || vs[0].Reason != string(protocol.RuleTruncatedMessage) || !vs[0].Timestamp.Equal(at) {
				t.Fatalf("blocked events %+v, want one truncated_message at %v", vs, at)
			}
			flows := ofAction(events, audit.ActionFlow)
			if len(flows) != 2 {
				t.Fatalf("%d flow records, want 2", len(flows))
			}
			checkFlow(t, flows[0], flowWant{verdict: audit.VerdictTruncated, reason: string(protocol.RuleTruncatedMessage),
				closedBy: audit.ClosedByStore, fromClient: 2, first: partial, start: ms(0), end: at})
		})
	}
}

// TestStoreCloseBetweenMessages: the store closing first ends the stream; between messages it passed.
func TestStoreCloseBetweenMessages(t *testing.T) {
	payload := traffic(t, protocol.G3)
	results, events := flowRun(t, nil, func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		must(t, c.Send(ms(1), payload, 1448))
		storeFIN(t, c, ms(2))
		must(t, c.Send(ms(3), payload[:5], 1448)) // after the store's close: never judged
	})
	if len(results) != 1 || results[0].Verdict != VerdictPass || results[0].FlowVerdict != audit.VerdictPassed {
		t.Fatalf("results %+v, want one pass", results)
	}
	f := onlyFlow(t, events)
	checkFlow(t, f, flowWant{verdict: audit.VerdictPassed, closedBy: audit.ClosedByStore, fromClient: uint64(len(payload)),
		toStore: uint64(len(payload)), messages: messageCount(results[0]), start: ms(0), end: ms(2)})
}

func messageCount(r StreamResult) uint64 {
	var n uint64
	for _, c := range r.Messages {
		n += c
	}
	return n
}

// TestFlowEmpty: a connect-and-close is an empty flow.
func TestFlowEmpty(t *testing.T) {
	results, events := flowRun(t, nil, func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		must(t, c.Close(ms(5)))
	})
	if len(results) != 1 || results[0].Verdict != VerdictPass || results[0].FlowVerdict != audit.VerdictEmpty {
		t.Fatalf("results %+v, want pass, flow empty", results)
	}
	checkFlow(t, onlyFlow(t, events), flowWant{verdict: audit.VerdictEmpty, closedBy: audit.ClosedByClient, start: ms(0), end: ms(5)})
}

// TestFlowPassed: a valid session's flow: its bytes each way (the store's retransmission counted
// once), every byte forwarded, its messages by op, its generation, no first bytes.
func TestFlowPassed(t *testing.T) {
	payload := traffic(t, protocol.G3)
	reply := bytes.Repeat([]byte{7}, 3000)
	results, events := flowRun(t, nil, func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		must(t, c.Send(ms(1), payload, 1448))
		seq := c.SSeq
		must(t, c.Reply(ms(2), reply, 1448))
		must(t, c.W.WriteSegment(ms(3), c.Server, c.Client, gencap.Segment{Seq: seq, Ack: c.CSeq, Flags: gencap.ACK,
			Payload: reply[:1448]})) // retransmitted
		must(t, c.Close(ms(4)))
	})
	if len(results) != 1 || results[0].Verdict != VerdictPass || results[0].FlowVerdict != audit.VerdictPassed {
		t.Fatalf("results %+v, want pass", results)
	}
	f := onlyFlow(t, events)
	checkFlow(t, f, flowWant{verdict: audit.VerdictPassed, closedBy: audit.ClosedByClient, fromClient: uint64(len(payload)),
		fromStore: uint64(len(reply)), toStore: uint64(len(payload)), messages: messageCount(results[0]), start: ms(0), end: ms(4)})
	if !maps.Equal(f.Ops, results[0].Messages) {
		t.Errorf("ops %v, want %v", f.Ops, results[0].Messages)
	}
	if f.Generation != "G3" || f.ConnID != 1 || f.Duration == nil || *f.Duration != int64(4*time.Millisecond) {
		t.Errorf("generation %q conn_id %d duration %v", f.Generation, f.ConnID, f.Duration)
	}
	if f.SourceIP != client(0).Addr() || f.SourcePort != client(0).Port() || f.DestIP != server.Addr() || f.DestPort != server.Port() {
		t.Errorf("flow %v:%d → %v:%d", f.SourceIP, f.SourcePort, f.DestIP, f.DestPort)
	}
}

// TestFlowBlocked: a violation ends the flow where serve closes the connection (enforce), or lets
// everything through to the stream's end (monitor); the store gets the valid messages before it.
func TestFlowBlocked(t *testing.T) {
	get := mustAppend(t, protocol.G0, protocol.Request{Op: protocol.OpGet, Key: []byte("k")})
	for _, tc := range []struct {
		name    string
		before  []byte
		monitor bool
	}{
		{"first_message", nil, false},
		{"after_a_get", get, false},
		{"first_message_monitor", nil, true},
		{"after_a_get_monitor", get, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent := append(slices.Clone(tc.before), probe106294...)
			after := []byte{1, 2, 3, 4, 5} // more bytes after the probe
			results, events := flowRun(t, func(c *config.Config) {
				if tc.monitor {
					c.Mode = config.ModeMonitor
				}
			}, func(t testing.TB, w *gencap.Writer) {
				c := w.Conn(client(0), server, 1000, 5000)
				must(t, c.Open(ms(0)))
				must(t, c.Send(ms(1), sent, 1448))
				must(t, c.Send(ms(2), after, 1448))
				must(t, c.Close(ms(3)))
			})
			want := flowWant{verdict: audit.VerdictBlocked, reason: "key_too_long", closedBy: audit.ClosedByGuard,
				fromClient: uint64(len(sent)), toStore: uint64(len(tc.before)), first: sent[:min(len(sent), 32)],
				start: ms(0), end: ms(1)}
			if len(tc.before) > 0 {
				want.messages = 1
			}
			if tc.monitor {
				// serve passes everything on to the client's close
				want.verdict, want.closedBy, want.end = audit.VerdictWouldBlock, audit.ClosedByClient, ms(3)
				want.fromClient += uint64(len(after))
				want.toStore = want.fromClient
			}
			if len(results) != 1 || results[0].Verdict != VerdictReject || results[0].FlowVerdict != want.verdict {
				t.Fatalf("results %+v, want reject, flow %s", results, want.verdict)
			}
			f := onlyFlow(t, events)
			checkFlow(t, f, want)
			if f.Probe != "" && f.Probe != ofAction(events, audit.Action(want.verdict))[0].Probe {
				t.Errorf("probe %q differs from the violation event's", f.Probe)
			}
		})
	}
}

// TestFlowOpen: a stream the capture ends while it lasts is an open flow (event.type info), at the
// capture's end; one with a message in progress too (the stream did not end: not truncated).
func TestFlowOpen(t *testing.T) {
	payload := traffic(t, protocol.G3)
	for _, partial := range []bool{false, true} {
		t.Run(fmt.Sprintf("partial_%v", partial), func(t *testing.T) {
			sent := payload
			if partial {
				sent = payload[:len(payload)-3]
			}
			results, events := flowRun(t, nil, func(t testing.TB, w *gencap.Writer) {
				c := w.Conn(client(0), server, 1000, 5000)
				must(t, c.Open(ms(0)))
				must(t, c.Send(ms(1), sent, 1448))
				must(t, c.Reply(ms(7), []byte{1, 2}, 1448)) // the capture's last packet
			})
			if len(results) != 1 || results[0].Verdict != VerdictPass || results[0].FlowVerdict != audit.VerdictOpen {
				t.Fatalf("results %+v, want pass, flow open", results)
			}
			f := onlyFlow(t, events)
			var toStore uint64 = uint64(len(payload))
			if partial {
				toStore = uint64(len(payload)) - uint64(len(mustLastMessage(t, payload)))
			}
			checkFlow(t, f, flowWant{verdict: audit.VerdictOpen, fromClient: uint64(len(sent)), fromStore: 2, toStore: toStore,
				messages: messageCount(results[0]), start: ms(0), end: ms(7)})
			if !slices.Equal(f.Type, []string{"connection", "info"}) {
				t.Errorf("event.type %v, want connection, info", f.Type)
			}
		})
	}
}

// mustLastMessage returns the last message of a valid G3 stream.
func mustLastMessage(t *testing.T, stream []byte) []byte {
	t.Helper()
	dc := protocol.Config{Gen: protocol.GenSetting{Gen: protocol.G3}, Limits: protocol.DefaultLimits()}
	d := protocol.NewDecoder(dc)
	last := 0
	for p := 0; p < len(stream); {
		n, msg, err := d.Scan(stream[p:])
		must(t, err)
		p += n
		if msg != nil && p < len(stream) {
			last = p
		}
	}
	return stream[last:]
}

// TestFlowIncomplete: a stream replay cannot judge still gets its flow record, without first bytes.
func TestFlowIncomplete(t *testing.T) {
	results, events := flowRun(t, nil, func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		c.CSeq++ // the handshake happened before the capture
		must(t, c.Send(ms(1), traffic(t, protocol.G3), 1448))
		must(t, c.Close(ms(2)))
	})
	if len(results) != 1 || results[0].Verdict != VerdictIncomplete || results[0].FlowVerdict != audit.VerdictIncomplete {
		t.Fatalf("results %+v, want incomplete", results)
	}
	n := uint64(len(traffic(t, protocol.G3)))
	checkFlow(t, onlyFlow(t, events), flowWant{verdict: audit.VerdictIncomplete, reason: ReasonMidstream,
		closedBy: audit.ClosedByClient, fromClient: n, start: ms(1), end: ms(2)})
}

// connectAndClose writes n connect-and-close connections from src's address, every, from at.
func connectAndClose(t testing.TB, w *gencap.Writer, src netip.Addr, n int, at time.Time, every time.Duration) {
	for i := range n {
		c := w.Conn(netip.AddrPortFrom(src, uint16(50000+i)), server, uint32(100*i), 5000)
		must(t, c.Open(at.Add(time.Duration(i)*every)))
		must(t, c.Close(at.Add(time.Duration(i)*every+time.Millisecond)))
	}
}

// TestScanNotice: ten connect-and-close connections from one source within scan.window make one
// scan_detected notice, written right after the eighth's flow record (scan.threshold 8), at its end.
func TestScanNotice(t *testing.T) {
	src := client(0).Addr()
	_, events := flowRun(t, nil, func(t testing.TB, w *gencap.Writer) {
		connectAndClose(t, w, src, 10, ms(0), 100*time.Millisecond)
	})
	var flows int
	var notices []audit.Event
	for _, e := range events {
		switch e.Action {
		case audit.ActionFlow:
			flows++
		case audit.ActionScan:
			if flows != 8 {
				t.Errorf("scan notice after %d flow records, want right after the 8th", flows)
			}
			notices = append(notices, e)
		}
	}
	if flows != 10 || len(notices) != 1 {
		t.Fatalf("%d flow records and %d notices, want 10 and 1", flows, len(notices))
	}
	n := notices[0]
	eighth := ms(7 * 100).Add(time.Millisecond)
	if !n.Timestamp.Equal(eighth) || n.SourceIP != src || val(n.ScanConnections) != "8" ||
		!maps.Equal(n.ScanVerdicts, map[string]uint64{"empty": 8}) || !slices.Equal(n.ScanPorts, []uint16{server.Port()}) ||
		!n.Start.Equal(ms(1)) || n.Mode != audit.ModeReplay {
		t.Errorf("notice %+v", n)
	}
}

// TestScanSparesAJob: a source that has a working connection open (torch <= 2.0 opens silent ones
// beside it) is no scanner for its empty connections.
func TestScanSparesAJob(t *testing.T) {
	src := client(0).Addr()
	_, events := flowRun(t, nil, func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(netip.AddrPortFrom(src, 40999), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		must(t, c.Send(ms(1), traffic(t, protocol.G0), 1448))
		connectAndClose(t, w, src, 10, ms(10), 100*time.Millisecond)
		must(t, c.Close(sec(5)))
	})
	if n := ofAction(events, audit.ActionScan); len(n) != 0 {
		t.Errorf("scan notices %+v, want none", n)
	}
}

// TestFlowsConfig: flows suspicious leaves out passed (and open) flows, keeping half_open ones (a
// SYN scan's), off every flow record; scan notices are written either way.
func TestFlowsConfig(t *testing.T) {
	build := func(t testing.TB, w *gencap.Writer) {
		session(t, w, client(1), server, ms(0), traffic(t, protocol.G3))     // passed
		session(t, w, client(2), server, ms(10), probe106294)                // blocked
		connectAndClose(t, w, client(0).Addr(), 8, ms(20), time.Millisecond) // empty, a scan
		halfOpen(t, w, client(4), ms(50), clientRST)                         // half_open
		c := w.Conn(client(3), server, 1000, 5000)
		must(t, c.Open(ms(100)))
		must(t, c.Send(ms(101), traffic(t, protocol.G3), 1448)) // open
	}
	for _, tc := range []struct {
		flows config.Flows
		want  []audit.Verdict
	}{
		{config.FlowsAll, []audit.Verdict{"passed", "blocked", "empty", "empty", "empty", "empty", "empty", "empty", "empty", "empty",
			"half_open", "open"}},
		{config.FlowsSuspicious, []audit.Verdict{"blocked", "empty", "empty", "empty", "empty", "empty", "empty", "empty", "empty",
			"half_open"}},
		{config.FlowsOff, nil},
	} {
		t.Run(string(tc.flows), func(t *testing.T) {
			_, events := flowRun(t, func(c *config.Config) { c.Flows = tc.flows }, build)
			var got []audit.Verdict
			for _, e := range ofAction(events, audit.ActionFlow) {
				got = append(got, e.Verdict)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("flow verdicts %q, want %q", got, tc.want)
			}
			if n := ofAction(events, audit.ActionScan); len(n) != 1 {
				t.Errorf("%d scan notices, want 1", len(n))
			}
			if n := ofAction(events, audit.ActionBlocked); len(n) != 1 {
				t.Errorf("%d blocked events, want 1", len(n))
			}
		})
	}
}

// TestTrailingStreamsBounded: streams decided in monitor mode go on counting to their end, and
// Options.MaxStreams bounds them too: the least recently active ends first.
func TestTrailingStreamsBounded(t *testing.T) {
	cfg := config.Default()
	cfg.Audit.SampleWindow, cfg.Mode, cfg.Generation = 0, config.ModeMonitor, "1.13"
	var buf bytes.Buffer
	w, err := gencap.NewWriter(&buf, gencap.Pcap, gencap.Ethernet)
	must(t, err)
	probe := []byte{3, 0, 0, 0x0b, 6, 0xe0, 0, 0, 0, 0, 0}
	for i := range 5 {
		c := w.Conn(client(i), server, 1000, 5000)
		must(t, c.Open(ms(10*i)))
		must(t, c.Send(ms(10*i+1), probe, 1448))
	}
	must(t, w.Flush())
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	r, err := New(cfg, Options{AuditFile: path, MaxStreams: 2})
	must(t, err)
	must(t, r.ReadCapture(context.Background(), "trailing.cap", &buf))
	must(t, r.Close())
	flows := ofAction(readEvents(t, path), audit.ActionFlow)
	if len(flows) != 5 {
		t.Fatalf("%d flow records, want 5", len(flows))
	}
	var ended, open int
	for _, f := range flows {
		switch f.Verdict {
		case audit.VerdictWouldBlock:
			ended++
		case audit.VerdictOpen:
			open++
		}
	}
	if ended != 3 || open != 2 {
		t.Errorf("%d flows ended early and %d open at the capture's end, want 3 and 2", ended, open)
	}
}

// TestJobStoresInSummary: a rendezvous round's MASTER_PORT written in the capture on a port it is
// not replayed for (torchrun's c10d rendezvous: the ranks' own store) is in the summary with the
// round's MASTER_ADDR; one on the replayed port is not, nor a rewrite that write-once refused.
func TestJobStoresInSummary(t *testing.T) {
	set := func(key, value string) []byte {
		return mustAppend(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte(value)})
	}
	rank0 := bytes.Join([][]byte{set("torch.rendezvous.job.0/MASTER_ADDR", "10.0.0.2"),
		set("torch.rendezvous.job.0/MASTER_PORT", "41234"), set("torch.rendezvous.job2.0/MASTER_PORT", "29500")}, nil)
	var buf bytes.Buffer
	w, err := gencap.NewWriter(&buf, gencap.Pcap, gencap.Ethernet)
	must(t, err)
	session(t, w, client(0), server, sec(0), rank0)
	session(t, w, client(1), server, sec(1), set("torch.rendezvous.job.0/MASTER_PORT", "4444"))
	must(t, w.Flush())
	cfg := config.Default()
	cfg.Generation = "1.13"
	r, err := New(cfg, Options{})
	must(t, err)
	must(t, r.ReadCapture(context.Background(), "job.cap", &buf))
	must(t, r.Close())
	sum := r.Summary()
	want := []policy.JobStore{{Round: "torch.rendezvous.job.0", Addr: "10.0.0.2", Port: 41234, Src: client(0).Addr()}}
	if !reflect.DeepEqual(sum.JobStores, want) || sum.Reject != 1 {
		t.Fatalf("job stores %+v, %d rejected; want %+v and the rewrite rejected", sum.JobStores, sum.Reject, want)
	}
	if s := sum.String(); !strings.Contains(s, "rendezvous round torch.rendezvous.job.0 sends its ranks to 10.0.0.2:41234, a store no guard of these ports fronts (written by 10.0.0.2)") {
		t.Fatalf("summary %q", s)
	}
}
