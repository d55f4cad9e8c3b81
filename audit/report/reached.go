package report

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/storeguard/storeguard/audit"
)

// Reached answers "did anything hostile get through?" from flow records and would_block events,
// over the hostile and mixed sources (a mixed source's connections that passed are its job's and
// left out).
type Reached struct {
	// Verdict: the worst of the hostile sources' (SourceStats.Reached): would_block, forwarded,
	// unknown or nothing; none when there is no hostile source.
	Verdict          string `json:"verdict"`
	HostileSources   int    `json:"hostile_sources"`
	Connections      uint64 `json:"connections"`       // their connections recorded
	StoreBytes       uint64 `json:"store_bytes"`       // what those forwarded to the store
	StoreConnections uint64 `json:"store_connections"` // how many forwarded anything
	Messages         uint64 `json:"messages"`          // their complete messages: valid before a block, or let through in monitor mode
	WouldBlock       uint64 `json:"would_block"`       // hostile messages let through in monitor mode (would_block events)
	Unrecorded       uint64 `json:"unrecorded"`        // their connections sampled away that may have forwarded bytes
	// Findings: the answer in sentences, a headline first, then the sources of note, worst first
	// (each one that let anything through; the others as far as Top lists them, then together).
	Findings []Finding `json:"findings"`
}

// Finding is one sentence of Reached, about one source (IP) or several.
type Finding struct {
	Verdict     string     `json:"verdict"`
	IP          netip.Addr `json:"ip,omitzero"`
	Identity    string     `json:"identity,omitempty"` // a source that is an identity (SourceStats.Identity)
	Sources     int        `json:"sources"`
	Connections uint64     `json:"connections"`
	StoreBytes  uint64     `json:"store_bytes"`
	Messages    uint64     `json:"messages"`
	WouldBlock  uint64     `json:"would_block"`
	Headline    bool       `json:"headline,omitempty"`
	Text        string     `json:"text"`
}

// maxFindings bounds the findings after the headline, and maxQuiet those of them about single
// sources that let nothing through (the sources table has them), so that the answer fits a screen.
const (
	maxFindings = 6
	maxQuiet    = 2
)

var reachedRank = map[string]int{ReachedWouldBlock: 0, ReachedForwarded: 1, ReachedPickles: 2, ReachedUnknown: 3, ReachedNothing: 4}

// hostileConnections: a source's connections recorded, those of its job apart.
func hostileConnections(st *SourceStats) uint64 {
	n := st.Connections - st.ByVerdict[string(audit.VerdictPassed)]
	if st.Role == RoleMixed {
		n -= st.ByVerdict[string(audit.VerdictOpen)]
	}
	return n
}

func findingOf(st *SourceStats) Finding {
	return Finding{Verdict: st.Reached, IP: st.IP, Identity: st.Identity, Sources: 1, Connections: hostileConnections(st),
		StoreBytes: st.StoreBytes, Messages: st.Messages, WouldBlock: st.WouldBlock}
}

func (f *Finding) add(g Finding) {
	f.Sources += g.Sources
	f.Connections += g.Connections
	f.StoreBytes += g.StoreBytes
	f.Messages += g.Messages
	f.WouldBlock += g.WouldBlock
}

