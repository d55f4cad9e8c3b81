package report

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"

	"github.com/storeguard/storeguard/audit"
)

// Summary returns the totals so far, sorted.
func (z *Summarizer) Summary() Summary {
	s := z.sum
	s.MalformedAt = slices.Clone(s.MalformedAt)
	s.Scans = slices.Clone(s.Scans)
	s.Estimated = s.Events + s.Suppressed
	s.ConnectionsEstimated = s.Connections + s.ConnectionsSuppressed
	s.FirstSeen, s.LastSeen = s.FirstSeen.UTC(), s.LastSeen.UTC()
	s.ByAction = sortedCounts(z.byAction)
	s.Ops, s.HostileOps, s.Fields = sortedCounts(z.ops), sortedCounts(z.hostOps), sortedCounts(z.fields)

	s.ByVerdict = make([]ConnCount, 0, len(z.verdicts))
	for v, c := range z.verdicts {
		if c[0]+c[1] > 0 {
			s.ByVerdict = append(s.ByVerdict, ConnCount{string(v), c[0], c[1], c[0] + c[1]})
		}
	}
	slices.SortFunc(s.ByVerdict, func(a, b ConnCount) int {
		return cmp.Or(cmp.Compare(b.Estimated, a.Estimated), cmp.Compare(a.Key, b.Key))
	})
	s.ByRule = make([]RuleStats, 0, len(z.rules))
	for _, r := range z.rules {
		st := r.stats
		st.Estimated, st.Sources = st.Events+st.Suppressed, len(r.sources)
		s.ByRule = append(s.ByRule, st)
	}
	slices.SortFunc(s.ByRule, func(a, b RuleStats) int {
		return cmp.Or(cmp.Compare(b.Estimated, a.Estimated), cmp.Compare(b.Events, a.Events), cmp.Compare(a.Key, b.Key))
	})
	s.Denials, s.Bans = reasonStats(z.denials), reasonStats(z.bans)
	s.Handshakes = handshakeStats(z.handshakes)
	s.Policy = z.policy.summary()
	s.Probes = make([]ProbeStats, 0, len(z.probes))
	for _, p := range z.probes {
		st := p.stats
		st.Sources = len(p.sources)
		s.Probes = append(s.Probes, st)
	}
	slices.SortFunc(s.Probes, func(a, b ProbeStats) int {
		return cmp.Or(cmp.Compare(b.Connections+b.Events, a.Connections+a.Events), cmp.Compare(a.Key, b.Key))
	})

	s.PerHour = make([]HourCount, 0, len(z.perHour))
	for h, n := range z.perHour {
		s.PerHour = append(s.PerHour, HourCount{h, n})
	}
	slices.SortFunc(s.PerHour, func(a, b HourCount) int { return a.Hour.Compare(b.Hour) })

	s.Sources = make([]SourceStats, 0, len(z.sources))
	for _, src := range z.sources {
		st := src.stats
		st.ByVerdict, st.Ops, st.Rules = maps.Clone(st.ByVerdict), maps.Clone(st.Ops), maps.Clone(st.Rules)
		st.WouldBlockRules = maps.Clone(st.WouldBlockRules)
		st.Probes = slices.Clone(st.Probes)
		st.PickleKeys = slices.Clone(st.PickleKeys)
		if len(src.ips) > 0 {
			st.IPs = slices.Clone(src.ips)
			slices.SortFunc(st.IPs, netip.Addr.Compare)
			st.IPs = st.IPs[:min(len(st.IPs), MaxIdentityIPs)]
		}
		st.Estimated = st.Exact + st.Suppressed
		st.FirstSeen, st.LastSeen = st.FirstSeen.UTC(), st.LastSeen.UTC()
		st.Role = src.role()
		switch st.Role {
		case RoleHostile:
			// A hostile source's open connection is no job's.
			st.StoreBytes, st.Messages, st.StoreConnections = st.StoreBytes+src.openBytes, st.Messages+src.openMessages, st.StoreConnections+src.openConns
			fallthrough
		case RoleMixed:
			st.Reached = reachedOf(&st)
			s.HostileSources++
		case RoleJob:
			s.JobSources++
		}
		s.Sources = append(s.Sources, st)
	}
	slices.SortFunc(s.Sources, func(a, b SourceStats) int {
		return cmp.Or(cmp.Compare(roleRank(a.Role), roleRank(b.Role)), cmp.Compare(b.activity(), a.activity()),
			cmp.Compare(b.Exact, a.Exact), a.IP.Compare(b.IP), cmp.Compare(a.Identity, b.Identity))
	})
	s.TotalSources = len(s.Sources)
	s.Timeline = z.tl.summary(s.Sources[:min(len(s.Sources), MaxTimelineSources)])
	s.all = s.Sources
	s.Reached = reached(s.all, 0)
	return s
}

