package proxy

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
)

// rdpProbe is nmap's TerminalServer probe: to a torch <= 2.1 store, an ADD whose key is 962 GB
// long (PyTorch #106294).
const rdpProbe = "0300000b06e00000000000"

// flowsOf waits for n flow records and returns them.
func (h *harness) flowsOf(action string, n int) []map[string]any {
	h.t.Helper()
	var got []map[string]any
	eventually(h.t, fmt.Sprintf("%d %s records", n, action), func() bool {
		got = got[:0]
		for _, e := range h.audit.flows(h.t) {
			if e["event.action"] == action {
				got = append(got, e)
			}
		}
		return len(got) >= n
	})
	return got
}

func num(e map[string]any, k string) float64 {
	v, _ := e[k].(float64)
	return v
}

func TestFlowRecords(t *testing.T) { run(t, testFlowRecords) }

// testFlowRecords: every connection gets one record at its end, saying what it sent, what
// reached the store and what became of it.
func testFlowRecords(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "1.13" })
	h.store.SetReply([]byte("ok"))

	// A job's connection: two valid messages, a reply, then the client closes.
	set := enc(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: []byte("v")})
	get := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	c := h.dial()
	c.Write(append(set, get...))
	eventually(t, "both at the store", func() bool { return len(h.store.Received(0)) == len(set)+len(get) })
	c.SetReadDeadline(time.Now().Add(patience))
	c.Read(make([]byte, 2))
	c.Close()
	f := h.flowsOf("flow", 1)[0]
	if f["storeguard.verdict"] != "passed" || num(f, "source.bytes") != float64(len(set)+len(get)) ||
		num(f, "storeguard.store_bytes") != float64(len(set)+len(get)) || num(f, "storeguard.messages") != 2 ||
		f["storeguard.closed_by"] != "client" || f["storeguard.first_bytes"] != nil || f["event.end"] == nil {
		t.Fatalf("passed flow %v", f)
	}
	if ops, _ := f["storeguard.ops"].(map[string]any); ops["set"] != float64(1) || ops["get_num_keys"] != float64(1) {
		t.Errorf("ops %v", f["storeguard.ops"])
	}

	// A connect-and-close: empty. The nmap probe: blocked, with nothing forwarded. A SET cut short
	// by the client's close: truncated, with an event of its own.
	c = h.dial()
	c.Close()
	c = h.dial()
	c.Write(unhex(t, rdpProbe))
	closedByPeer(t, c)
	c = h.dial()
	c.Write(set[:5])
	time.Sleep(20 * time.Millisecond)
	c.Close()
	flows := h.flowsOf("flow", 4)
	byVerdict := map[string]map[string]any{}
	for _, f := range flows {
		byVerdict[f["storeguard.verdict"].(string)] = f
	}
	if f := byVerdict["empty"]; f == nil || num(f, "source.bytes") != 0 || num(f, "storeguard.store_bytes") != 0 {
		t.Errorf("empty flow %v", f)
	}
	if f := byVerdict["blocked"]; f == nil || f["event.reason"] != "key_too_long" ||
		num(f, "storeguard.store_bytes") != 0 || f["storeguard.first_bytes"] != rdpProbe || f["storeguard.closed_by"] != "guard" {
		t.Errorf("blocked flow %v", f)
	}
	if f := byVerdict["truncated"]; f == nil || f["event.reason"] != "truncated_message" ||
		num(f, "source.bytes") != 5 || num(f, "storeguard.store_bytes") != 0 {
		t.Errorf("truncated flow %v", f)
	}
	var truncated int
	for _, e := range h.audit.events(t) {
		if e["event.reason"] == "truncated_message" {
			truncated++
			if e["event.action"] != "blocked" || num(e, "storeguard.bytes_seen") != 5 || e["storeguard.op"] != "set" {
				t.Errorf("truncated event %v", e)
			}
		}
	}
	if truncated != 1 {
		t.Errorf("%d truncated_message events", truncated)
	}
	if !bytes.Equal(h.store.Received(0), append(set, get...)) {
		t.Errorf("the store received %x", h.store.Received(0))
	}
	if v := h.metric(`storeguard_bans_total`); v != "0" {
		t.Errorf("bans %s: loopback is exempt", v)
	}
}

func TestTruncatedNeverBans(t *testing.T) { run(t, testTruncatedNeverBans) }

// testTruncatedNeverBans: a client that stops mid-message (a rank killed while sending) is
// recorded, not banned.
func testTruncatedNeverBans(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Ban.Violations, c.Ban.Exempt = 1, nil
	})
	for range 3 {
		c := h.dial()
		c.Write([]byte{0, 9})
		time.Sleep(10 * time.Millisecond)
		c.Close()
	}
	h.flowsOf("flow", 3)
	if v := h.metric(`storeguard_bans_total`); v != "0" {
		t.Errorf("bans %s after truncated messages", v)
	}
}

func TestBannedConnectionsNamed(t *testing.T) { run(t, testBannedConnectionsNamed) }

