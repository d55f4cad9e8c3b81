package admission

import (
	"net/netip"
	"time"
)

// SourceState is what a Gate remembers of one source, or of one IPv6 network (Net set, Addr not),
// as one process hands its gate to the next (serve's upgrade in place). Times are absolute: the
// two processes share the host's clock. (Earlier builds also sent identities' bans, with an
// Identity and no Addr: decoding drops the field and Restore the entry, as no violation bans an
// identity.)
type SourceState struct {
	Addr        netip.Addr
	Net         netip.Prefix
	Tokens      float64
	Refilled    time.Time
	Filled      bool
	BannedUntil time.Time // zero: not banned
	BannedAt    time.Time
	Violations  []time.Time
	// ViolationAddrs: a network's, whose each violation was.
	ViolationAddrs []netip.Addr
}

// State is the gate's memory of its sources and networks: bans, violations within the window and
// rate buckets. Connection counts are not in it: they belong to the connections, each counted
// again by Adopt.
func (g *Gate) State() []SourceState {
	g.mu.Lock()
	defer g.mu.Unlock()
	abs := func(d time.Duration) time.Time { return g.epoch.Add(d) }
	out := make([]SourceState, 0, len(g.sources)+len(g.bannedNets))
	for a, st := range g.sources {
		ss := SourceState{Addr: a, Tokens: st.tokens, Filled: st.filled}
		if st.filled {
			ss.Refilled = abs(st.refilled)
		}
		ss.BannedUntil, ss.BannedAt, ss.Violations = st.carriedBan(abs)
		out = append(out, ss)
	}
	for p, nt := range g.nets {
		if nt.bannedUntil == 0 && len(nt.violations) == 0 {
			continue // a count of connections only
		}
		ss := SourceState{Net: p}
		if nt.bannedUntil != 0 {
			ss.BannedUntil, ss.BannedAt = abs(nt.bannedUntil), abs(nt.bannedAt)
		}
		for _, v := range nt.violations {
			ss.Violations = append(ss.Violations, abs(v.at))
			ss.ViolationAddrs = append(ss.ViolationAddrs, v.addr)
		}
		out = append(out, ss)
	}
	return out
}

// Restore adds what another gate remembered of its sources and networks (State). A source or
// network this gate already knows keeps its own state.
func (g *Gate) Restore(states []SourceState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rel := func(t time.Time) time.Duration { return t.Sub(g.epoch) }
	for _, ss := range states {
		if ss.Net.IsValid() {
			g.restoreNet(ss, rel)
			continue
		}
		src := ss.Addr.Unmap()
		if !src.IsValid() || g.sources[src] != nil || len(g.sources) >= g.maxSources {
			continue
		}
		st := &sourceState{tokens: ss.Tokens, filled: ss.Filled}
		if ss.Filled {
			st.refilled = rel(ss.Refilled)
		}
		if st.restoreBan(ss.BannedUntil, ss.BannedAt, ss.Violations, rel) {
			g.banned[src] = st
		}
		g.sources[src] = st
	}
}

// carriedBan is st's ban and violations in absolute times, as one gate hands them to the next
// (zero times: no ban).
func (st *sourceState) carriedBan(abs func(time.Duration) time.Time) (until, at time.Time, violations []time.Time) {
	if st.bannedUntil != 0 {
		until, at = abs(st.bannedUntil), abs(st.bannedAt)
	}
	for _, v := range st.violations {
		violations = append(violations, abs(v))
	}
	return until, at, violations
}

// restoreBan takes back what carriedBan gave, and reports whether the ban is still on (one that
// ran out meanwhile is dropped).
func (st *sourceState) restoreBan(until, at time.Time, violations []time.Time, rel func(time.Time) time.Duration) bool {
	for _, v := range violations {
		st.violations = append(st.violations, rel(v))
	}
	if until.IsZero() {
		return false
	}
	if st.bannedUntil = rel(until); st.bannedUntil <= 0 {
		st.bannedUntil = 0
		return false
	}
	st.bannedAt = rel(at)
	return true
}

// restoreNet adds a network's state, as Restore does a source's.
func (g *Gate) restoreNet(ss SourceState, rel func(time.Time) time.Duration) {
	p := ss.Net.Masked()
	if g.nets[p] != nil || len(g.nets) >= g.maxSources || len(ss.ViolationAddrs) != len(ss.Violations) {
		return
	}
	nt := &netState{}
	if !ss.BannedUntil.IsZero() {
		if nt.bannedUntil = rel(ss.BannedUntil); nt.bannedUntil <= 0 {
			nt.bannedUntil = 0
		} else {
			nt.bannedAt = rel(ss.BannedAt)
			g.bannedNets[p] = nt
		}
	}
	for i, v := range ss.Violations {
		nt.violations = append(nt.violations, netViolation{at: rel(v), addr: ss.ViolationAddrs[i]})
	}
	g.nets[p] = nt
}

// Adopt counts a connection from src that another process admitted and hands over, whatever the
// caps say now: it is live, and refusing it would cut it. It returns the release func, as Admit.
func (g *Gate) Adopt(src netip.Addr) (release func()) {
	src = src.Unmap()
	cfg := g.cfg.Load()
	g.mu.Lock()
	defer g.mu.Unlock()
	// Beyond maxSources if need be: the connection exists.
	st := g.sources[src]
	if st == nil && (cfg.PerSourceConnections > 0 || cfg.PerSourceRate > 0) {
		st = &sourceState{}
		g.sources[src] = st
	}
	prefix := cfg.netOf(src)
	nt := g.nets[prefix]
	if nt == nil && cfg.PerPrefixConnections > 0 {
		nt = &netState{}
		g.nets[prefix] = nt
	}
	g.active++
	if st != nil {
		st.conns++
	}
	if nt != nil {
		nt.conns++
	}
	return g.releaser(st, nt)
}
