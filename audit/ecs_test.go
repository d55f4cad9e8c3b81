package audit_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

// The ECS definitions of the fields storeguard writes, at the pinned release: made by
// testdata/ecs/extract.py from elastic/ecs generated/ecs/ecs_flat.yml.
type ecsSchema struct {
	Version string `json:"ecs_version"`
	Source  struct {
		Tag, Commit, Path string
	}
	Fields map[string]ecsField
}

type ecsField struct {
	Type          string
	Normalize     []string
	AllowedValues []struct {
		Name               string
		ExpectedEventTypes []string `json:"expected_event_types"`
	} `json:"allowed_values"`
}

func (f ecsField) allowed(v string) bool {
	return slices.ContainsFunc(f.AllowedValues, func(a struct {
		Name               string
		ExpectedEventTypes []string `json:"expected_event_types"`
	}) bool {
		return a.Name == v
	})
}

// expectedTypes is the event.type values ECS expects with the event.category value cat.
func (s *ecsSchema) expectedTypes(cat string) []string {
	for _, a := range s.Fields["event.category"].AllowedValues {
		if a.Name == cat {
			return a.ExpectedEventTypes
		}
	}
	return nil
}

func loadECS(t *testing.T) *ecsSchema {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "ecs", "fields.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s ecsSchema
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("testdata/ecs/fields.json: %v", err)
	}
	if s.Version == "" || len(s.Fields) == 0 || s.Source.Commit == "" {
		t.Fatal("testdata/ecs/fields.json: no version, commit or fields (re-run extract.py)")
	}
	return &s
}

// doc is one written line, decoded as Elasticsearch or a SIEM would see it: a generic map, every
// number a json.Number so that none is rounded before it is checked.
type doc struct {
	name string // what was written: "flow/blocked", "sampled_summary (Close)"
	line []byte
	m    map[string]any
}

var t0 = time.Date(2026, 11, 23, 10, 0, 0, 123456789, time.UTC)

// Addresses of the corpus; the link-local source carries a zone, as serve's accept reports one.
var (
	srcV4   = netip.MustParseAddrPort("10.77.0.2:40001")
	dstV4   = netip.MustParseAddrPort("10.77.0.1:29499")
	srcLL   = netip.MustParseAddrPort("[fe80::2%veth0]:40002")
	dstLL   = netip.MustParseAddrPort("[fe80::1]:29499")
	srcScan = netip.MustParseAddrPort("[2001:db8::66]:51000")
)

