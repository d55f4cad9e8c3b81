package report

import (
	"iter"
	"maps"
	"slices"
	"strings"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/probename"
	"github.com/storeguard/storeguard/protocol"
)

// A report reads logs as they are: one copied from another host, or edited by hand, can put any
// string where storeguard writes a name (a rule, a probe, an op, a verdict), and the report prints
// names on terminals, in spreadsheets and in pages. So the Summarizer keeps the names storeguard
// writes and counts any other as OtherName (knownNames); free text (a key, a detail, an address's
// zone) it shows escaped (printable).

// OtherName counts in a report what a log names that storeguard never writes.
const OtherName = "other"

// knownNames returns e with every name that storeguard does not write replaced by OtherName, and
// its source address's zone (an interface's name, or whatever a log holds there) escaped. The maps
// and slices of e are not changed: those with an unknown name are copied.
func knownNames(e audit.Event) audit.Event {
	if zone := e.SourceIP.Zone(); zone != "" {
		e.SourceIP = e.SourceIP.WithZone(printable(zone))
	}
	e.Action = audit.Action(knownAction(string(e.Action)))
	e.Verdict = audit.Verdict(knownVerdict(string(e.Verdict)))
	e.Reason = knownReason(e.Action, e.Verdict, e.Reason)
	e.Op, e.Field, e.Probe = knownOp(e.Op), knownWord(e.Field), knownProbe(e.Probe)
	e.Ops = knownCounts(e.Ops, knownOp)
	e.ScanVerdicts = knownCounts(e.ScanVerdicts, knownVerdict)
	e.SuppressedBy = knownCounts(e.SuppressedBy, knownKind)
	e.ScanProbes = knownList(e.ScanProbes, knownProbe)
	if id := e.PeerIdentity(); len(id) > maxIdentityBytes {
		t := *e.TLS // shared with whoever holds the event
		t.Identity = OtherName
		e.TLS = &t
	}
	return e
}

// maxIdentityBytes is the longest storeguard.identity the report groups by: a SPIFFE ID's limit.
// A log may come from anywhere; a longer one is counted as OtherName.
const maxIdentityBytes = 2048

// known is name if ok, or OtherName; "" (no name) stays.
func known(name string, ok bool) string {
	if name == "" || ok {
		return name
	}
	return OtherName
}

// setOf is the set of names.
func setOf[T ~string](names ...T) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[string(n)] = true
	}
	return m
}

var (
	actions = setOf(audit.ActionBlocked, audit.ActionWouldBlock, audit.ActionDenied, audit.ActionBanned, audit.ActionSampledSummary,
		audit.ActionDroppedSummary, audit.ActionHandover, audit.ActionFlow, audit.ActionScan)
	verdicts = setOf(audit.VerdictPassed, audit.VerdictEmpty, audit.VerdictTruncated, audit.VerdictBlocked, audit.VerdictWouldBlock,
		audit.VerdictRefused, audit.VerdictOpen, audit.VerdictIncomplete, audit.VerdictHalfOpen)
	ops = func() map[string]bool {
		names := []string{protocol.OpInvalid.String()}
		for _, op := range protocol.Ops() {
			names = append(names, op.String())
		}
		return setOf(names...)
	}()
)

func knownAction(a string) string    { return known(a, actions[a]) }
func knownVerdict(v string) string   { return known(v, verdicts[v]) }
func knownOp(op string) string       { return known(op, ops[op]) }
func knownRule(rule string) string   { return known(rule, protocol.IsRule(rule)) }
func knownProbe(probe string) string { return known(probe, probename.Known(probe)) }

// knownWord keeps a name of a set that grows with storeguard (an admission refusal's reason, a
// ban's, a hand-over's, replay's reasons for an incomplete stream, a field) if it has the shape
// they all have: lower snake case, at most 64 bytes. Such a name has no control character and
// starts no formula.
func knownWord(s string) string {
	ok := len(s) <= 64 && s != "" && s[0] >= 'a' && s[0] <= 'z'
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_'
	}
	return known(s, ok)
}

// knownReason: event.reason is a rule where a violation is recorded (a blocked or would_block
// event, and the flow of its connection), a word otherwise.
func knownReason(a audit.Action, v audit.Verdict, reason string) string {
	if a == audit.ActionBlocked || a == audit.ActionWouldBlock ||
		a == audit.ActionFlow && (v == audit.VerdictBlocked || v == audit.VerdictWouldBlock || v == audit.VerdictTruncated) {
		return knownRule(reason)
	}
	return knownWord(reason)
}

// knownKind is a sampled_summary's kind (sampleKind: "blocked/key_too_long/rdp_x224",
// "flow/empty") with each of its names known.
func knownKind(kind string) string {
	parts := strings.SplitN(kind, "/", 3)
	a := audit.Action(knownAction(parts[0]))
	parts[0] = string(a)
	if len(parts) > 1 {
		if a == audit.ActionFlow {
			parts[1] = knownVerdict(parts[1])
		} else {
			parts[1] = knownReason(a, "", parts[1])
		}
	}
	if len(parts) > 2 {
		parts[2] = knownProbe(parts[2])
	}
	return strings.Join(parts, "/")
}

// knownCounts is m with each key replaced by name(key), the counts of keys that become one added.
func knownCounts[M ~map[string]uint64](m M, name func(string) string) M {
	if allKnown(maps.Keys(m), name) {
		return m
	}
	out := make(M, len(m))
	for k, n := range m {
		out[name(k)] += n
	}
	return out
}

// knownList is names with each replaced by name(it), once each.
func knownList(names []string, name func(string) string) []string {
	if allKnown(slices.Values(names), name) {
		return names
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		if n = name(n); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// allKnown reports whether name keeps every one of names.
func allKnown(names iter.Seq[string], name func(string) string) bool {
	for n := range names {
		if name(n) != n {
			return false
		}
	}
	return true
}
