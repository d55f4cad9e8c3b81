package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

const chromiumPath = "/usr/bin/chromium"

// writeIncidentLog writes, at path, a morning of serve's audit log through a sampling audit.Writer
// (the first 5 events of a source per 10 minutes, then none; an interim sampled_summary every
// minute): a job of 4 hosts, a scanner (empty, rdp_x224, tls_client_hello and http_get connections,
// 962 GB keys, a scan notice, a ban, refusals), a second one over IPv6 with 2^64-1 B values, a
// client that got two valid messages through before its block, and monitor mode letting HTTP through.
// The policy stage's: monitor mode let a forged rendezvous state through, enforce blocked pickles
// on a framework key, a denied LIST_KEYS and a value of the wrong kind (on a key with HTML in it).
func writeIncidentLog(t *testing.T, path string) {
	t.Helper()
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	now := base
	w, err := audit.Open(path, audit.Options{
		SampleFirst: 5, SampleWindow: 10 * time.Minute, SummaryEvery: time.Minute,
		Observer: &audit.Observer{Hostname: "master-0", Type: "proxy", Version: "test", Host: true},
		Clock:    func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	lastFlush := now
	write := func(at time.Time, e audit.Event) {
		t.Helper()
		now = at
		if now.Sub(lastFlush) >= time.Minute {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			lastFlush = now
		}
		e.Timestamp = at
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	store := netip.MustParseAddrPort("10.20.0.1:29500")
	var conn uint64
	flow := func(src netip.Addr, start, end time.Time, v audit.Verdict, reason string, first []byte, probe string, f func(*audit.Flow)) {
		conn++
		fl := audit.Flow{ConnID: conn, Src: netip.AddrPortFrom(src, uint16(30000+conn%30000)), Dst: store, Start: start, End: end,
			Verdict: v, Reason: reason, Generation: "G3", Mode: audit.ModeEnforce, ClosedBy: audit.ClosedByClient,
			FromClient: uint64(len(first)), First: first}
		if f != nil {
			f(&fl)
		}
		e := fl.Event()
		if e.FirstBytes != nil {
			e.Probe = probe
		}
		write(end, e)
	}
	violation := func(at time.Time, src netip.Addr, a audit.Action, rule protocol.Rule, field string, declared, limit uint64, first []byte, probe string) {
		e := audit.Event{Action: a, Reason: string(rule), SourceIP: src, SourcePort: 30000, DestIP: store.Addr(), DestPort: store.Port(),
			Generation: "G3", Op: "add", FirstBytes: first, Probe: probe, Mode: audit.ModeEnforce, MessageIndex: new(uint64(0))}
		if a == audit.ActionWouldBlock {
			e.Mode = audit.ModeMonitor
		}
		if field != "" {
			e.Field, e.Declared, e.Limit = field, new(audit.BigUint(declared)), new(audit.BigUint(limit))
		}
		write(at, e)
	}
	rdp, _ := hex.DecodeString("0300002a25e00000000000436f6f6b69653a206d737473686173683d6e6d61700d0a0100080003000000")
	tls, _ := hex.DecodeString("16030100f8010000f40303")
	get := []byte("GET / HTTP/1.0\r\n\r\n")

	scanner := netip.MustParseAddr("10.0.0.5")
	for i := range 200 {
		at := base.Add(30*time.Minute + time.Duration(i)*1500*time.Millisecond)
		switch {
		case i%4 == 0 && i < 160:
			flow(scanner, at, at.Add(100*time.Millisecond), audit.VerdictBlocked, "key_too_long", rdp, "rdp_x224", nil)
			violation(at.Add(100*time.Millisecond), scanner, audit.ActionBlocked, protocol.RuleKeyTooLong, "key", 962174058496, 8192, rdp, "rdp_x224")
		case i%10 == 1:
			flow(scanner, at, at.Add(50*time.Millisecond), audit.VerdictBlocked, "unknown_opcode", tls, "tls_client_hello", nil)
			violation(at.Add(50*time.Millisecond), scanner, audit.ActionBlocked, protocol.RuleUnknownOpcode, "", 0, 0, tls, "tls_client_hello")
		case i%10 == 3:
			flow(scanner, at, at.Add(2*time.Second), audit.VerdictTruncated, "truncated_message", get[:5], "http_get", nil)
		default:
			flow(scanner, at, at.Add(10*time.Millisecond), audit.VerdictEmpty, "", nil, "", nil)
		}
		if i == 40 {
			write(at, audit.Event{Action: audit.ActionScan, SourceIP: scanner, Start: base.Add(30 * time.Minute),
				ScanConnections: new(uint64(40)), ScanPorts: []uint16{29500}, ScanProbes: []string{"rdp_x224", "tls_client_hello"},
				ScanVerdicts: map[string]uint64{"empty": 26, "blocked": 14}})
		}
		if i == 120 {
			write(at, audit.Event{Action: audit.ActionBanned, Reason: "violations", SourceIP: scanner})
		}
	}
	for i := range 30 {
		at := base.Add(36*time.Minute + time.Duration(i)*2*time.Second)
		write(at, audit.Event{Action: audit.ActionDenied, Reason: "banned", SourceIP: scanner, SourcePort: 31000})
		flow(scanner, at, at, audit.VerdictRefused, "banned", nil, "", nil)
	}

	v6 := netip.MustParseAddr("2001:db8::66")
	for i := range 50 {
		at := base.Add(70*time.Minute + time.Duration(i)*time.Second)
		if i%5 == 0 {
			first, _ := hex.DecodeString("0200000000000000036b6579ffffffffffffffff")
			flow(v6, at, at.Add(time.Second), audit.VerdictBlocked, "value_too_long", first, "", nil)
			violation(at.Add(time.Second), v6, audit.ActionBlocked, protocol.RuleValueTooLong, "value", 1<<64-1, 8<<20, first, "")
		} else {
			flow(v6, at, at.Add(time.Second), audit.VerdictEmpty, "", nil, "", nil)
		}
	}

	speaker := netip.MustParseAddr("192.0.2.50")
	at := base.Add(80 * time.Minute)
	first, _ := hex.DecodeString("0200000000000000036b6579")
	flow(speaker, at, at.Add(time.Second), audit.VerdictBlocked, "value_too_long", first, "", func(f *audit.Flow) {
		f.FromClient, f.ToStore, f.Messages, f.Replies = 130, 96, 2, 2
		f.Ops = new([32]uint64)
		f.Ops[protocol.OpSet], f.Ops[protocol.OpGet] = 1, 1
	})
	violation(at.Add(time.Second), speaker, audit.ActionBlocked, protocol.RuleValueTooLong, "value", 1<<40, 8<<20, first, "")

	monitor := netip.MustParseAddr("198.51.100.20")
	for i := range 3 {
		at := base.Add(100*time.Minute + time.Duration(i)*time.Minute)
		req := []byte("GET /" + strconv.Itoa(i) + " HTTP/1.1\r\nHost: x\r\n\r\n")
		violation(at, monitor, audit.ActionWouldBlock, protocol.RuleUnknownOpcode, "", 0, 0, req, "http_get")
		flow(monitor, at, at.Add(time.Second), audit.VerdictWouldBlock, "unknown_opcode", req, "http_get", func(f *audit.Flow) {
			f.Mode, f.ToStore = audit.ModeMonitor, uint64(len(req))
		})
	}

	// The policy stage: well-formed messages, as the guard reports them (audit.ViolationEvent).
	policyViolation := func(at time.Time, src netip.Addr, a audit.Action, rule protocol.Rule, op protocol.Op, key, detail, value string) {
		msg, err := protocol.Append(nil, protocol.G3, protocol.Request{Op: op, Key: []byte(key), Value: []byte(value)})
		if err != nil {
			t.Fatal(err)
		}
		mode, verdict, toStore := audit.ModeEnforce, audit.VerdictBlocked, uint64(5)
		if a == audit.ActionWouldBlock {
			mode, verdict, toStore = audit.ModeMonitor, audit.VerdictWouldBlock, uint64(5+len(msg))
		}
		v := &protocol.Violation{Rule: rule, Op: op, Generation: protocol.G3, Offset: 5, Index: 1,
			Key: protocol.ShowKey([]byte(key)), Detail: detail}
		src30 := netip.AddrPortFrom(src, 30000)
		write(at, audit.ViolationEvent(v, true, src30, store, a, mode, msg, uint64(5+len(msg))))
		flow(src, at.Add(-time.Second), at, verdict, string(rule), append([]byte{0x0e, 0, 0, 0, 0}, msg...), "", func(f *audit.Flow) {
			f.Mode, f.FromClient, f.ToStore, f.Messages = mode, uint64(5+len(msg)), toStore, 1
		})
	}
	evil := "Y3Bvc2l4CnN5c3RlbQooUydpZCcKdFIu" // base64 of a pickle that calls posix.system("id")
	policyViolation(base.Add(104*time.Minute), monitor, audit.ActionWouldBlock, protocol.RuleRendezvousStateInvalid, protocol.OpSet,
		"/torch.rendezvous.r1", "imports posix.system: not a torch rendezvous state", evil)
	for i := range 2 {
		policyViolation(base.Add(95*time.Minute+time.Duration(i)*time.Minute), speaker, audit.ActionBlocked, protocol.RulePickleGlobalDenied,
			protocol.OpSet, "/vllm/broadcast/0", "base64 pickle imports posix.system", evil)
	}
	policyViolation(base.Add(75*time.Minute), v6, audit.ActionBlocked, protocol.RulePolicyDenied, protocol.OpGetNumKeys, "",
		"rule no-recon-from-outside: denied", "")
	policyViolation(base.Add(76*time.Minute), v6, audit.ActionBlocked, protocol.RuleValueInvalid, protocol.OpSet,
		`/vllm/<b>meta</b>&"x"`, "rule vllm-json: not json", "{x")

	for h := range 4 {
		job := netip.AddrFrom4([4]byte{10, 20, 0, byte(2 + h)})
		for r := range 2 {
			start := base.Add(time.Duration(h*2+r) * time.Second)
			flow(job, start, base.Add(119*time.Minute+time.Duration(h*2+r)*time.Second), audit.VerdictPassed, "", nil, "", func(f *audit.Flow) {
				f.FromClient, f.ToStore, f.FromStore, f.Messages, f.Replies = 70000, 70000, 9000, 800, 800
				f.Ops = new([32]uint64)
				f.Ops[protocol.OpSet], f.Ops[protocol.OpGet], f.Ops[protocol.OpAdd], f.Ops[protocol.OpWait] = 200, 400, 100, 100
			})
		}
	}
	now = base.Add(2 * time.Hour)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.Suppressed == 0 {
		t.Fatalf("the log has nothing sampled away (%+v): the test wants sampled_summary events", st)
	}
}

// openRE matches the opening tag of an element with a data-figure attribute, as Chromium
// serializes the DOM; its content runs to the next closing tag of its name (the report nests no
// element in one of its own name).
var openRE = regexp.MustCompile(`<([a-zA-Z][a-zA-Z0-9]*)\b([^>]*?\sdata-figure="([^"]*)"[^>]*)>`)

var tagRE = regexp.MustCompile(`<[^>]*>`)

type figure struct {
	name, tag, attrs, text string
}

// figures returns the data-figure elements of a serialized DOM, with their text.
func figures(t *testing.T, dom string) []figure {
	var out []figure
	for _, m := range openRE.FindAllStringSubmatchIndex(dom, -1) {
		tag, attrs, name := dom[m[2]:m[3]], dom[m[4]:m[5]], dom[m[6]:m[7]]
		end := strings.Index(dom[m[1]:], "</"+tag+">")
		if end < 0 {
			t.Fatalf("figure %s: no </%s>", name, tag)
		}
		inner := dom[m[1] : m[1]+end]
		if strings.Contains(inner, "<"+tag) {
			t.Fatalf("figure %s: a %s inside a %s, which the test cannot read", name, tag, tag)
		}
		text := html.UnescapeString(tagRE.ReplaceAllString(inner, ""))
		out = append(out, figure{name: html.UnescapeString(name), tag: tag, attrs: attrs, text: strings.Join(strings.Fields(text), " ")})
	}
	return out
}

// lookup resolves a data-figure name (report.Summary.WriteHTML) in the JSON of the same summary.
func lookup(doc map[string]any, name string) (any, error) {
	coll, rest, ok := strings.Cut(name, ":")
	i := strings.LastIndex(rest, ":")
	if !ok || i < 0 {
		return nil, fmt.Errorf("not COLLECTION:KEY:FIELD")
	}
	key, field := rest[:i], rest[i+1:]
	find := func(list any, attr string) (any, error) {
		items, _ := list.([]any)
		for _, it := range items {
			if m, _ := it.(map[string]any); m != nil && m[attr] == key {
				return m, nil
			}
		}
		return nil, fmt.Errorf("no %s %q", attr, key)
	}
	index := func(list any) (any, error) {
		items, _ := list.([]any)
		n, err := strconv.Atoi(key)
		if err != nil || n < 0 || n >= len(items) {
			return nil, fmt.Errorf("no element %q of %d", key, len(items))
		}
		return items[n], nil
	}
	reached, _ := doc["reached_store"].(map[string]any)
	timeline, _ := doc["timeline"].(map[string]any)
	var obj any
	var err error
	switch coll {
	case "total":
		obj = doc
	case "reached":
		obj = reached
	case "finding":
		obj, err = index(reached["findings"])
	case "source":
		obj, err = find(doc["sources"], "ip")
	case "rule":
		obj, err = find(doc["by_rule"], "key")
	case "probe":
		obj, err = find(doc["probes"], "key")
	case "denial":
		obj, err = find(doc["denials"], "key")
	case "ban":
		obj, err = find(doc["bans"], "key")
	case "op":
		obj, err = find(doc["ops"], "key")
	case "hostile_op":
		obj, err = find(doc["hostile_ops"], "key")
	case "field":
		obj, err = find(doc["fields"], "key")
	case "scan":
		obj, err = index(doc["scans"])
	case "policy":
		policy, _ := doc["policy"].(map[string]any)
		obj = policy
		if key != "" {
			obj, err = index(policy["entries"])
		}
	case "timeline":
		obj = timeline
		if key != "" && key != "all" {
			obj, err = find(timeline["sources"], "ip")
		}
	default:
		return nil, fmt.Errorf("unknown collection %q", coll)
	}
	if err != nil {
		return nil, err
	}
	for _, part := range strings.Split(field, ".") {
		switch o := obj.(type) {
		case map[string]any:
			obj = o[part]
		case []any:
			n, err := strconv.Atoi(part)
			if err != nil || n >= len(o) {
				return nil, fmt.Errorf("no element %q", part)
			}
			obj = o[n]
		case nil:
			return nil, nil // absent: omitted from the JSON
		default:
			return nil, fmt.Errorf("%q of a %T", part, o)
		}
	}
	return obj, nil
}

// same reports whether shown, a figure's text, shows v, its JSON value.
func same(shown string, v any) bool {
	switch v := v.(type) {
	case nil:
		return shown == "-" || shown == "" || shown == "0" || shown == "0 B"
	case json.Number:
		return strings.TrimSuffix(strings.ReplaceAll(shown, ",", ""), " B") == v.String()
	case []any:
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = fmt.Sprint(x)
		}
		return shown == strings.Join(parts, ", ")
	case string:
		if ts, err := time.Parse(time.RFC3339Nano, v); err == nil {
			st, err := time.Parse(time.DateTime, shown)
			return err == nil && st.Equal(ts.Truncate(time.Second))
		}
		if _, err := strconv.ParseUint(v, 10, 64); err == nil { // a BigUint
			return strings.ReplaceAll(shown, ",", "") == v
		}
		return shown == v || v == "" && shown == "-"
	}
	return shown == fmt.Sprint(v)
}

var heightRE = regexp.MustCompile(`\bheight="([0-9.]+)"`)

// TestAuditHTMLInChromium renders `storeguard audit --html` of a real log in headless Chromium and
// checks every figure of the rendered page against `storeguard audit --format json` of the same
// file: the page shows what the JSON says, all of it (each source, rule, probe, finding and bar),
// and nothing else. Set REPORT_SCREENSHOT=FILE.png to keep a screenshot.
func TestAuditHTMLInChromium(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Skipf("%s not installed (apt-get install chromium; scripts/install-deps.sh does): %v", chromiumPath, err)
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "audit.log")
	writeIncidentLog(t, log)

	var jsonOut, errOut bytes.Buffer
	if status := run([]string{"audit", "--top", "0", "--format", "json", log}, &jsonOut, &errOut); status != 0 {
		t.Fatalf("audit --format json: status %d: %s", status, errOut.String())
	}
	page := filepath.Join(dir, "report.html")
	var table bytes.Buffer
	if status := run([]string{"audit", "--top", "0", "--html", page, log}, &table, &errOut); status != 0 {
		t.Fatalf("audit --html: status %d: %s", status, errOut.String())
	}
	raw, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, external := range []string{"<script", " src=", " href=", "url(", "@import"} {
		if bytes.Contains(raw, []byte(external)) {
			t.Errorf("the page is not self-contained: it has %q", external)
		}
	}

	dom := chromium(t, dir, "--dump-dom", "file://"+page)
	if shot := os.Getenv("REPORT_SCREENSHOT"); shot != "" {
		chromium(t, dir, "--window-size=1280,3000", "--screenshot="+shot, "file://"+page)
	}

	dec := json.NewDecoder(&jsonOut)
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	figs := figures(t, dom)
	if want := bytes.Count(raw, []byte(" data-figure=")); len(figs) != want {
		t.Errorf("the rendered DOM has %d figures, the page %d", len(figs), want)
	}
	seen := make(map[string]bool)
	for _, f := range figs {
		seen[f.name] = true
		v, err := lookup(doc, f.name)
		if err != nil {
			t.Errorf("figure %s (%q): %v", f.name, f.text, err)
			continue
		}
		if !same(f.text, v) {
			t.Errorf("figure %s shows %q, the JSON has %v", f.name, f.text, v)
		}
		if f.tag == "rect" { // a bar: drawn when, and only when, its count is not 0
			h := heightRE.FindStringSubmatch(f.attrs)
			height, _ := strconv.ParseFloat(h[1], 64)
			if (height > 0) != (f.text != "0") {
				t.Errorf("bar %s of %s has height %v", f.name, f.text, height)
			}
		}
	}

	// Everything the JSON has that the page must show.
	var want []string
	for _, k := range []string{"events", "suppressed", "connections", "connections_suppressed", "total_sources", "job_sources", "first_seen", "last_seen"} {
		want = append(want, "total::"+k)
	}
	for _, k := range []string{"store_bytes", "would_block", "hostile_sources", "connections"} {
		want = append(want, "reached::"+k)
	}
	reached := doc["reached_store"].(map[string]any)
	for i := range reached["findings"].([]any) {
		want = append(want, fmt.Sprintf("finding:%d:text", i))
	}
	each := func(list any, attr, prefix string, fields ...string) {
		for _, it := range list.([]any) {
			for _, f := range fields {
				want = append(want, fmt.Sprintf("%s:%v:%s", prefix, it.(map[string]any)[attr], f))
			}
		}
	}
	each(doc["sources"], "ip", "source", "role", "connections", "store_bytes", "exact", "first_seen")
	each(doc["by_rule"], "key", "rule", "estimated", "first.first_bytes")
	for _, r := range doc["by_rule"].([]any) {
		if r := r.(map[string]any); r["declared"] != nil {
			want = append(want, fmt.Sprintf("rule:%v:declared", r["key"]))
		}
	}
	each(doc["probes"], "key", "probe", "connections", "events", "first.first_bytes")
	each(doc["denials"], "key", "denial", "events", "connections")
	timeline := doc["timeline"].(map[string]any)
	for i := range timeline["events"].([]any) {
		want = append(want, fmt.Sprintf("timeline:all:events.%d", i), fmt.Sprintf("timeline:all:connections.%d", i))
		for _, row := range timeline["sources"].([]any) {
			want = append(want, fmt.Sprintf("timeline:%v:connections.%d", row.(map[string]any)["ip"], i))
		}
	}
	for i := range doc["scans"].([]any) {
		want = append(want, fmt.Sprintf("scan:%d:connections", i))
	}
	policy := doc["policy"].(map[string]any)
	for _, k := range []string{"events", "would_block", "suppressed", "suppressed_would_block", "other", "other_would_block"} {
		want = append(want, "policy::"+k)
	}
	for i := range policy["entries"].([]any) {
		for _, k := range []string{"action", "rule", "ops", "key", "detail", "events", "sources", "ips", "first_seen", "last_seen"} {
			want = append(want, fmt.Sprintf("policy:%d:%s", i, k))
		}
	}
	for _, r := range doc["by_rule"].([]any) {
		if r := r.(map[string]any); protocol.IsPolicyRule(protocol.Rule(r["key"].(string))) {
			want = append(want, fmt.Sprintf("rule:%v:first.detail", r["key"]), fmt.Sprintf("rule:%v:first.key", r["key"]))
		}
	}
	for _, name := range want {
		if !seen[name] {
			t.Errorf("the page has no figure %s", name)
		}
	}

	// What this log must show at all: the checks above would pass on an empty page of an empty log.
	if reached["verdict"] != "would_block" || !strings.Contains(dom, `data-verdict="would_block"`) {
		t.Errorf("verdict %v: want would_block, in the page too", reached["verdict"])
	}
	if !strings.Contains(dom, "962,174,058,496") || !strings.Contains(dom, "18,446,744,073,709,551,615") {
		t.Error("the page lacks the largest declared key (962,174,058,496) or value (18,446,744,073,709,551,615)")
	}
	// The policy block leads the answer, worst first, the key with HTML in it escaped.
	entries := policy["entries"].([]any)
	if len(entries) != 4 || entries[0].(map[string]any)["action"] != "would_block" ||
		entries[0].(map[string]any)["key"] != "/torch.rendezvous.r1" || !strings.Contains(dom, `data-policy="would_block"`) {
		t.Errorf("policy entries %v: want 4, the rendezvous state let through first, and the page to say so", entries)
	}
	if i, j := strings.Index(dom, `data-policy=`), strings.Index(dom, `data-verdict=`); i < 0 || i > j {
		t.Error("the policy block is not at the top of the answer")
	}
	if strings.Contains(string(raw), "<b>meta</b>") || !strings.Contains(dom, "/vllm/&lt;b&gt;meta&lt;/b&gt;&amp;") {
		t.Error("a key's HTML is not escaped")
	}
	if n := len(doc["sources"].([]any)); n != 8 || len(timeline["sources"].([]any)) != n {
		t.Errorf("%d sources, %d timeline rows; want 8 of each", n, len(timeline["sources"].([]any)))
	}
	if len(figs) < 500 {
		t.Errorf("only %d figures", len(figs))
	}
	if testing.Verbose() {
		t.Logf("%d figures checked; the table of the same log:\n%s", len(figs), table.String())
	}
}

// chromium runs headless Chromium on its own profile under dir and returns its standard output.
func chromium(t *testing.T, dir string, args ...string) string {
	t.Helper()
	profile, err := os.MkdirTemp(dir, "chromium-profile-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromiumPath, append([]string{"--headless", "--no-sandbox", "--disable-gpu",
		"--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
		"--disable-sync", "--user-data-dir=" + profile}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
}