// everyKind writes one event of every kind storeguard writes, through a real Writer with obs
// (nil: none), and returns the lines it wrote. Each case is written as its producer writes it
// (proxy, replay, Queue), so what is checked is what reaches a SIEM.
func everyKind(t *testing.T, obs *audit.Observer) []doc {
	t.Helper()
	var buf bytes.Buffer
	now := t0
	w := audit.New(&buf, audit.Options{
		Observer: obs, Clock: func() time.Time { return now },
		// Sampling on, so that the second and third key_too_long of srcV4 are summarized.
		SampleFirst: 1, SampleWindow: time.Minute,
	})
	var docs []doc
	mark := 0
	take := func(name string) {
		t.Helper()
		docs = append(docs, splitLines(t, name, buf.Bytes()[mark:])...)
		mark = buf.Len()
	}
	write := func(name string, e audit.Event) {
		t.Helper()
		if err := w.Write(e); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		take(name)
		now = now.Add(time.Millisecond)
	}

	keyTooLong := &protocol.Violation{Rule: protocol.RuleKeyTooLong, Field: protocol.FieldKey, Offset: 3,
		Op: protocol.OpSet, Wire: 0x03, Generation: protocol.G0, Declared: 0xe006000000000000, Limit: 8192}
	probe := []byte{0x03, 0x00, 0x00, 0x0b, 0x06, 0xe0, 0x00, 0x00, 0x00, 0x00, 0x00}
	write("blocked", audit.ViolationEvent(keyTooLong, true, srcV4, dstV4, audit.ActionBlocked, audit.ModeEnforce, probe, 11))
	tooLong := *keyTooLong
	tooLong.Declared = 1<<64 - 1
	write("would_block", audit.ViolationEvent(&tooLong, true, srcLL, dstLL, audit.ActionWouldBlock, audit.ModeMonitor, probe, 11))
	noField := &protocol.Violation{Rule: protocol.RuleValidateMissing, Op: protocol.OpSet, Generation: protocol.G2}
	write("blocked/validate_missing", audit.ViolationEvent(noField, false, srcLL, dstLL, audit.ActionBlocked, audit.ModeEnforce, probe[:4], 4))
	truncated := &protocol.Violation{Rule: protocol.RuleTruncatedMessage, Op: protocol.OpGet, Generation: protocol.G3, Offset: 40}
	write("blocked/truncated_message", audit.ViolationEvent(truncated, true, srcV4, dstV4, audit.ActionBlocked, audit.ModeEnforce, nil, 41))

	denied := audit.Event{Action: audit.ActionDenied, Reason: "source_rate",
		SourceIP: srcScan.Addr(), SourcePort: srcScan.Port(), DestIP: dstV4.Addr(), DestPort: dstV4.Port(),
		CommunityID: audit.CommunityID(srcScan.Addr(), srcScan.Port(), dstV4.Addr(), dstV4.Port())}
	write("denied", denied)
	banned := denied
	banned.Action, banned.Reason, banned.ConnID, banned.Mode = audit.ActionBanned, string(protocol.RuleKeyTooLong), 9, audit.ModeEnforce
	write("banned", banned)

	for _, reason := range []string{"upgrade", "restart"} {
		write("handover/"+reason, audit.Event{Action: audit.ActionHandover, Reason: reason,
			Connections: new(uint64(3)), Mode: audit.ModeEnforce, DestIP: netip.IPv6Unspecified(), DestPort: 29499})
	}

	// One flow of every verdict, as serve closes them (open: an interim record).
	flows := []struct {
		verdict  audit.Verdict
		reason   string
		closedBy string
		src      netip.AddrPort
	}{
		{audit.VerdictPassed, "", audit.ClosedByClient, srcV4},
		{audit.VerdictOpen, "", "", srcLL},
		{audit.VerdictEmpty, "", audit.ClosedByClient, srcScan},
		{audit.VerdictTruncated, string(protocol.RuleTruncatedMessage), audit.ClosedByClient, srcV4},
		{audit.VerdictBlocked, string(protocol.RuleKeyTooLong), audit.ClosedByGuard, srcV4},
		{audit.VerdictWouldBlock, string(protocol.RuleKeyTooLong), audit.ClosedByStore, srcLL},
		{audit.VerdictRefused, "max_connections", audit.ClosedByGuard, srcScan},
		{audit.VerdictIncomplete, "gap", audit.ClosedByClient, srcV4},
		{audit.VerdictHalfOpen, "", audit.ClosedByClient, srcScan},
	}
	for i, f := range flows {
		var ops [32]uint64
		ops[protocol.OpValidate], ops[protocol.OpSet], ops[protocol.OpGet] = 1, 5, 7
		fl := audit.Flow{ConnID: uint64(100 + i), Src: f.src, Dst: dstV4, Start: now.Add(-90 * time.Second), End: now,
			Verdict: f.verdict, Reason: f.reason, ClosedBy: f.closedBy, Generation: "G3", Mode: audit.ModeEnforce,
			FromClient: 1 << 20, ToStore: 1 << 20, FromStore: 4096, Messages: 13, Replies: 13, Ops: &ops, First: probe}
		switch f.verdict {
		case audit.VerdictWouldBlock:
			fl.Mode = audit.ModeMonitor
		case audit.VerdictHalfOpen: // replay's, of a SYN scan: nothing sent, nothing decoded
			fl = audit.Flow{ConnID: fl.ConnID, Src: f.src, Dst: dstV4, Start: now.Add(-time.Millisecond), End: now,
				Verdict: f.verdict, ClosedBy: f.closedBy, Mode: audit.ModeReplay}
		}
		write("flow/"+string(f.verdict), fl.Event())
	}

	write("scan_detected", audit.Event{Action: audit.ActionScan, Reason: "scan", SourceIP: srcScan.Addr(),
		Start: now.Add(-time.Minute), ScanConnections: new(uint64(40)), ScanPorts: []uint16{29500, 29499, 29400},
		ScanProbes:   []string{"http", "tls", "tcpstore_g0"},
		ScanVerdicts: map[string]uint64{"empty": 31, "blocked": 8, "refused": 1}})

	// Sampling: srcV4 already had its key_too_long; two more are sampled away and summarized at
	// Close, with storeguard.suppressed_by.
	for range 2 {
		write("blocked (sampled away)", audit.ViolationEvent(keyTooLong, true, srcV4, dstV4, audit.ActionBlocked, audit.ModeEnforce, probe, 11))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	take("sampled_summary (Close)")

	// dropped_summary as a Queue writes it: its sink stalled, an event was dropped.
	docs = append(docs, droppedSummary(t, obs)...)

	kinds := map[string]bool{}
	for _, d := range docs {
		kinds[d.m["event.action"].(string)] = true
		if d.m["event.action"] == "sampled_summary" && d.m["storeguard.suppressed_by"] == nil {
			t.Errorf("%s: no storeguard.suppressed_by:\n%s", d.name, d.line)
		}
	}
	for _, a := range allActions {
		if !kinds[string(a)] {
			t.Errorf("the corpus has no %s event", a)
		}
	}
	return docs
}

// allActions is every event.action storeguard writes.
var allActions = []audit.Action{audit.ActionBlocked, audit.ActionWouldBlock, audit.ActionDenied, audit.ActionBanned,
	audit.ActionSampledSummary, audit.ActionDroppedSummary, audit.ActionHandover, audit.ActionFlow, audit.ActionScan}

// stallingSink blocks its first Write until release is closed, and says when it is in it.
type stallingSink struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	entered  chan struct{}
	release  chan struct{}
	blocking bool
}

