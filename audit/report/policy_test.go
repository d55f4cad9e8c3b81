package report

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

// evilPickle is base64 of a protocol 0 pickle that calls posix.system("id"): what a hijack of
// torchrun's rendezvous state, or of a framework's pickled key, writes.
const evilPickle = "Y3Bvc2l4CnN5c3RlbQooUydpZCcKdFIu"

// policyViolation is one policy finding as serve writes it: audit.ViolationEvent of the guard's
// violation, in enforce (blocked) or monitor mode (would_block), with the message's first bytes.
type policyViolation struct {
	at     time.Time
	src    netip.Addr
	rule   protocol.Rule
	op     protocol.Op
	key    string // raw, as the client sent it: ShowKey escapes it, as the guard does
	detail string
	value  string
	action audit.Action
}

// validateBytes is the size of a G3 VALIDATE, the message before pv's on its connection.
const validateBytes = 5

func (pv policyViolation) message(t testing.TB) []byte {
	t.Helper()
	msg, err := protocol.Append(nil, protocol.G3, protocol.Request{Op: pv.op, Key: []byte(pv.key), Value: []byte(pv.value)})
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func (pv policyViolation) event(t testing.TB) audit.Event {
	t.Helper()
	msg := pv.message(t)
	mode := audit.ModeEnforce
	if pv.action == audit.ActionWouldBlock {
		mode = audit.ModeMonitor
	}
	v := &protocol.Violation{Rule: pv.rule, Op: pv.op, Generation: protocol.G3, Field: protocol.FieldValue,
		Declared: uint64(len(pv.value)), Offset: validateBytes, Index: 1, Key: protocol.ShowKey([]byte(pv.key)), Detail: pv.detail}
	e := audit.ViolationEvent(v, true, netip.AddrPortFrom(pv.src, 41000), storeAddr, pv.action, mode, msg, validateBytes+uint64(len(msg)))
	e.Timestamp = pv.at
	return e
}

// flow is the record of the connection that sent pv: a VALIDATE passed, then pv's message,
// forwarded in monitor mode (the connection goes on, and ends) and not in enforce.
func (pv policyViolation) flow(t testing.TB, conn uint64) audit.Event {
	msg := pv.message(t)
	fl := audit.Flow{ConnID: conn, Src: netip.AddrPortFrom(pv.src, 41000), Dst: storeAddr, Start: pv.at.Add(-time.Second), End: pv.at,
		Verdict: audit.VerdictBlocked, Reason: string(pv.rule), Generation: "G3", Mode: audit.ModeEnforce, ClosedBy: audit.ClosedByGuard,
		FromClient: validateBytes + uint64(len(msg)), ToStore: validateBytes, Messages: 1, Replies: 1, Ops: new([32]uint64),
		First: append(mustHex("0e00000000"), msg...)}
	fl.Ops[protocol.OpValidate] = 1
	if pv.action == audit.ActionWouldBlock {
		fl.Verdict, fl.Mode, fl.ClosedBy = audit.VerdictWouldBlock, audit.ModeMonitor, audit.ClosedByClient
		fl.ToStore, fl.Messages, fl.Replies = fl.FromClient, 2, 2
		fl.Ops[pv.op] = 1
	}
	return fl.Event()
}

// writePolicyLog writes pvs, each with its connection's flow record, through the real writer
// (serve's options: an observer, sampling off), after a job's two connections that passed.
func writePolicyLog(t testing.TB, path string, pvs ...policyViolation) {
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
	for i := range 2 {
		write((&audit.Flow{ConnID: uint64(i + 1), Src: netip.AddrPortFrom(jobIP, uint16(40000+i)), Dst: storeAddr,
			Start: at("12:00"), End: at("13:00"), Verdict: audit.VerdictPassed, Generation: "G3", Mode: audit.ModeEnforce,
			ClosedBy: audit.ClosedByClient, FromClient: 9000, ToStore: 9000, FromStore: 700, Messages: 120, Replies: 120}).Event())
	}
	for i, pv := range pvs {
		write(pv.event(t))
		write(pv.flow(t, uint64(100+i)))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// hijack is the torchrun hijack of issue 24 in both modes: monitor mode let a forged rendezvous
// state through, enforce blocked two pickles on a framework key.
func hijack() []policyViolation {
	return []policyViolation{
		{at: at("12:10"), src: scannerIP, rule: protocol.RuleRendezvousStateInvalid, op: protocol.OpSet, key: "/torch.rendezvous.r1",
			detail: "imports posix.system: not a torch rendezvous state", value: evilPickle, action: audit.ActionWouldBlock},
		{at: at("12:40"), src: scannerIP, rule: protocol.RulePickleGlobalDenied, op: protocol.OpSet, key: "/vllm/broadcast/0",
			detail: "base64 pickle imports posix.system", value: evilPickle, action: audit.ActionBlocked},
		{at: at("12:41"), src: scannerIP, rule: protocol.RulePickleGlobalDenied, op: protocol.OpSet, key: "/vllm/broadcast/0",
			detail: "base64 pickle imports posix.system", value: evilPickle, action: audit.ActionBlocked},
	}
}

func summarizePolicy(t *testing.T, pvs ...policyViolation) Summary {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	writePolicyLog(t, path, pvs...)
	s, err := Summarize([]string{path}, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func render(t *testing.T, s Summary, format string) string {
	t.Helper()
	var out bytes.Buffer
	var err error
	if format == "html" {
		err = s.WriteHTML(&out)
	} else {
		err = s.Write(&out, format)
	}
	if err != nil {
		t.Fatalf("%s: %v", format, err)
	}
	return out.String()
}

// answer is the table's lines under DID ANYTHING GET THROUGH?, wrapped lines joined.
func answer(t *testing.T, table string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(table, "DID ANYTHING GET THROUGH?\n")
	if !ok {
		t.Fatalf("no DID ANYTHING GET THROUGH? in\n%s", table)
	}
	var lines []string
	for l := range strings.Lines(rest) {
		l = strings.TrimRight(l, "\n")
		switch {
		case l == "":
			return lines
		case strings.HasPrefix(l, "    ") && len(lines) > 0: // a wrapped line
			lines[len(lines)-1] += " " + strings.TrimSpace(l)
		default:
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return lines
}

// TestPolicyRules: each policy rule, blocked in enforce mode and let through in monitor mode,
// comes first in the answer with its key and detail, worded by its outcome, and in every format.
func TestPolicyRules(t *testing.T) {
	rules := []struct {
		rule   protocol.Rule
		op     protocol.Op
		key    string
		detail string
		value  string
		what   string // the table's words for the op and key
	}{
		{protocol.RulePickleGlobalDenied, protocol.OpSet, "/vllm/broadcast/0", "base64 pickle imports posix.system", evilPickle,
			"wrote key /vllm/broadcast/0"},
		{protocol.RuleRendezvousStateInvalid, protocol.OpCompareSet, "/torch.rendezvous.r1",
			"imports posix.system: not a torch rendezvous state", evilPickle, "wrote key /torch.rendezvous.r1"},
		{protocol.RulePolicyDenied, protocol.OpGet, "/nccl/unique_id", "rule no-nccl-reads: denied", "",
			"read key /nccl/unique_id"},
		{protocol.RuleValueInvalid, protocol.OpSet, "/vllm/meta", "rule vllm-json: not json", "x{", "wrote key /vllm/meta"},
		{protocol.RuleKeyWriteOnce, protocol.OpDeleteKey, "/torchelastic/assigned_ranks/0", "rule assigned-ranks: written once", "",
			"deleted key /torchelastic/assigned_ranks/0"},
	}
	for _, r := range rules {
		for _, action := range []audit.Action{audit.ActionBlocked, audit.ActionWouldBlock} {
			t.Run(string(r.rule)+"/"+string(action), func(t *testing.T) {
				pv := policyViolation{at: at("12:10"), src: scannerIP, rule: r.rule, op: r.op, key: r.key, detail: r.detail,
					value: r.value, action: action}
				s := summarizePolicy(t, pv, pv)
				p := s.Policy
				want := PolicyEntry{Rule: string(r.rule), Action: string(action), Key: r.key, Detail: r.detail, Ops: []string{r.op.String()},
					Events: 2, Sources: 1, IPs: []netip.Addr{scannerIP}, FirstSeen: at("12:10"), LastSeen: at("12:10")}
				if len(p.Entries) != 1 || !equalEntry(p.Entries[0], want) {
					t.Fatalf("entries %+v\nwant %+v", p.Entries, want)
				}
				wb := uint64(0)
				if action == audit.ActionWouldBlock {
					wb = 2
				}
				if p.Events != 2 || p.WouldBlock != wb || p.Other != 0 || p.Suppressed != 0 {
					t.Errorf("policy %+v: want 2 events, %d would_block", p, wb)
				}

				// The rules table has the rule's detail, and no declared size: the message was valid.
				if len(s.ByRule) != 1 || s.ByRule[0].Declared != nil || s.ByRule[0].First.Detail != r.detail ||
					s.ByRule[0].First.Key != r.key || len(s.Fields) != 0 {
					t.Errorf("by_rule %+v, fields %v: want the detail and key, no declared size, no field", s.ByRule, s.Fields)
				}

				table := render(t, s, "table")
				lines := answer(t, table)
				var wantLine string
				switch {
				case action == audit.ActionBlocked:
					wantLine = fmt.Sprintf("- blocked: 10.0.0.5 %s: %s (%s, 2 messages); nothing of them reached the store", r.what, r.detail, r.rule)
				case codeRule(string(r.rule)):
					wantLine = fmt.Sprintf("!! CODE EXECUTION LET THROUGH (monitor mode): 10.0.0.5 %s: %s (%s, 2 messages)", r.what, r.detail, r.rule)
				default:
					wantLine = fmt.Sprintf("!! POLICY BROKEN, LET THROUGH (monitor mode): 10.0.0.5 %s: %s (%s, 2 messages)", r.what, r.detail, r.rule)
				}
				if len(lines) < 2 || lines[0] != wantLine {
					t.Errorf("answer\n%s\nwant first\n%s", strings.Join(lines, "\n"), wantLine)
				}
				// The flow-based headline under it agrees: a let-through message is never "nothing".
				headline := lines[1]
				if action == audit.ActionWouldBlock && !strings.HasPrefix(headline, "YES, IN MONITOR MODE: ") {
					t.Errorf("headline %q after a policy would_block", headline)
				}
				if action == audit.ActionBlocked && strings.Contains(headline, "MONITOR") {
					t.Errorf("headline %q after a policy block", headline)
				}
				if !strings.Contains(table, "LARGEST DECLARED / DETAIL") || !strings.Contains(table, "  "+string(r.rule)+" ") {
					t.Errorf("the rules table lacks the rule or its detail column:\n%s", table)
				}

				rows := csvRows(t, render(t, s, "csv"))
				row := rows["policy"]
				if len(row) != 1 || row[0]["key"] != r.key || row[0]["detail"] != r.detail || row[0]["rule"] != string(r.rule) ||
					row[0]["action"] != string(action) || row[0]["events"] != "2" || row[0]["ips"] != "10.0.0.5" || row[0]["sources"] != "1" {
					t.Errorf("csv policy rows %v", row)
				}

				page := render(t, s, "html")
				for _, fig := range []string{"policy:0:key", "policy:0:detail", "policy:0:action", "policy::would_block", "rule:" + string(r.rule) + ":first.detail"} {
					if !strings.Contains(page, `data-figure="`+fig+`"`) {
						t.Errorf("the page has no figure %s", fig)
					}
				}
				if !strings.Contains(page, r.key) || !strings.Contains(page, r.detail) {
					t.Errorf("the page lacks the key %s or the detail %s", r.key, r.detail)
				}
			})
		}
	}
}

func equalEntry(a, b PolicyEntry) bool {
	return a.Rule == b.Rule && a.Action == b.Action && a.Key == b.Key && a.Detail == b.Detail && slices.Equal(a.Ops, b.Ops) &&
		a.Events == b.Events && a.Sources == b.Sources && slices.Equal(a.IPs, b.IPs) &&
		a.FirstSeen.Equal(b.FirstSeen) && a.LastSeen.Equal(b.LastSeen)
}

// csvRows reads a CSV report into its rows by section, each a map by column name.
func csvRows(t *testing.T, out string) map[string][]map[string]string {
	t.Helper()
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	rows := make(map[string][]map[string]string)
	for _, rec := range recs[1:] {
		m := make(map[string]string)
		for i, name := range recs[0] {
			m[name] = rec[i]
		}
		rows[rec[0]] = append(rows[rec[0]], m)
	}
	return rows
}

// TestPolicyOrder: what reached the store comes before what was blocked, code before the policy
// file's rules, and within those most messages first.
func TestPolicyOrder(t *testing.T) {
	pv := func(hhmm string, rule protocol.Rule, key string, action audit.Action) policyViolation {
		return policyViolation{at: at(hhmm), src: speakerIP, rule: rule, op: protocol.OpSet, key: key, detail: "d", value: "v", action: action}
	}
	s := summarizePolicy(t,
		pv("12:00", protocol.RulePickleGlobalDenied, "/a", audit.ActionBlocked),
		pv("12:01", protocol.RulePickleGlobalDenied, "/b", audit.ActionBlocked),
		pv("12:02", protocol.RulePickleGlobalDenied, "/b", audit.ActionBlocked),
		pv("12:03", protocol.RuleValueInvalid, "/c", audit.ActionBlocked),
		pv("12:04", protocol.RulePolicyDenied, "/d", audit.ActionWouldBlock),
		pv("12:05", protocol.RuleRendezvousStateInvalid, "/torch.rendezvous.r1", audit.ActionWouldBlock),
	)
	var got []string
	for _, en := range s.Policy.Entries {
		got = append(got, en.Action+" "+en.Rule+" "+en.Key)
	}
	want := []string{
		"would_block rendezvous_state_invalid /torch.rendezvous.r1",
		"would_block policy_denied /d",
		"blocked pickle_global_denied /b",
		"blocked pickle_global_denied /a",
		"blocked value_invalid /c",
	}
	if !slices.Equal(got, want) {
		t.Errorf("order\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The table shows the first tablePolicy and counts the rest.
	lines := answer(t, render(t, s, "table"))
	if len(lines) < tablePolicy+1 || lines[tablePolicy] != "- 2 more messages broke a policy rule; --format json lists the first 64 keys" {
		t.Errorf("answer\n%s", strings.Join(lines, "\n"))
	}
}

// TestPolicyBounded: a flood of distinct keys keeps MaxPolicyEntries, counts the rest exactly, and
// never pushes a let-through entry out for blocked ones; sources and addresses are bounded too.
func TestPolicyBounded(t *testing.T) {
	z := NewSummarizer(Filter{})
	base := at("12:00")
	var events uint64
	for i := range 3 * maxPolicyHeld {
		ip := netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)})
		z.Add(audit.Event{Timestamp: base.Add(time.Duration(i) * time.Second), Action: audit.ActionBlocked, Reason: string(protocol.RulePickleGlobalDenied),
			SourceIP: ip, Key: fmt.Sprintf("/k/%d", i), Detail: "pickle imports os.system", Op: "set"})
		events++
	}
	for i := range 2 * maxPolicySources {
		ip := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)})
		z.Add(audit.Event{Timestamp: base.Add(time.Hour), Action: audit.ActionWouldBlock, Reason: string(protocol.RuleRendezvousStateInvalid),
			SourceIP: ip, Key: "/torch.rendezvous.r1", Detail: "not base64: torch writes base64(pickle) or its sentinel", Op: "set"})
		events++
	}
	p := z.Summary().Policy
	if len(p.Entries) != MaxPolicyEntries || p.Events != events || p.WouldBlock != 2*maxPolicySources {
		t.Fatalf("%d entries, %d events (%d would_block); want %d, %d (%d)", len(p.Entries), p.Events, p.WouldBlock,
			MaxPolicyEntries, events, 2*maxPolicySources)
	}
	var listed uint64
	for _, en := range p.Entries {
		listed += en.Events
	}
	if listed+p.Other != p.Events || p.OtherWouldBlock != 0 {
		t.Errorf("listed %d + other %d (%d would_block) != %d", listed, p.Other, p.OtherWouldBlock, p.Events)
	}
	wb := p.Entries[0]
	if wb.Action != "would_block" || wb.Events != 2*maxPolicySources || wb.Sources != maxPolicySources || len(wb.IPs) != MaxPolicyIPs {
		t.Errorf("first entry %+v: want the would_block one, %d sources counted, %d listed", wb, maxPolicySources, MaxPolicyIPs)
	}
	if got := policySources(wb.IPs, wb.Sources); got != "2001:db8:: and 1,023+ more sources" {
		t.Errorf("sources in words: %q", got)
	}
}

// TestPolicyHostileText: a key or detail with terminal escapes (a log edited by hand, a pickle's
// global spelt with control bytes) reaches no output raw, and a CSV cell never starts a formula.
func TestPolicyHostileText(t *testing.T) {
	hostile := []policyViolation{
		{at: at("12:10"), src: scannerIP, rule: protocol.RulePickleGlobalDenied, op: protocol.OpSet, key: "/k",
			detail: "pickle imports os.\x1b]0;pwned\x07system\x1b[2J\u009b31m", value: evilPickle, action: audit.ActionWouldBlock},
		{at: at("12:11"), src: scannerIP, rule: protocol.RulePolicyDenied, op: protocol.OpSet, key: "=cmd|' /C calc'!A0",
			detail: "-2+3", value: "v", action: audit.ActionBlocked},
		{at: at("12:12"), src: scannerIP, rule: protocol.RuleValueInvalid, op: protocol.OpSet, key: "@SUM(1)",
			detail: "+1", value: "v", action: audit.ActionBlocked},
	}
	path := filepath.Join(t.TempDir(), "audit.log")
	writePolicyLog(t, path, hostile...)
	// ViolationEvent writes the key as the guard escapes it (ShowKey); a log edited by hand, or
	// written by another tool, has it raw: append such a line.
	raw, err := json.Marshal(audit.Event{Timestamp: at("12:13"), ID: "x", Action: audit.ActionWouldBlock, Reason: string(protocol.RuleRendezvousStateInvalid),
		SourceIP: scannerIP, Key: "/torch.rendezvous.\x1b[31mr1\x07", Detail: "\x1b[1mnot\x7f base64"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(append(raw, '\n'))
	f.Close()

	s, err := Summarize([]string{path}, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Policy.Entries) != 4 {
		t.Fatalf("entries %+v", s.Policy.Entries)
	}
	for _, format := range []string{"table", "csv", "html", "json"} {
		out := render(t, s, format)
		for i := 0; i < len(out); i++ {
			if c := out[i]; c < 0x20 && c != '\n' || c == 0x7f {
				t.Errorf("%s: byte %#x at %d: %q", format, c, i, out[max(i-20, 0):min(i+20, len(out))])
				break
			}
		}
		// No C1 control (U+0080 to U+009F: CSI is U+009B) either.
		for _, r := range out {
			if r >= 0x80 && r <= 0x9f {
				t.Errorf("%s: rune %U", format, r)
				break
			}
		}
		for _, want := range []string{`\x1b[31mr1\x07`, `\x1b]0;pwned\x07system`, `\xc2\x9b31m`, `\x1b[1mnot\x7f base64`} {
			if format == "json" {
				want = strings.ReplaceAll(want, `\`, `\\`)
			}
			if !strings.Contains(out, want) {
				t.Errorf("%s: no %s:\n%s", format, want, out)
			}
		}
	}

	rows := csvRows(t, render(t, s, "csv"))
	for _, row := range rows["policy"] {
		for _, col := range []string{"key", "detail"} {
			if v := row[col]; v != "" && strings.ContainsRune("=+-@\t\r", rune(v[0])) {
				t.Errorf("csv %s cell %q starts a formula", col, v)
			}
		}
	}
	var keys []string
	for _, row := range rows["policy"] {
		keys = append(keys, row["key"])
	}
	for _, want := range []string{"'=cmd|' /C calc'!A0", "'@SUM(1)"} {
		if !slices.Contains(keys, want) {
			t.Errorf("csv keys %q: want %q", keys, want)
		}
	}
}

// TestPolicyTableWidth: policy lines of the longest key and detail the writer lets through, from
// the longest addresses, stay within the screen, four lines an entry at most.
func TestPolicyTableWidth(t *testing.T) {
	for _, action := range []audit.Action{audit.ActionWouldBlock, audit.ActionBlocked} {
		t.Run(string(action), func(t *testing.T) { testPolicyTableWidth(t, action) })
	}
}

func testPolicyTableWidth(t *testing.T, action audit.Action) {
	long := strings.Repeat("\x1b", protocol.MaxKeyShown+10)
	z := NewSummarizer(Filter{})
	for i, rule := range []protocol.Rule{protocol.RuleRendezvousStateInvalid, protocol.RulePickleGlobalDenied, protocol.RulePolicyDenied} {
		for j := range 1500 {
			ip := netip.MustParseAddr(fmt.Sprintf("2001:db8:ffff:ffff:ffff:ffff:ffff:%x", 0xf000+j))
			pv := policyViolation{at: at("12:10").Add(time.Duration(i*10+j) * time.Second), src: ip, rule: rule, op: protocol.OpSet,
				key: long, detail: "pickle imports " + strings.Repeat("a", 2000), value: "v", action: action}
			z.Add(pv.event(t))
		}
	}
	s := z.Summary()
	table := render(t, s, "table")
	for l := range strings.Lines(table) {
		if n := utf8.RuneCountInString(strings.TrimSuffix(l, "\n")); n > screenWidth {
			t.Errorf("a line of %d columns: %s", n, l)
		}
	}
	_, rest, _ := strings.Cut(table, "DID ANYTHING GET THROUGH?\n")
	var policyLines int
	for l := range strings.Lines(rest) {
		if !strings.HasPrefix(l, "  !! ") && !strings.HasPrefix(l, "  - blocked") && !strings.HasPrefix(l, "    ") {
			break
		}
		policyLines++
	}
	if policyLines > 4*tablePolicy {
		t.Errorf("%d lines of policy entries, want at most %d:\n%s", policyLines, 4*tablePolicy, table)
	}
	if testing.Verbose() {
		t.Logf("\n%s", table)
	}
}

// TestPolicyGolden: the hijack, one forged rendezvous state let through in monitor mode and two
// pickles blocked, in each format. Rewrite with: go test ./audit/ -run Golden -update
func TestPolicyGolden(t *testing.T) {
	testdata, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	writePolicyLog(t, "audit.log", hijack()...)
	for _, format := range []string{"table", "json", "csv", "html"} {
		t.Run(format, func(t *testing.T) {
			got := summaryOutput(t, format, "audit.log")
			path := filepath.Join(testdata, "policy."+format+".golden")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("output differs from %s:\n%s", path, lineDiff(string(want), string(got)))
			}
		})
	}
}

// TestPicklesThatPassedAreListed: issue 41's report. A source had one connection blocked
// (os.system) and 36 that passed, each storing a pickle the deny list missed: the answer lists the
// source, its pickles and their keys, and what its passed connections forwarded; never "NO: nothing
// reached the store". A job source's pickles are listed too, as what a reader will load.
func TestPicklesThatPassedAreListed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	pv := policyViolation{at: at("12:10"), src: scannerIP, rule: protocol.RulePickleGlobalDenied, op: protocol.OpSet,
		key: "/bc/control", detail: "pickle imports posix.system, which runs code: never allowed", value: evilPickle,
		action: audit.ActionBlocked}
	writePolicyLog(t, path, pv)
	w, err := audit.Open(path, audit.Options{Observer: &audit.Observer{Hostname: "master-0", Type: "proxy", Version: "test", Host: true}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 36 {
		f := audit.Flow{ConnID: uint64(200 + i), Src: netip.AddrPortFrom(scannerIP, uint16(50000+i)), Dst: storeAddr,
			Start: at("12:20"), End: at("12:21"), Verdict: audit.VerdictPassed, Generation: "G3", Mode: audit.ModeEnforce,
			ClosedBy: audit.ClosedByClient, FromClient: 120, ToStore: 120, Messages: 3, Pickles: uint64(i % 2), Base64Pickles: uint64(1 - i%2),
			PickleKeys: []string{fmt.Sprintf("/gadget/%d", i%3)}}
		if err := w.Write(f.Event()); err != nil {
			t.Fatal(err)
		}
	}
	job := audit.Flow{ConnID: 300, Src: netip.AddrPortFrom(jobIP, 41000), Dst: storeAddr, Start: at("12:00"), End: at("12:30"),
		Verdict: audit.VerdictPassed, Generation: "G3", Mode: audit.ModeEnforce, ClosedBy: audit.ClosedByClient, FromClient: 900,
		ToStore: 900, Messages: 9, Base64Pickles: 4, PickleKeys: []string{"/torch.rendezvous.r1"}}
	if err := w.Write(job.Event()); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Summarize([]string{path}, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Join(strings.Fields(strings.Join(answer(t, render(t, s, "table")), " ")), " ") // unwrapped
	for _, want := range []string{
		"from 10.0.0.5 reached the store",
		"18 pickles and 18 base64 pickles (on /gadget/0, /gadget/1, /gadget/2) passed the policy",
		"its 36 connections that passed forwarded 4,320 B",
		"job source 10.0.0.7 stored 4 base64 pickles (on /torch.rendezvous.r1)",
	} {
		if !strings.Contains(lines, want) {
			t.Errorf("no %q in the answer:\n%s", want, lines)
		}
	}
	if strings.Contains(lines, "NO: ") {
		t.Errorf("the answer says NO:\n%s", lines)
	}
	if s.Reached.Verdict != ReachedForwarded { // the blocked connection's VALIDATE went before its SET
		t.Errorf("verdict %s, want %s", s.Reached.Verdict, ReachedForwarded)
	}
	if src := s.Sources[slices.IndexFunc(s.Sources, func(st SourceStats) bool { return st.IP == scannerIP })]; src.Pickles != 18 ||
		src.Base64Pickles != 18 || src.PassedStoreBytes != 36*120 || len(src.PickleKeys) != 3 {
		t.Errorf("source %+v", src)
	}
}
