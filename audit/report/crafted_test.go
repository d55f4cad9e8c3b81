package report

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/probename"
	"github.com/storeguard/storeguard/protocol"
)

// Strings an attacker who can write a log line puts where storeguard writes names and text: a
// window title (OSC 0), a screen clear, a hyperlink (OSC 8), a C1 CSI, a bidi override, DEL and
// CR, and a spreadsheet formula behind each character that starts one.
const (
	termCodes = "\x1b]0;owned\x07\x1b[2J\x1b[H\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\\u009b31m\u202e\x7f\r"
	formula   = "=cmd|' /C calc'!A0"
)

// hostile returns the attacker's strings, each starting differently, labelled by n.
func hostile(n string) []string {
	return []string{termCodes + n, formula + n, "+" + formula + n, "-" + formula + n, "@SUM(1)" + n,
		"\t" + formula + n, "\r" + formula + n, n + termCodes}
}

// writeCraftedLog writes a log whose every string field an attacker controls carries hostile
// strings: each action (and one storeguard never writes) with its reason, op, field, probe, key,
// detail, verdict, ops, scan probes and verdicts, sampled kinds, source zone, observer, generation,
// mode and closed_by; a malformed line too.
func writeCraftedLog(t *testing.T, path string) {
	t.Helper()
	var b bytes.Buffer
	line := func(e map[string]any) {
		j, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	for i, s := range hostile("") {
		zone := "fe80::1%" + s
		src := []string{"192.0.2.66", zone, "2001:db8::66"}[i%3]
		base := func(action string) map[string]any {
			return map[string]any{"@timestamp": "2025-03-01T12:0" + string(rune('0'+i)) + ":00Z", "event.action": action,
				"event.reason": s, "source.ip": src, "source.port": 40000 + i, "storeguard.op": s, "storeguard.field": s,
				"storeguard.probe": s, "storeguard.key": s, "storeguard.detail": s, "storeguard.first_bytes": "0300000b06e0",
				"storeguard.generation": s, "storeguard.mode": s, "observer.hostname": s, "host.name": s,
				"storeguard.declared": "962174058496", "storeguard.limit": "8192"}
		}
		for _, action := range []string{"blocked", "would_block", "denied", "banned", s} {
			line(base(action))
		}
		for _, rule := range []protocol.Rule{protocol.RulePickleGlobalDenied, protocol.RuleKeyWriteOnce} {
			e := base("would_block")
			e["event.reason"] = string(rule)
			line(e)
		}
		for _, verdict := range []string{"blocked", "would_block", "refused", "empty", "truncated", "open", "passed", s} {
			e := base("flow")
			e["storeguard.verdict"], e["storeguard.closed_by"] = verdict, s
			e["event.start"] = e["@timestamp"]
			e["storeguard.ops"] = map[string]uint64{s: 2, "set": 1}
			e["storeguard.store_bytes"], e["storeguard.messages"], e["storeguard.conn_id"] = 30+i, 3, 100+i
			line(e)
		}
		scan := base("scan_detected")
		scan["storeguard.scan.probes"] = []string{s, "rdp_x224", s + "x"}
		scan["storeguard.scan.verdicts"] = map[string]uint64{s: 3, "empty": 5}
		scan["storeguard.scan.connections"] = 8
		line(scan)
		sum := base("sampled_summary")
		sum["storeguard.suppressed"] = 9
		sum["storeguard.suppressed_by"] = map[string]uint64{"blocked/" + s: 2, s + "/key_too_long": 3, "flow/" + s: 4}
		line(sum)
		line(base("handover"))
		b.WriteString(`{"@timestamp":"2025-03-01T12:00:00Z","event.action":` + s + "\n") // malformed
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// badRunes counts the runes of out a terminal acts on or shows other than as text: C0 but the line
// feed, DEL, C1, Unicode format characters (bidi overrides, zero widths), invalid UTF-8.
func badRunes(out string) map[string]int {
	bad := map[string]int{}
	for _, r := range out {
		switch {
		case r == '\n':
		case r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f || unicode.Is(unicode.Cf, r):
			bad[string(r)]++
		case r == utf8.RuneError:
			bad["invalid UTF-8"]++
		}
	}
	return bad
}

// TestCraftedLog: a log whose every attacker-controlled string carries escape sequences and
// formulas. The table shows no control byte, the CSV no formula cell, no format a control
// character, and in every format the names storeguard never writes are "other".
func TestCraftedLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "crafted.log")
	writeCraftedLog(t, path)
	raw, _ := os.ReadFile(path)
	var decoded strings.Builder
	for e := range audit.Events(bytes.NewReader(raw)) {
		decoded.WriteString(e.Reason + e.Key + e.Probe + e.SourceIP.Zone())
	}
	if n := strings.Count(decoded.String(), "\x1b"); n < 100 { // the control: the file does carry them
		t.Fatalf("the crafted log decodes to %d ESC bytes", n)
	}

	s, err := Summarize([]string{path}, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, top := range []int{8, 0} {
		var table, csvOut, jsonOut, html bytes.Buffer
		for format, out := range map[string]*bytes.Buffer{"table": &table, "csv": &csvOut, "json": &jsonOut} {
			if err := s.Top(top).Write(out, format); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Top(top).WriteHTML(&html); err != nil {
			t.Fatal(err)
		}
		if bad := badRunes(table.String()); len(bad) > 0 {
			t.Errorf("--top %d: the table prints control characters %v:\n%s", top, bad, table.String())
		}
		for format, out := range map[string]*bytes.Buffer{"json": &jsonOut, "html": &html} {
			if bad := badRunes(out.String()); len(bad) > 0 {
				t.Errorf("--top %d: the %s report holds control characters %v", top, format, bad)
			}
		}
		if !strings.Contains(table.String(), `\x1b]0;owned\x07`) {
			t.Errorf("--top %d: the table does not show the escaped key:\n%s", top, table.String())
		}
		records, err := csv.NewReader(&csvOut).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range records {
			for _, cell := range rec {
				if cell != "" && strings.ContainsRune("=+-@\t\r", rune(cell[0])) {
					t.Errorf("--top %d: formula cell %q in CSV row %q", top, cell, rec)
				}
				if bad := badRunes(cell); len(bad) > 0 {
					t.Errorf("--top %d: CSV cell %q holds control characters %v", top, cell, bad)
				}
			}
		}
		var got Summary
		if err := json.Unmarshal(jsonOut.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		checkNames(t, got)
	}
}

// checkNames: every name of s is one storeguard writes, or "other".
func checkNames(t *testing.T, s Summary) {
	t.Helper()
	check := func(what, name string, ok bool) {
		if !ok && name != OtherName {
			t.Errorf("%s %q in the report", what, name)
		}
	}
	for _, r := range s.ByRule {
		check("rule", r.Key, protocol.IsRule(r.Key))
		check("probe", r.First.Probe, r.First.Probe == "" || probename.Known(r.First.Probe))
	}
	for _, p := range s.Probes {
		check("probe", p.Key, probename.Known(p.Key))
	}
	for _, c := range slices.Concat(s.Ops, s.HostileOps) {
		check("op", c.Key, ops[c.Key])
	}
	for _, c := range s.ByAction {
		check("action", c.Key, actions[c.Key])
	}
	for _, c := range s.ByVerdict {
		check("verdict", c.Key, verdicts[c.Key])
	}
	for _, c := range s.Fields {
		check("field", c.Key, knownWord(c.Key) == c.Key)
	}
	for _, r := range slices.Concat(s.Denials, s.Bans) {
		check("reason", r.Key, knownWord(r.Key) == r.Key)
	}
	for _, p := range s.Policy.Entries {
		check("policy rule", p.Rule, protocol.IsRule(p.Rule))
	}
	for _, sc := range s.Scans {
		for _, p := range sc.Probes {
			check("scan probe", p, probename.Known(p))
		}
	}
	if len(s.ByRule) == 0 || len(s.Probes) == 0 || len(s.Scans) == 0 || len(s.Policy.Entries) == 0 || s.Malformed == 0 {
		t.Errorf("the crafted log left sections empty: %d rules, %d probes, %d scans, %d policy entries, %d malformed",
			len(s.ByRule), len(s.Probes), len(s.Scans), len(s.Policy.Entries), s.Malformed)
	}
}