func (s *stallingSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	first := !s.blocking
	s.blocking = true
	s.mu.Unlock()
	if first {
		close(s.entered)
		<-s.release
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func droppedSummary(t *testing.T, obs *audit.Observer) []doc {
	t.Helper()
	sink := &stallingSink{entered: make(chan struct{}), release: make(chan struct{})}
	q := audit.NewQueue(audit.New(sink, audit.Options{Observer: obs, Clock: func() time.Time { return t0 }}), 1)
	e := audit.Event{Action: audit.ActionDenied, Reason: "max_connections", SourceIP: srcV4.Addr()}
	q.Write(e)
	<-sink.entered
	q.Write(e) // waits in the queue
	if err := q.Write(e); err == nil {
		t.Fatal("Queue: a third event into a queue of one behind a stalled sink was not dropped")
	}
	close(sink.release)
	if err := q.Close(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	var out []doc
	for _, d := range splitLines(t, "dropped_summary (Queue)", sink.buf.Bytes()) {
		if d.m["event.action"] == string(audit.ActionDroppedSummary) {
			out = append(out, d)
		}
	}
	if len(out) != 1 {
		t.Fatalf("Queue wrote %d dropped_summary events, want 1:\n%s", len(out), sink.buf.Bytes())
	}
	return out
}

func splitLines(t *testing.T, name string, b []byte) []doc {
	t.Helper()
	var docs []doc
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := slices.Clone(sc.Bytes())
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("%s: not a JSON object: %v\n%s", name, err, line)
		}
		n := name
		if a, _ := m["event.action"].(string); a != "" && !strings.HasPrefix(name, a) {
			n = name + ": " + a
		}
		docs = append(docs, doc{name: n, line: line, m: m})
	}
	return docs
}

var observers = []struct {
	name string
	o    *audit.Observer
}{
	{"no observer", nil},
	{"serve", &audit.Observer{Hostname: "master-0", Type: "proxy", Version: "v0.9.0", Host: true}},
	{"replay", &audit.Observer{Hostname: "analyst", Type: "sensor", Version: "v0.9.0"}},
}

// TestECSConformance: every field outside storeguard.* is an ECS field of the pinned release,
// its value is of the field's ECS type, and the categorization is ECS's.
func TestECSConformance(t *testing.T) {
	s := loadECS(t)
	if audit.ECSVersion != s.Version {
		t.Errorf("audit.ECSVersion = %s, but testdata/ecs/fields.json is ECS %s (%s)", audit.ECSVersion, s.Version, s.Source.Commit)
	}
	for _, ob := range observers {
		t.Run(ob.name, func(t *testing.T) {
			for _, d := range allKinds(t, ob.o) {
				for _, err := range ecsErrors(s, d.m) {
					t.Errorf("%s: %v\n%s", d.name, err, d.line)
				}
			}
		})
	}
}

// TestOutcomeIsStoreguards: ECS's event.outcome is from the side of whoever wrote the event, and
// ECS's own example of a firewall blocking a connection has it success. A probe storeguard
// blocked, a connection it refused, are its successes; a failure would tell a SIEM that the block
// failed.
func TestOutcomeIsStoreguards(t *testing.T) {
	want := map[string]string{
		"blocked": "success", "would_block": "success", "denied": "success", "banned": "success",
		"flow/passed": "success", "flow/empty": "success", "flow/blocked": "success", "flow/would_block": "success",
		"flow/refused": "success", "flow/truncated": "failure", "flow/open": "unknown", "flow/half_open": "failure",
		"handover/upgrade": "success", "scan_detected": "", "sampled_summary (Close)": "", "dropped_summary (Queue)": "",
		// A refused handshake is also a failed authentication, whose outcome is the authentication's.
		"denied/tls_unknown_ca": "failure", "flow/refused/tls_unknown_ca": "success", "flow/passed (tls)": "success",
	}
	for _, d := range allKinds(t, nil) {
		w, ok := want[d.name]
		if !ok {
			continue
		}
		if got, _ := d.m["event.outcome"].(string); got != w {
			t.Errorf("%s: event.outcome = %q, want %q", d.name, got, w)
		}
		delete(want, d.name)
	}
	for name := range want {
		t.Errorf("the corpus has no %s", name)
	}
}

func ecsErrors(s *ecsSchema, m map[string]any) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	for k, v := range m {
		if strings.HasPrefix(k, "storeguard.") {
			if !customName.MatchString(k) {
				bad("%s: a custom field name should be lower case words joined by . and _", k)
			}
			continue
		}
		f, ok := s.Fields[k]
		if !ok {
			bad("%s is not an ECS %s field (outside storeguard.*; or re-run testdata/ecs/extract.py)", k, s.Version)
			continue
		}
		if err := fitsECSType(f, v); err != nil {
			bad("%s: %v", k, err)
		}
	}
	if v, _ := m["ecs.version"].(string); v != s.Version {
		bad("ecs.version = %q, want %s", m["ecs.version"], s.Version)
	}
	for _, k := range []string{"event.kind", "event.category", "event.type"} {
		if m[k] == nil {
			bad("%s missing", k)
		}
	}
	for _, k := range []string{"event.kind", "event.category", "event.type", "event.outcome"} {
		for _, v := range strs(m[k]) {
			if !s.Fields[k].allowed(v) {
				bad("%s: %q is not an allowed value", k, v)
			}
		}
	}
	// ECS lists the types it expects with each category. An event of several categories (an IDS
	// seeing a connection: [network, intrusion_detection] with [connection, denied], ECS's own
	// example) pairs each type with a category that expects it, and each category with a type.
	cats, types := strs(m["event.category"]), strs(m["event.type"])
	for _, typ := range types {
		if !slices.ContainsFunc(cats, func(c string) bool { return slices.Contains(s.expectedTypes(c), typ) }) {
			bad("event.type %q is expected with none of event.category %v", typ, cats)
		}
	}
	for _, c := range cats {
		if !slices.ContainsFunc(types, func(typ string) bool { return slices.Contains(s.expectedTypes(c), typ) }) {
			bad("event.category %q has none of its expected types %v in event.type %v", c, s.expectedTypes(c), types)
		}
	}
	// event.outcome: "generally not populated for metric events, events with event.type:info";
	// unknown is for an attempt whose result is not known yet, not for no outcome at all.
	if o, set := m["event.outcome"]; set && (m["event.kind"] == "metric" || !slices.ContainsFunc(types, func(t string) bool { return t != "info" })) {
		bad("event.outcome %q on a %s event of type %v: ECS leaves it out there", o, m["event.kind"], types)
	}
	return errs
}

