package report

import (
	"cmp"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

// Caps on the policy section; its totals stay exact.
const (
	MaxPolicyEntries = 64 // entries listed, worst first; the rest are counted in Other
	MaxPolicyIPs     = 8  // addresses listed per entry, in the order first seen
	// Entries held while reading, per severity class, in the order first seen: a flood of distinct
	// keys costs bounded memory, and never pushes out what reached the store.
	maxPolicyHeld    = 256
	maxPolicySources = 1024 // distinct sources counted per entry
	maxPolicyOps     = 4    // op names kept per entry
	maxPolicyText    = 1024 // bytes of a key or a detail kept, escaped
)

// PolicyStats are the blocked and would_block events of the policy stage's rules
// (protocol.IsPolicyRule: well-formed messages that a rule forbids, such as a pickle importing a
// global that runs code, or a forged rendezvous state that every torchrun agent unpickles).
//
// Entries group the written events by rule, action, key and detail, worst first: what reached the
// store (would_block) before what was blocked, then code (pickle_global_denied,
// rendezvous_state_invalid) before the rest (policy_denied, value_invalid, key_write_once), then
// most events. Other counts the written events of entries past MaxPolicyEntries (and, after
// maxPolicyHeld entries of a class, those of entries first seen later). Sampled-away events have
// no key: they are in Suppressed only.
type PolicyStats struct {
	Events               uint64        `json:"events"`                 // written
	WouldBlock           uint64        `json:"would_block"`            // of Events, let through to the store (monitor mode)
	Suppressed           uint64        `json:"suppressed"`             // sampled away (sampled_summary's storeguard.suppressed_by)
	SuppressedWouldBlock uint64        `json:"suppressed_would_block"` // of Suppressed, let through
	Entries              []PolicyEntry `json:"entries"`
	Other                uint64        `json:"other"`             // written events of no listed entry
	OtherWouldBlock      uint64        `json:"other_would_block"` // of Other, let through
}

// PolicyEntry is the written events of one rule and action on one key, with one detail. Key and
// Detail are storeguard.key and storeguard.detail with every byte outside printable ASCII escaped
// (\x1b): they are what an attacker's traffic shaped, and are shown on terminals and in
// spreadsheets.
type PolicyEntry struct {
	Rule      string       `json:"rule"`   // event.reason
	Action    string       `json:"action"` // would_block (it reached the store) or blocked
	Key       string       `json:"key"`    // empty for an op without a key (list_keys)
	Detail    string       `json:"detail"` // what broke the rule: "pickle imports posix.system"
	Ops       []string     `json:"ops,omitempty"`
	Events    uint64       `json:"events"`
	Sources   int          `json:"sources"` // distinct addresses, counted up to 1,024
	IPs       []netip.Addr `json:"ips"`     // the first MaxPolicyIPs of them
	FirstSeen time.Time    `json:"first_seen"`
	LastSeen  time.Time    `json:"last_seen"`
}

// codeRule: a rule whose breach puts code in a process that unpickles the value.
func codeRule(rule string) bool {
	return rule == string(protocol.RulePickleGlobalDenied) || rule == string(protocol.RuleRendezvousStateInvalid)
}

// policyClass ranks an entry, worst first: let through before blocked, code before the rest.
func policyClass(action, rule string) int {
	c := 0
	if action != string(audit.ActionWouldBlock) {
		c = 2
	}
	if !codeRule(rule) {
		c++
	}
	return c
}

type policyKey struct{ rule, action, key, detail string }

type policyAcc struct {
	entry   PolicyEntry
	sources map[netip.Addr]struct{}
}

// policySummarizer accumulates PolicyStats.
type policySummarizer struct {
	stats   PolicyStats
	entries map[policyKey]*policyAcc
	held    [4]int // entries held, by class
}

func (p *policySummarizer) add(e *audit.Event) {
	wb := e.Action == audit.ActionWouldBlock
	p.stats.Events++
	if wb {
		p.stats.WouldBlock++
	}
	k := policyKey{e.Reason, string(e.Action), shownText(e.Key), shownText(e.Detail)}
	acc := p.entries[k]
	if acc == nil {
		class := policyClass(k.action, k.rule)
		if p.held[class] >= maxPolicyHeld {
			p.stats.Other++
			if wb {
				p.stats.OtherWouldBlock++
			}
			return
		}
		if p.entries == nil {
			p.entries = make(map[policyKey]*policyAcc)
		}
		p.held[class]++
		acc = &policyAcc{entry: PolicyEntry{Rule: k.rule, Action: k.action, Key: k.key, Detail: k.detail},
			sources: make(map[netip.Addr]struct{})}
		p.entries[k] = acc
	}
	en := &acc.entry
	en.Events++
	widen(&en.FirstSeen, &en.LastSeen, e.Timestamp)
	if op := shownText(e.Op); op != "" && !slices.Contains(en.Ops, op) && len(en.Ops) < maxPolicyOps {
		en.Ops = append(en.Ops, op)
	}
	if ip := e.SourceIP; ip.IsValid() && len(acc.sources) < maxPolicySources {
		if _, ok := acc.sources[ip]; !ok {
			acc.sources[ip] = struct{}{}
			if len(en.IPs) < MaxPolicyIPs {
				en.IPs = append(en.IPs, ip)
			}
		}
	}
}

// suppressed counts n events of a policy rule that sampling left out.
func (p *policySummarizer) suppressed(a audit.Action, n uint64) {
	p.stats.Suppressed += n
	if a == audit.ActionWouldBlock {
		p.stats.SuppressedWouldBlock += n
	}
}

func (p *policySummarizer) summary() PolicyStats {
	st := p.stats
	st.Entries = make([]PolicyEntry, 0, min(len(p.entries), MaxPolicyEntries))
	all := make([]PolicyEntry, 0, len(p.entries))
	for _, acc := range p.entries {
		en := acc.entry
		en.Sources = len(acc.sources)
		en.Ops, en.IPs = slices.Clone(en.Ops), slices.Clone(en.IPs)
		en.FirstSeen, en.LastSeen = en.FirstSeen.UTC(), en.LastSeen.UTC()
		all = append(all, en)
	}
	slices.SortFunc(all, func(a, b PolicyEntry) int {
		return cmp.Or(cmp.Compare(policyClass(a.Action, a.Rule), policyClass(b.Action, b.Rule)), cmp.Compare(b.Events, a.Events),
			a.FirstSeen.Compare(b.FirstSeen), cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Key, b.Key), cmp.Compare(a.Detail, b.Detail))
	})
	for i, en := range all {
		if i < MaxPolicyEntries {
			st.Entries = append(st.Entries, en)
			continue
		}
		st.Other += en.Events
		if en.Action == string(audit.ActionWouldBlock) {
			st.OtherWouldBlock += en.Events
		}
	}
	return st
}