// testBannedConnectionsNamed: once a source is banned, its connections are refused, but what they
// send first is read (never forwarded), so the record names it: the #106294 ADD after a ban.
func testBannedConnectionsNamed(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Generation = "1.13"
		c.Ban.Violations, c.Ban.Exempt, c.Ban.Peek = 1, nil, time.Second
		c.Scan.Threshold = 0
	})
	c := h.dial()
	c.Write([]byte{0xff})
	closedByPeer(t, c)
	eventually(t, "the ban", func() bool { return h.metric(`storeguard_bans_active`) == "1" })
	c = h.dial()
	c.Write(unhex(t, rdpProbe))
	closedByPeer(t, c)
	var refused map[string]any
	eventually(t, "the refused flow", func() bool {
		for _, f := range h.audit.flows(t) {
			if f["storeguard.verdict"] == "refused" {
				refused = f
				return true
			}
		}
		return false
	})
	if refused["event.reason"] != "banned" || refused["storeguard.first_bytes"] != rdpProbe ||
		refused["storeguard.op"] != "add" || refused["storeguard.field"] != "key" ||
		refused["storeguard.declared"] != "962174058496" || num(refused, "storeguard.store_bytes") != 0 {
		t.Fatalf("refused flow %v", refused)
	}
	if got := h.store.Received(0); len(got) != 0 {
		t.Fatalf("the store received %x", got)
	}
}

func TestScanNotice(t *testing.T) { run(t, testScanNotice) }

// testScanNotice: one notice as soon as a source's connections that sent nothing or only invalid
// bytes reach the threshold, none for a job's own connections.
func testScanNotice(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Generation = "1.13"
		c.Scan.Threshold, c.Scan.Window = 4, time.Minute
	})
	// A job's connection stays open: its source's silent connections are no scan.
	job := h.dial()
	job.Write(enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys}))
	eventually(t, "the job's message", func() bool { return len(h.store.Received(0)) > 0 })
	for range 5 {
		c := h.dial()
		c.Close()
	}
	h.flowsOf("flow", 5)
	for _, f := range h.audit.flows(t) {
		if f["event.action"] == "scan_detected" {
			t.Fatalf("scan notice for a job's silent connections: %v", f)
		}
	}
	// Once the job is gone, its silent connections still do not count for the window; hostile
	// bytes do.
	job.Close()
	h.flowsOf("flow", 6)
	for range 4 {
		c := h.dial()
		c.Write(unhex(t, rdpProbe))
		closedByPeer(t, c)
	}
	n := h.flowsOf("scan_detected", 1)[0]
	if num(n, "storeguard.scan.connections") != 4 || n["source.ip"] != "127.0.0.1" || n["event.kind"] != "alert" {
		t.Fatalf("scan notice %v", n)
	}
	for range 3 {
		c := h.dial()
		c.Write(unhex(t, rdpProbe))
		closedByPeer(t, c)
	}
	h.flowsOf("flow", 13)
	if got := h.flowsOf("scan_detected", 1); len(got) != 1 {
		t.Errorf("%d notices in one window", len(got))
	}
	if v := h.metric(`storeguard_scans_detected_total`); v != "1" {
		t.Errorf("scans metric %s", v)
	}
}

func TestInterimFlows(t *testing.T) { run(t, testInterimFlows) }

// testInterimFlows: a connection that lasts gets interim records (verdict open, no end) with its
// bytes so far, and its final record at the end.
func testInterimFlows(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Generation = "1.13"
		c.Audit.FlowInterim = time.Millisecond
	})
	get := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	c := h.dial()
	c.Write(get)
	eventually(t, "the message at the store", func() bool { return len(h.store.Received(0)) == len(get) })
	time.Sleep(5 * time.Millisecond)
	h.srv.ev.interimFlows(&h.srv.reg) // as the sweep does every 5 s
	open := h.flowsOf("flow", 1)[0]
	if open["storeguard.verdict"] != "open" || open["event.end"] != nil || num(open, "source.bytes") != float64(len(get)) ||
		num(open, "storeguard.store_bytes") != float64(len(get)) {
		t.Fatalf("interim record %v", open)
	}
	if typ, _ := open["event.type"].([]any); len(typ) != 2 || typ[1] != "info" {
		t.Errorf("interim record's event.type %v", open["event.type"])
	}
	c.Write(get)
	eventually(t, "the second message", func() bool { return len(h.store.Received(0)) == 2*len(get) })
	c.Close()
	flows := h.flowsOf("flow", 2)
	if last := flows[1]; last["storeguard.verdict"] != "passed" || num(last, "source.bytes") != float64(2*len(get)) {
		t.Fatalf("final record %v", last)
	}
}

// TestAuditRotationsMetric: audit_rotations_total shows how often each of the audit writer's file
// sets rotated, as Options.AuditRotations reads them.
func TestAuditRotationsMetric(t *testing.T) {
	cfg := config.Default()
	cfg.Upstream, cfg.MetricsListen = "127.0.0.1:29501", ""
	srv, err := New(parsed(t, cfg), Options{AuditRotations: func() (events, flows uint64) { return 2, 40 }})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	srv.httpHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{`storeguard_audit_rotations_total{log="events"} 2`, `storeguard_audit_rotations_total{log="flows"} 40`} {
		if !strings.Contains(rec.Body.String(), want+"\n") {
			t.Errorf("no %s in /metrics", want)
		}
	}
}