var customName = regexp.MustCompile(`^storeguard(\.[a-z][a-z0-9_]*)+$`)

// fitsECSType says whether v, as decoded from JSON, is a value of f's ECS type.
func fitsECSType(f ecsField, v any) error {
	if slices.Contains(f.Normalize, "array") {
		a, ok := v.([]any)
		if !ok || len(a) == 0 {
			return fmt.Errorf("ECS normalizes it to an array, got %T %v", v, v)
		}
		for _, e := range a {
			if err := fitsScalar(f.Type, e); err != nil {
				return err
			}
		}
		return nil
	}
	return fitsScalar(f.Type, v)
}

func fitsScalar(typ string, v any) error {
	switch typ {
	case "keyword", "constant_keyword", "wildcard", "match_only_text", "text":
		if s, ok := v.(string); ok && s != "" {
			return nil
		}
	case "long":
		if n, ok := v.(json.Number); ok {
			if _, err := n.Int64(); err == nil {
				return nil
			}
		}
	case "date":
		if s, ok := v.(string); ok {
			if _, err := time.Parse(time.RFC3339Nano, s); err == nil {
				return nil
			}
		}
	case "ip":
		if s, ok := v.(string); ok && esIP(s) {
			return nil
		}
	case "boolean":
		if _, ok := v.(bool); ok {
			return nil
		}
	default:
		return fmt.Errorf("ECS type %s: this test has no check for it yet", typ)
	}
	return fmt.Errorf("%s value, got %T %v", typ, v, v)
}

