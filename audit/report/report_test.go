package report

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

// Hosts of the flow scenario.
var (
	jobIP     = netip.MustParseAddr("10.0.0.7")
	openIP    = netip.MustParseAddr("10.0.0.8")
	scannerIP = netip.MustParseAddr("10.0.0.5")
	speakerIP = netip.MustParseAddr("192.0.2.50")
	monitorIP = netip.MustParseAddr("198.51.100.20")
	truncIP   = netip.MustParseAddr("203.0.113.77")
	storeAddr = netip.MustParseAddrPort("10.0.0.1:29500")
)

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// nmap's RDP probe (X.224 connection request), and an HTTP GET.
var (
	rdpProbe  = mustHex("0300002a25e00000000000436f6f6b69653a206d737473686173683d6e6d61700d0a0100080003000000")
	httpProbe = []byte("GET / HTTP/1.0\r\n\r\n")
)

// writeFlowLog writes, at path, the log of serve with flow records, sampling off (the
// sampled_summary is written by hand, so that the log does not depend on sampling's details):
//
//	12:05–13:35  10.0.0.7       job: 4 connections passed; conn 2 also has an interim record (12:40)
//	13:00, 13:20 10.0.0.8       one connection, open: two interim records, no final one
//	12:50        10.0.0.5       scanner: 20 empty, 7 blocked rdp_x224 (key_too_long), 3 blocked http_get
//	                            (unknown_opcode) connections; 4 blocked events; scan notice; banned;
//	                            then 2 denials and 2 refused connections (reason banned);
//	                            sampled_summary: 8 empty connections, 4 key_too_long, 1 unknown_opcode
//	13:10        192.0.2.50     a valid SET and GET (96 B to the store), then a 2^64-1 B value: blocked
//	13:20        198.51.100.20  monitor mode: an http_get let through (would_block, 27 B to the store)
//	13:30        203.0.113.77   5 bytes, then FIN: truncated
func writeFlowLog(t testing.TB, path string) {
	t.Helper()
	w, err := audit.Open(path, audit.Options{Observer: &audit.Observer{Hostname: "master-0", Type: "proxy", Version: "test", Host: true}})
	if err != nil {
		t.Fatal(err)
	}
	write := func(e audit.Event) {
		t.Helper()
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	var conn uint64
	flow := func(src netip.Addr, start, end time.Time, v audit.Verdict, reason string, first []byte, probe string, f func(*audit.Flow)) {
		conn++
		fl := audit.Flow{ConnID: conn, Src: netip.AddrPortFrom(src, uint16(40000+conn)), Dst: storeAddr, Start: start, End: end,
			Verdict: v, Reason: reason, Generation: "G3", Mode: audit.ModeEnforce, ClosedBy: audit.ClosedByClient,
			FromClient: uint64(len(first)), First: first}
		if f != nil {
			f(&fl)
		}
		e := fl.Event()
		if e.FirstBytes != nil {
			e.Probe = probe
		}
		write(e)
	}
	blocked := func(src netip.Addr, ts time.Time, rule protocol.Rule, field, op string, declared, limit uint64, first []byte, probe string) {
		e := audit.Event{Timestamp: ts, Action: audit.ActionBlocked, Reason: string(rule), SourceIP: src, SourcePort: 40000,
			DestIP: storeAddr.Addr(), DestPort: storeAddr.Port(), Generation: "G3", Op: op, FirstBytes: first, Probe: probe, Mode: audit.ModeEnforce}
		if field != "" {
			e.Field, e.Declared, e.Limit = field, new(audit.BigUint(declared)), new(audit.BigUint(limit))
		}
		write(e)
	}
	sec := func(hhmm string, s float64) time.Time { return at(hhmm).Add(time.Duration(s * float64(time.Second))) }

	// The job: ranks that set, get, add and wait.
	for i := range 4 {
		start, end := sec("12:05", float64(i)), sec("13:35", float64(i))
		if i == 1 {
			fl := audit.Flow{ConnID: conn + 1, Src: netip.AddrPortFrom(jobIP, uint16(40000+conn+1)), Dst: storeAddr, Start: start,
				End: at("12:40"), Verdict: audit.VerdictOpen, Generation: "G3", Mode: audit.ModeEnforce, FromClient: 1000, ToStore: 1000, Messages: 10}
			write(fl.Event())
		}
		flow(jobIP, start, end, audit.VerdictPassed, "", nil, "", func(f *audit.Flow) {
			f.FromClient, f.ToStore, f.FromStore, f.Messages, f.Replies = 4096, 4096, 512, 36, 36
			f.Ops = new([32]uint64)
			f.Ops[protocol.OpSet], f.Ops[protocol.OpGet], f.Ops[protocol.OpAdd], f.Ops[protocol.OpWait] = 10, 20, 4, 2
		})
	}
	// A connection that is still open when the log ends: it counts once, by its latest record.
	for i, hhmm := range []string{"13:00", "13:20"} {
		fl := audit.Flow{ConnID: 900, Src: netip.AddrPortFrom(openIP, 41000), Dst: storeAddr, Start: at("12:55"), End: at(hhmm),
			Verdict: audit.VerdictOpen, Generation: "G3", Mode: audit.ModeEnforce, FromClient: uint64(100 * (i + 1)), ToStore: uint64(100 * (i + 1))}
		write(fl.Event())
	}

	// The scanner.
	for i := range 20 {
		flow(scannerIP, sec("12:50", float64(i)), sec("12:50", float64(i)+0.05), audit.VerdictEmpty, "", nil, "", nil)
	}
	for i := range 7 {
		flow(scannerIP, sec("12:50", 20+float64(i)), sec("12:50", 20.1+float64(i)), audit.VerdictBlocked, "key_too_long", rdpProbe, "rdp_x224", nil)
	}
	for i := range 3 {
		flow(scannerIP, sec("12:50", 27+float64(i)), sec("12:50", 27.1+float64(i)), audit.VerdictBlocked, "unknown_opcode", httpProbe, "http_get", nil)
	}
	blocked(scannerIP, sec("12:50", 20.1), protocol.RuleKeyTooLong, "key", "add", 962174058496, 8192, rdpProbe, "rdp_x224")
	blocked(scannerIP, sec("12:50", 21.1), protocol.RuleKeyTooLong, "key", "add", 4294967296, 8192, rdpProbe, "rdp_x224")
	blocked(scannerIP, sec("12:50", 22.1), protocol.RuleKeyTooLong, "key", "add", 962174058496, 8192, rdpProbe, "rdp_x224")
	write(audit.Event{Timestamp: sec("12:50", 27.1), Action: audit.ActionBlocked, Reason: "unknown_opcode", SourceIP: scannerIP,
		Generation: "G3", Op: "invalid", FirstBytes: httpProbe, Probe: "http_get", Mode: audit.ModeEnforce})
	write(audit.Event{Timestamp: sec("12:50", 30), Start: at("12:50"), Action: audit.ActionScan, SourceIP: scannerIP,
		ScanConnections: new(uint64(30)), ScanPorts: []uint16{29500}, ScanProbes: []string{"rdp_x224", "http_get"},
		ScanVerdicts: map[string]uint64{"empty": 20, "blocked": 10}})
	write(audit.Event{Timestamp: at("12:51"), Action: audit.ActionBanned, Reason: "violations", SourceIP: scannerIP})
	for i := range 2 {
		write(audit.Event{Timestamp: sec("12:52", float64(i)), Action: audit.ActionDenied, Reason: "banned", SourceIP: scannerIP})
		flow(scannerIP, sec("12:52", float64(i)), sec("12:52", float64(i)), audit.VerdictRefused, "banned", nil, "", nil)
	}
	write(audit.Event{Timestamp: sec("12:59", 59), Start: at("12:50"), Action: audit.ActionSampledSummary, SourceIP: scannerIP, Suppressed: 13,
		SuppressedBy: map[string]uint64{"flow/empty": 8, "blocked/key_too_long": 4, "blocked/unknown_opcode": 1}})

	// A client that speaks TCPStore: two valid messages reach the store, then its value is blocked.
	flow(speakerIP, at("13:10"), sec("13:10", 1), audit.VerdictBlocked, "value_too_long", mustHex("0200000000000000036b6579"), "", func(f *audit.Flow) {
		f.FromClient, f.ToStore, f.FromStore, f.Messages, f.Replies = 130, 96, 17, 2, 2
		f.Ops = new([32]uint64)
		f.Ops[protocol.OpSet], f.Ops[protocol.OpGet] = 1, 1
	})
	blocked(speakerIP, sec("13:10", 1), protocol.RuleValueTooLong, "value", "set", 1<<64-1, 8<<20, mustHex("0100000000000000036b6579"), "")

	// Monitor mode lets an HTTP request through.
	mon := []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	write(audit.Event{Timestamp: at("13:20"), Action: audit.ActionWouldBlock, Reason: "unknown_opcode", SourceIP: monitorIP,
		Generation: "G3", Op: "invalid", FirstBytes: mon, Probe: "http_get", Mode: audit.ModeMonitor})
	flow(monitorIP, at("13:20"), sec("13:20", 2), audit.VerdictWouldBlock, "unknown_opcode", mon, "http_get", func(f *audit.Flow) {
		f.Mode, f.ToStore = audit.ModeMonitor, uint64(len(mon))
	})

	// A few bytes, then FIN.
	flow(truncIP, at("13:30"), sec("13:30", 1), audit.VerdictTruncated, "truncated_message", []byte{0x02, 0, 0, 0, 0}, "", nil)
	blocked(truncIP, sec("13:30", 1), protocol.RuleTruncatedMessage, "", "set", 0, 0, []byte{0x02, 0, 0, 0, 0}, "")

	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func sourceOf(t *testing.T, s Summary, ip netip.Addr) SourceStats {
	t.Helper()
	for _, st := range s.Sources {
		if st.IP == ip {
			return st
		}
	}
	t.Fatalf("no source %v in %v", ip, s.Sources)
	return SourceStats{}
}

// TestReport reads the flow scenario: who (roles), with what (rules apart from denials, probes,
// largest declared), and whether anything reached the store.
func TestReport(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flows.log")
	writeFlowLog(t, path)
	s, err := Summarize([]string{path}, Filter{})
	if err != nil {
		t.Fatal(err)
	}

	if s.Events != 11 || s.Suppressed != 5 || s.Connections != 40 || s.ConnectionsSuppressed != 8 {
		t.Errorf("events %d+%d connections %d+%d, want 11+5 and 40+8", s.Events, s.Suppressed, s.Connections, s.ConnectionsSuppressed)
	}
	roles := map[netip.Addr]string{jobIP: RoleJob, openIP: RoleUnknown, scannerIP: RoleHostile, speakerIP: RoleHostile,
		monitorIP: RoleHostile, truncIP: RoleHostile}
	for ip, role := range roles {
		if got := sourceOf(t, s, ip).Role; got != role {
			t.Errorf("%v: role %s, want %s", ip, got, role)
		}
	}
	if s.JobSources != 1 || s.HostileSources != 4 || s.TotalSources != 6 {
		t.Errorf("sources %d: %d job, %d hostile; want 6: 1, 4", s.TotalSources, s.JobSources, s.HostileSources)
	}
	if s.Sources[len(s.Sources)-1].IP != jobIP {
		t.Errorf("a job source ranks last: %v", s.Sources)
	}

	// The job's interim record counted once; the open connection counted once, as open.
	job := sourceOf(t, s, jobIP)
	if job.Connections != 4 || job.ByVerdict["passed"] != 4 || job.ByVerdict["open"] != 0 {
		t.Errorf("job: %d connections %v, want 4 passed", job.Connections, job.ByVerdict)
	}
	if o := sourceOf(t, s, openIP); o.Connections != 1 || o.ByVerdict["open"] != 1 {
		t.Errorf("open connection: %d %v, want 1 open", o.Connections, o.ByVerdict)
	}

	scanner := sourceOf(t, s, scannerIP)
	want := map[string]uint64{"empty": 28, "blocked": 10, "refused": 2}
	if scanner.Connections != 32 || scanner.ConnectionsSuppressed != 8 || !equalMaps(scanner.ByVerdict, want) {
		t.Errorf("scanner: %d+%d connections %v, want 32+8 %v", scanner.Connections, scanner.ConnectionsSuppressed, scanner.ByVerdict, want)
	}
	if scanner.Reached != ReachedNothing || scanner.StoreBytes != 0 || scanner.Estimated != 13 {
		t.Errorf("scanner: reached %s, %d B, %d events; want nothing, 0 B, 13", scanner.Reached, scanner.StoreBytes, scanner.Estimated)
	}
	if sp := sourceOf(t, s, speakerIP); sp.Reached != ReachedForwarded || sp.StoreBytes != 96 || sp.Messages != 2 {
		t.Errorf("speaker: %s %d B %d messages, want forwarded 96 B 2", sp.Reached, sp.StoreBytes, sp.Messages)
	}
	if m := sourceOf(t, s, monitorIP); m.Reached != ReachedWouldBlock || m.WouldBlock != 1 {
		t.Errorf("monitor: %s, %d would_block", m.Reached, m.WouldBlock)
	}

	r := s.Reached
	if r.Verdict != ReachedWouldBlock || r.HostileSources != 4 || r.StoreBytes != 96+27 || r.WouldBlock != 1 {
		t.Errorf("reached %+v", r)
	}
	texts := make([]string, len(r.Findings))
	for i, f := range r.Findings {
		texts[i] = f.Text
	}
	for _, want := range []string{
		"YES, IN MONITOR MODE: 1 hostile message from 198.51.100.20 reached the store (monitor mode: unknown_opcode 1); 27 B forwarded in 1 connection",
		"96 B from 192.0.2.50 reached the store in 1 of 1 connection (2 messages: get 1, set 1)",
		"nothing from 10.0.0.5 reached the store (0 B forwarded in 32 connections)",
		"nothing from 203.0.113.77 reached the store (0 B forwarded in 1 connection)",
	} {
		if !slices.Contains(texts, want) {
			t.Errorf("no finding %q in\n%s", want, strings.Join(texts, "\n"))
		}
	}

	// Rules are the decoder's: a denial's reason (banned) is not one, nor is a ban's.
	var rules []string
	for _, rs := range s.ByRule {
		rules = append(rules, rs.Key)
	}
	if want := []string{"key_too_long", "unknown_opcode", "truncated_message", "value_too_long"}; !slices.Equal(rules, want) {
		t.Errorf("rules %v, want %v", rules, want)
	}
	kl := s.ByRule[0]
	if kl.Estimated != 7 || kl.Declared == nil || *kl.Declared != 962174058496 || kl.declaredText() != "key declared 962,174,058,496 B > 8,192" ||
		!bytes.Equal(kl.First.FirstBytes, rdpProbe[:audit.MaxFirstBytes]) || kl.First.Probe != "rdp_x224" {
		t.Errorf("key_too_long: %+v (%s)", kl, kl.declaredText())
	}
	for _, rs := range s.ByRule {
		if rs.Key == "value_too_long" && rs.declaredText() != "value declared 18,446,744,073,709,551,615 B > 8,388,608" {
			t.Errorf("value_too_long: %s", rs.declaredText())
		}
	}
	if len(s.Denials) != 1 || s.Denials[0] != (ReasonStats{Key: "banned", Events: 2, Connections: 2, Sources: 1}) {
		t.Errorf("denials %+v, want banned: 2 events, 2 connections", s.Denials)
	}
	if len(s.Bans) != 1 || s.Bans[0].Key != "violations" {
		t.Errorf("bans %+v", s.Bans)
	}
	var probes []string
	for _, p := range s.Probes {
		probes = append(probes, p.Key)
	}
	if !slices.Equal(probes, []string{"rdp_x224", "http_get"}) || s.Probes[0].Connections != 7 || s.Probes[0].Events != 3 {
		t.Errorf("probes %+v", s.Probes)
	}
	if s.TotalScans != 1 || s.Scans[0].Connections != 30 || s.Scans[0].IP != scannerIP {
		t.Errorf("scans %+v", s.Scans)
	}

	// The timeline holds every written event and connection, once.
	if got := sum(s.Timeline.Events); got != s.Events {
		t.Errorf("timeline events %d, want %d", got, s.Events)
	}
	if got := sum(s.Timeline.Connections); got != s.Connections {
		t.Errorf("timeline connections %d, want %d", got, s.Connections)
	}
	if s.Timeline.BucketSeconds != 300 || !s.Timeline.Start.Equal(at("12:05")) {
		t.Errorf("timeline from %v by %ds, want 12:05 by 300s", s.Timeline.Start, s.Timeline.BucketSeconds)
	}
	for _, row := range s.Timeline.Sources {
		st := sourceOf(t, s, row.IP)
		if sum(row.Events) != st.Exact || sum(row.Connections) != st.Connections {
			t.Errorf("%v: timeline %d events %d connections, want %d %d", row.IP, sum(row.Events), sum(row.Connections), st.Exact, st.Connections)
		}
	}

	// A Rule filter: the rule's events and connections, and its share of the summaries.
	kls, err := Summarize([]string{path}, Filter{Rule: "key_too_long"})
	if err != nil {
		t.Fatal(err)
	}
	if kls.Events != 3 || kls.Suppressed != 4 || kls.Connections != 7 || kls.TotalSources != 1 {
		t.Errorf("--rule key_too_long: %d+%d events, %d connections, %d sources; want 3+4, 7, 1",
			kls.Events, kls.Suppressed, kls.Connections, kls.TotalSources)
	}
}

func equalMaps(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestReportTop: the findings name every source that let anything through, and of the others the
// first two listed; the rest are summed up in one line.
func TestReportTop(t *testing.T) {
	z := NewSummarizer(Filter{})
	base := at("12:00")
	for i := range 20 {
		ip := netip.AddrFrom4([4]byte{10, 9, 0, byte(i + 1)})
		e := (&audit.Flow{ConnID: uint64(i + 1), Src: netip.AddrPortFrom(ip, 40000), Dst: storeAddr, Start: base, End: base.Add(time.Second),
			Verdict: audit.VerdictEmpty}).Event()
		for range i + 1 {
			z.Add(e)
		}
	}
	leak := (&audit.Flow{ConnID: 99, Src: netip.MustParseAddrPort("10.9.1.1:40000"), Dst: storeAddr, Start: base, End: base.Add(time.Second),
		Verdict: audit.VerdictBlocked, Reason: "key_too_long", ToStore: 40, Messages: 1}).Event()
	z.Add(leak)
	s := z.Summary().Top(3)
	if len(s.Sources) != 3 || s.TotalSources != 21 {
		t.Fatalf("top 3 of 21: %d of %d", len(s.Sources), s.TotalSources)
	}
	var texts []string
	for _, f := range s.Reached.Findings {
		texts = append(texts, f.Text)
	}
	want := []string{
		"YES: 40 B from 10.9.1.1 reached the store in 1 of 1 connection (1 message)",
		"nothing from 10.9.0.20 reached the store (0 B forwarded in 20 connections)",
		"nothing from 10.9.0.19 reached the store (0 B forwarded in 19 connections)",
		"nothing from the 18 other hostile sources reached the store (0 B forwarded in 171 connections)",
	}
	if !slices.Equal(texts, want) {
		t.Errorf("findings\n%s\nwant\n%s", strings.Join(texts, "\n"), strings.Join(want, "\n"))
	}
}

// TestTableFitsOneScreen: a day of a large fleet under scan fits about 50 lines of 100 columns.
func TestTableFitsOneScreen(t *testing.T) {
	z := NewSummarizer(Filter{})
	base := at("00:00")
	rules := []string{"key_too_long", "value_too_long", "unknown_opcode", "validate_missing", "zero_count", "too_many_keys", "message_timeout"}
	probes := []string{"rdp_x224", "http_get", "tls_client_hello", "ssh_banner", "smb_negotiate", "sip_options", "redis_ping"}
	for i := range 200 {
		ip := netip.AddrFrom4([4]byte{172, 16, byte(i / 250), byte(i%250 + 1)})
		ts := base.Add(time.Duration(i) * 7 * time.Minute)
		for j := range 5 {
			e := (&audit.Flow{ConnID: uint64(i*10 + j), Src: netip.AddrPortFrom(ip, 40000), Dst: storeAddr, Start: ts, End: ts.Add(time.Second),
				Verdict: audit.VerdictBlocked, Reason: rules[i%len(rules)], First: rdpProbe}).Event()
			e.Probe = probes[(i+j)%len(probes)]
			z.Add(e)
			z.Add(audit.Event{Timestamp: ts, Action: audit.ActionBlocked, Reason: rules[i%len(rules)], SourceIP: ip, Field: "key",
				Declared: new(audit.BigUint(1 << 60)), Limit: new(audit.BigUint(8192)), FirstBytes: rdpProbe, Probe: e.Probe})
		}
		if i%10 == 0 {
			z.Add(audit.Event{Timestamp: ts, Action: audit.ActionScan, SourceIP: ip, ScanConnections: new(uint64(5)), ScanPorts: []uint16{29500},
				ScanProbes: probes[:3], ScanVerdicts: map[string]uint64{"blocked": 5}})
			z.Add(audit.Event{Timestamp: ts, Action: audit.ActionDenied, Reason: "per_source_connections", SourceIP: ip})
			z.Add(audit.Event{Timestamp: ts, Action: audit.ActionBanned, Reason: "violations", SourceIP: ip})
		}
	}
	for i := range 64 {
		ip := netip.AddrFrom4([4]byte{10, 1, 0, byte(i + 1)})
		z.Add((&audit.Flow{ConnID: uint64(5000 + i), Src: netip.AddrPortFrom(ip, 40000), Dst: storeAddr, Start: base, End: base.Add(23 * time.Hour),
			Verdict: audit.VerdictPassed, ToStore: 1 << 20, Messages: 100}).Event())
	}
	z.Add(audit.Event{Timestamp: base.Add(time.Hour), Action: audit.ActionWouldBlock, Reason: "key_too_long", SourceIP: netip.MustParseAddr("2001:db8:ffff:ffff:ffff:ffff:ffff:fff1")})
	z.Read("torn.log", strings.NewReader(strings.Repeat("{\n", 40)))
	var out bytes.Buffer
	if err := z.Summary().Top(8).Write(&out, "table"); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	for i, l := range lines {
		if n := utf8.RuneCountInString(l); n > 100 {
			t.Errorf("line %d has %d columns: %s", i+1, n, l)
		}
	}
	if len(lines) > 50 {
		t.Errorf("%d lines, want at most 50:\n%s", len(lines), out.String())
	}
	if testing.Verbose() {
		t.Logf("\n%s", out.String())
	}
}

// TestTimelineSteps: the bucket grows with the span, and counts add up at every step.
func TestTimelineSteps(t *testing.T) {
	for _, tt := range []struct {
		span time.Duration
		step int64
	}{
		{30 * time.Second, 1}, {59 * time.Second, 1}, {4 * time.Minute, 5}, {50 * time.Minute, 60},
		{9 * time.Hour, 600}, {20 * time.Hour, 1800}, {6 * 24 * time.Hour, 3 * 3600}, {400 * 24 * time.Hour, 7 * 86400},
	} {
		z := NewSummarizer(Filter{})
		base := at("00:00")
		const n = 1000
		for i := range n {
			ts := base.Add(time.Duration(int64(tt.span) * int64(i) / (n - 1)))
			z.Add(audit.Event{Timestamp: ts, Action: audit.ActionBlocked, Reason: "key_too_long", SourceIP: scannerIP})
		}
		tl := z.Summary().Timeline
		if tl.BucketSeconds != tt.step || sum(tl.Events) != n || len(tl.Sources) != 1 || sum(tl.Sources[0].Events) != n {
			t.Errorf("span %v: step %ds, %d events in %d buckets; want step %ds, %d", tt.span, tl.BucketSeconds, sum(tl.Events),
				len(tl.Events), tt.step, n)
		}
		if tt.step < 7*86400 && len(tl.Events) > TimelineColumns {
			t.Errorf("span %v: %d buckets", tt.span, len(tl.Events))
		}
	}
}

// TestHTMLSelfContained: the page of an empty log and of the flow scenario renders, names every
// source and rule, and loads nothing from outside (TestAuditHTMLInChromium in cmd/storeguard checks
// its figures in a browser).
func TestHTMLSelfContained(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flows.log")
	writeFlowLog(t, path)
	s, err := Summarize([]string{path}, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for name, sum := range map[string]Summary{"empty": NewSummarizer(Filter{}).Summary(), "flows": s.Top(0)} {
		var out bytes.Buffer
		if err := sum.WriteHTML(&out); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		page := out.String()
		for _, external := range []string{"<script", " src=", " href=", "url(", "@import"} {
			if strings.Contains(page, external) {
				t.Errorf("%s: the page has %q", name, external)
			}
		}
		for _, src := range sum.Sources {
			if !strings.Contains(page, `data-figure="source:`+src.IP.String()+`:connections"`) {
				t.Errorf("%s: no connections figure of %v", name, src.IP)
			}
		}
		for _, r := range sum.ByRule {
			if !strings.Contains(page, `data-figure="rule:`+r.Key+`:estimated"`) {
				t.Errorf("%s: no figure of rule %s", name, r.Key)
			}
		}
	}
}