// shownText is s as a report shows a string that hostile traffic shaped: printable ASCII, every
// other byte escaped (\x1b), at most maxPolicyText bytes. The writer escapes a key already; a
// detail may name a pickle's global as the pickle spelt it, and a log may have been edited.
func shownText(s string) string {
	s = printable(s)
	if len(s) > maxPolicyText {
		s = s[:maxPolicyText-3] + "..."
	}
	return s
}

// tablePolicy is how many policy entries the table shows: two lines each, four at most (an IPv6
// source, a key and a detail at their widths below).
const tablePolicy = 3

// Runes of a key and of a detail in a line of the table: a word of either fits a line of
// writeWrapped, and an entry four lines.
const (
	tableKeyWidth    = 48
	tableDetailWidth = 64
)

// writePolicy writes the policy entries, worst first, and what the table leaves out of them.
func (s Summary) writePolicy(w io.Writer) {
	p := s.Policy
	shown := p.Entries[:min(len(p.Entries), tablePolicy)]
	for _, en := range shown {
		writeWrapped(w, "  "+policyMark(en.Action), en.sentence())
	}
	rest, restWB := p.Other, p.OtherWouldBlock
	for _, en := range p.Entries[len(shown):] {
		rest += en.Events
		if en.Action == string(audit.ActionWouldBlock) {
			restWB += en.Events
		}
	}
	if rest > 0 {
		text := plural(rest, "more message") + " broke a policy rule"
		mark := policyMark(string(audit.ActionBlocked))
		if restWB > 0 {
			text += fmt.Sprintf(", %s LET THROUGH (monitor mode)", group(restWB))
			mark = policyMark(string(audit.ActionWouldBlock))
		}
		writeWrapped(w, "  "+mark, text+fmt.Sprintf("; --format json lists the first %d keys", MaxPolicyEntries))
	}
	if p.Suppressed > 0 {
		text := plural(p.Suppressed, "more message") + " broke a policy rule, sampled away (no key recorded)"
		mark := policyMark(string(audit.ActionBlocked))
		if p.SuppressedWouldBlock > 0 {
			text += fmt.Sprintf(", %s LET THROUGH (monitor mode)", group(p.SuppressedWouldBlock))
			mark = policyMark(string(audit.ActionWouldBlock))
		}
		writeWrapped(w, "  "+mark, text)
	}
}