// reached sums the hostile sources of all (ranked) and words the findings; listed is how many
// sources of the ranking are shown (0: all).
func reached(all []SourceStats, listed int) Reached {
	r := Reached{Verdict: ReachedNone, Findings: []Finding{}}
	type entry struct {
		st   *SourceStats
		rank int // in all
	}
	var hostile []entry
	for i := range all {
		st := &all[i]
		if st.Reached == "" {
			continue
		}
		hostile = append(hostile, entry{st, i})
		r.HostileSources++
		r.Connections += hostileConnections(st)
		r.StoreBytes += st.StoreBytes
		r.StoreConnections += st.StoreConnections
		r.Messages += st.Messages
		r.WouldBlock += st.WouldBlock
		r.Unrecorded += st.Unrecorded
	}
	if len(hostile) == 0 {
		r.Findings = append(r.Findings, Finding{Verdict: ReachedNone, Headline: true, Text: "no hostile source in these logs"})
		r.Findings = append(r.Findings, jobPickles(all, maxFindings)...)
		return r
	}
	slices.SortStableFunc(hostile, func(a, b entry) int {
		return cmp.Or(cmp.Compare(reachedRank[a.st.Reached], reachedRank[b.st.Reached]),
			cmp.Compare(b.st.WouldBlock, a.st.WouldBlock), cmp.Compare(b.st.StoreBytes, a.st.StoreBytes), cmp.Compare(a.rank, b.rank))
	})
	r.Verdict = hostile[0].st.Reached

	// The headline: the worst verdict, in its one source's words or over its sources.
	head := Finding{Verdict: r.Verdict, Headline: true}
	var worst []*SourceStats
	for _, h := range hostile {
		if h.st.Reached == r.Verdict {
			head.add(findingOf(h.st))
			worst = append(worst, h.st)
		}
	}
	if len(worst) == 1 {
		head = findingOf(worst[0])
		head.Headline = true
		head.Text = headlinePrefix[r.Verdict] + sourceSentence(worst[0])
	} else {
		head.Text = headlinePrefix[r.Verdict] + groupSentence(head, "")
	}
	r.Findings = append(r.Findings, head)

	room := maxFindings
	for _, verdict := range []string{ReachedWouldBlock, ReachedForwarded, ReachedPickles, ReachedUnknown, ReachedNothing} {
		rest := Finding{Verdict: verdict}
		quiet := 0
		for _, h := range hostile {
			if h.st.Reached != verdict || len(worst) == 1 && h.st == worst[0] {
				continue
			}
			shown := verdict == ReachedWouldBlock || verdict == ReachedForwarded || verdict == ReachedPickles
			if !shown && (listed <= 0 || h.rank < listed) && quiet < maxQuiet {
				shown = true
				quiet++
			}
			if shown && room > 1 {
				f := findingOf(h.st)
				f.Text = sourceSentence(h.st)
				r.Findings = append(r.Findings, f)
				room--
				continue
			}
			rest.add(findingOf(h.st))
		}
		if rest.Sources == 0 || verdict == r.Verdict && rest.Sources == head.Sources {
			continue // none, or the headline said it all
		}
		rest.Text = groupSentence(rest, "other ")
		r.Findings = append(r.Findings, rest)
		room--
	}
	r.Findings = append(r.Findings, jobPickles(all, room)...)
	return r
}

var headlinePrefix = map[string]string{
	ReachedWouldBlock: "YES, IN MONITOR MODE: ",
	ReachedForwarded:  "YES: ",
	ReachedPickles:    "PICKLES PASSED: ",
	ReachedUnknown:    "NOT RECORDED: ",
	ReachedNothing:    "NO: ",
}