// activity ranks sources: events and connections, sampled ones included.
func (st *SourceStats) activity() uint64 {
	return st.Estimated + st.Connections + st.ConnectionsSuppressed
}

func roleRank(role string) int {
	switch role {
	case RoleHostile, RoleMixed:
		return 0
	case RoleUnknown:
		return 1
	}
	return 2
}

// reachedOf is what became of a hostile or mixed source's traffic.
func reachedOf(st *SourceStats) string {
	switch {
	case st.WouldBlock > 0 || st.ByVerdict[string(audit.VerdictWouldBlock)] > 0:
		return ReachedWouldBlock
	case st.StoreBytes > 0:
		return ReachedForwarded
	case st.Pickles+st.Base64Pickles > 0:
		return ReachedPickles
	case st.Connections == 0 && st.Rules != nil:
		return ReachedUnknown // blocked events and no flow records: a log from before them
	}
	return ReachedNothing
}

func reasonStats(m map[string]*reasonAcc) []ReasonStats {
	out := make([]ReasonStats, 0, len(m))
	for _, r := range m {
		st := r.stats
		st.Sources = len(r.sources)
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b ReasonStats) int {
		return cmp.Or(cmp.Compare(b.Events+b.Suppressed+b.Connections, a.Events+a.Suppressed+a.Connections), cmp.Compare(a.Key, b.Key))
	})
	return out
}

func handshakeStats(m map[string]*reasonAcc) []HandshakeStats {
	if len(m) == 0 {
		return nil
	}
	out := make([]HandshakeStats, 0, len(m))
	for _, r := range m {
		out = append(out, HandshakeStats{Key: r.stats.Key, Events: r.stats.Events, Suppressed: r.stats.Suppressed,
			Connections: r.stats.Connections, Sources: len(r.sources), IPs: slices.Clone(r.ips)})
	}
	slices.SortFunc(out, func(a, b HandshakeStats) int {
		return cmp.Or(cmp.Compare(b.Refusals(), a.Refusals()), cmp.Compare(a.Key, b.Key))
	})
	return out
}

func sortedCounts(m map[string]uint64) []Count {
	out := make([]Count, 0, len(m))
	for k, n := range m {
		out = append(out, Count{k, n})
	}
	slices.SortFunc(out, func(a, b Count) int {
		return cmp.Or(cmp.Compare(b.Events, a.Events), cmp.Compare(a.Key, b.Key))
	})
	return out
}

// Top keeps the n first sources of the ranking (hostile first, then most events and connections) and
// their timelines; n <= 0 keeps all. Reached's findings name the sources kept, and every source
// that let anything through.
func (s Summary) Top(n int) Summary {
	all := s.all
	if all == nil {
		all = s.Sources
	}
	s.Reached = reached(all, n)
	if n > 0 && len(s.Sources) > n {
		s.Sources = s.Sources[:n:n]
		kept := s.Timeline.Sources[:0:0]
		for _, st := range s.Timeline.Sources {
			if slices.ContainsFunc(s.Sources, func(src SourceStats) bool { return src.IP == st.IP && src.Identity == st.Identity }) {
				kept = append(kept, st)
			}
		}
		s.Timeline.Sources = kept
	}
	return s
}