func policyMark(action string) string {
	if action == string(audit.ActionWouldBlock) {
		return "!! "
	}
	return "- "
}

// sentence words one entry: "CODE EXECUTION LET THROUGH (monitor mode): 10.0.0.5 wrote key
// /torch.rendezvous.r1: imports posix.system: not a torch rendezvous state
// (rendezvous_state_invalid, 1 message)".
func (en *PolicyEntry) sentence() string {
	var b strings.Builder
	switch {
	case en.Action != string(audit.ActionWouldBlock):
		b.WriteString("blocked: ")
	case codeRule(en.Rule):
		b.WriteString("CODE EXECUTION LET THROUGH (monitor mode): ")
	default:
		b.WriteString("POLICY BROKEN, LET THROUGH (monitor mode): ")
	}
	fmt.Fprintf(&b, "%s %s", policySources(en.IPs, en.Sources), en.what())
	if en.Detail != "" {
		b.WriteString(": " + clipEscaped(printable(en.Detail), tableDetailWidth))
	}
	fmt.Fprintf(&b, " (%s, %s)", printable(en.Rule), plural(en.Events, "message"))
	if en.Action != string(audit.ActionWouldBlock) {
		if en.Events == 1 {
			b.WriteString("; it never reached the store")
		} else {
			b.WriteString("; nothing of them reached the store")
		}
	}
	return b.String()
}

// what is what the entry's messages did: "wrote key /x", "read key /y", "sent list_keys".
func (en *PolicyEntry) what() string {
	if en.Key == "" {
		if len(en.Ops) == 0 {
			return "sent a message"
		}
		return "sent " + printable(strings.Join(en.Ops, ", "))
	}
	verb := ""
	for _, op := range en.Ops {
		v := cmp.Or(opVerbs[op], "used")
		if verb != "" && v != verb {
			v = "used"
		}
		verb = v
	}
	return cmp.Or(verb, "used") + " key " + clipEscaped(printable(en.Key), tableKeyWidth)
}

// clipEscaped is clip of a printable string, cut before an escape (\x1b) rather than inside it.
func clipEscaped(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 1
	if i := strings.LastIndexByte(s[max(cut-3, 0):cut], '\\'); i >= 0 && strings.HasPrefix(s[max(cut-3, 0)+i:], `\x`) {
		cut = max(cut-3, 0) + i
	}
	return s[:cut] + "…"
}

// opVerbs word what an op does to its key.
var opVerbs = map[string]string{
	"set": "wrote", "compare_set": "wrote", "append": "wrote", "multi_set": "wrote", "queue_push": "wrote", "add": "wrote",
	"delete_key": "deleted", "queue_pop": "popped",
	"get": "read", "multi_get": "read", "check": "read", "wait": "read", "watch_key": "read", "queue_len": "read",
}

// policySources names an entry's sources: "10.0.0.5", "10.0.0.5 and 10.0.0.6", "10.0.0.5 and
// 2 more sources" (counted up to maxPolicySources: "and 1,023+ more sources").
func policySources(ips []netip.Addr, n int) string {
	switch {
	case len(ips) == 0:
		return "an unrecorded source"
	case len(ips) == 2 && n == 2:
		return formatIP(ips[0]) + " and " + formatIP(ips[1])
	case n <= 1:
		return formatIP(ips[0])
	}
	more := group(uint64(n - 1))
	if n >= maxPolicySources {
		more += "+"
	}
	return formatIP(ips[0]) + " and " + more + " more sources"
}