// sourceSentence words what became of one hostile source's traffic.
func sourceSentence(st *SourceStats) string {
	ip := st.label()
	if st.Identity != "" {
		ip += " (" + st.addressesText() + ")"
	}
	conns := hostileConnections(st)
	var b strings.Builder
	switch st.Reached {
	case ReachedWouldBlock:
		// The rules of what got through: blocked events of the source are not "monitor mode".
		rules := st.WouldBlockRules
		if len(rules) == 0 {
			rules = st.Rules // would_block flow records, no such event
		}
		fmt.Fprintf(&b, "%s from %s reached the store (monitor mode: %s)", plural(st.WouldBlock, "hostile message"), ip, countsText(rules))
		if st.StoreBytes > 0 {
			fmt.Fprintf(&b, "; %s forwarded in %s", bytesText(st.StoreBytes), plural(st.StoreConnections, "connection"))
		}
	case ReachedForwarded:
		fmt.Fprintf(&b, "%s from %s reached the store in %s of %s", bytesText(st.StoreBytes), ip,
			group(st.StoreConnections), plural(conns, "connection"))
		if st.Messages > 0 {
			fmt.Fprintf(&b, " (%s", plural(st.Messages, "message"))
			if len(st.Ops) > 0 {
				fmt.Fprintf(&b, ": %s", countsText(st.Ops))
			}
			b.WriteString(")")
		}
	case ReachedPickles:
		fmt.Fprintf(&b, "%s from %s passed the policy and reached the store; nothing of its other %s did",
			picklesText(st), ip, plural(conns, "connection"))
	case ReachedUnknown:
		var blocked uint64
		for _, n := range st.Rules {
			blocked += n
		}
		fmt.Fprintf(&b, "no flow records for %s: its %s never reached the store, what came before is not recorded",
			ip, plural(blocked, "blocked message"))
	default:
		if conns == 0 {
			fmt.Fprintf(&b, "nothing from %s reached the store (no connection recorded; %s)", ip, plural(st.Estimated, "event"))
		} else {
			fmt.Fprintf(&b, "nothing from %s reached the store (0 B forwarded in %s)", ip, plural(conns, "connection"))
		}
	}
	if st.Reached != ReachedPickles && st.Pickles+st.Base64Pickles > 0 {
		fmt.Fprintf(&b, "; %s passed the policy", picklesText(st))
	}
	if st.PassedStoreBytes > 0 {
		fmt.Fprintf(&b, "; its %s that passed forwarded %s", plural(st.PassedStoreConnections, "connection"),
			bytesText(st.PassedStoreBytes))
	}
	if st.Unrecorded > 0 && st.Reached != ReachedUnknown {
		fmt.Fprintf(&b, "; %s sampled away: what they forwarded is not recorded", plural(st.Unrecorded, "more connection"))
	}
	return b.String()
}

// groupSentence words a verdict over several sources; other is "" or "other ".
func groupSentence(f Finding, other string) string {
	srcs := plural(uint64(f.Sources), other+"hostile source")
	switch f.Verdict {
	case ReachedWouldBlock:
		s := fmt.Sprintf("%s from %s reached the store (would_block)", plural(f.WouldBlock, "hostile message"), srcs)
		if f.StoreBytes > 0 {
			s += "; " + bytesText(f.StoreBytes) + " forwarded"
		}
		return s
	case ReachedForwarded:
		return fmt.Sprintf("%s from %s reached the store (%s)", bytesText(f.StoreBytes), srcs, plural(f.Messages, "message"))
	case ReachedPickles:
		return fmt.Sprintf("pickles from %s passed the policy and reached the store", srcs)
	case ReachedUnknown:
		return fmt.Sprintf("no flow records for %s: their blocked messages never reached the store, what came before is not recorded", srcs)
	}
	if f.Connections == 0 {
		return fmt.Sprintf("nothing from the %s reached the store (no connection recorded)", srcs)
	}
	return fmt.Sprintf("nothing from the %s reached the store (0 B forwarded in %s)", srcs, plural(f.Connections, "connection"))
}

// picklesText words what pickles a source stored: how many of each kind, and on which keys.
func picklesText(st *SourceStats) string {
	var kinds []string
	if st.Pickles > 0 {
		kinds = append(kinds, plural(st.Pickles, "pickle"))
	}
	if st.Base64Pickles > 0 {
		kinds = append(kinds, plural(st.Base64Pickles, "base64 pickle"))
	}
	s := strings.Join(kinds, " and ")
	if len(st.PickleKeys) > 0 {
		s += " (on " + strings.Join(st.PickleKeys, ", ")
		if len(st.PickleKeys) >= MaxPickleKeys {
			s += ", ..."
		}
		s += ")"
	}
	return s
}

// jobPickles are findings for the sources that are not hostile and stored pickles: not a verdict,
// but what a reader of those keys will unpickle, each value having passed the allow-list.
func jobPickles(all []SourceStats, room int) []Finding {
	var out []Finding
	for i := range all {
		st := &all[i]
		if st.Reached != "" || st.Pickles+st.Base64Pickles == 0 || room <= 0 {
			continue
		}
		out = append(out, Finding{Verdict: ReachedPickles, IP: st.IP, Identity: st.Identity, Sources: 1,
			Connections: st.Connections, StoreBytes: st.PassedStoreBytes,
			Text: fmt.Sprintf("%s source %s stored %s: each passed the pickle allow-list", st.Role, st.label(), picklesText(st))})
		room--
	}
	return out
}