// esIP is whether Elasticsearch's ip type takes s: an IPv4 or IPv6 literal, where an IPv6 one
// may carry a non-empty zone (%veth0), which Elasticsearch and OpenSearch drop.
func esIP(s string) bool {
	if i := strings.IndexByte(s, '%'); i >= 0 {
		if i == len(s)-1 || !strings.Contains(s[:i], ":") {
			return false
		}
		s = s[:i]
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}

func strs(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			s, _ := e.(string)
			out = append(out, s)
		}
		return out
	}
	return nil
}

// TestNoNumberAbove2To53: a JSON number above 2^53 loses digits in JavaScript, jq and any
// float64 reader, so a value that can be that large (a declared length, a limit) is a string.
func TestNoNumberAbove2To53(t *testing.T) {
	maxExact := new(big.Int).Lsh(big.NewInt(1), 53)
	for _, ob := range observers {
		for _, d := range allKinds(t, ob.o) {
			walkNumbers(d.m, "", func(key string, n json.Number) {
				i, ok := new(big.Int).SetString(n.String(), 10)
				if !ok {
					t.Errorf("%s: %s = %s is not an integer", d.name, key, n)
				} else if i.CmpAbs(maxExact) > 0 {
					t.Errorf("%s: %s = %s is above 2^53: write it as a decimal string (audit.BigUint)", d.name, key, n)
				}
			})
		}
	}
	// The corpus does hold such values, as strings.
	docs := everyKind(t, nil)
	for i, want := range []string{"16142589914356121600", "18446744073709551615"} {
		if got := docs[i].m["storeguard.declared"]; got != want {
			t.Errorf("%s: storeguard.declared = %v (%T), want the string %q", docs[i].name, got, got, want)
		}
	}
}

func walkNumbers(v any, key string, f func(string, json.Number)) {
	switch v := v.(type) {
	case json.Number:
		f(key, v)
	case map[string]any:
		for k, e := range v {
			walkNumbers(e, strings.TrimPrefix(key+"."+k, "."), f)
		}
	case []any:
		for i, e := range v {
			walkNumbers(e, fmt.Sprintf("%s[%d]", key, i), f)
		}
	}
}
