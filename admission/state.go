package admission

import (
	"net/netip"
	"time"
)

// SourceState is what a Gate remembers of one source, as one process hands its gate to the next
// (serve's upgrade in place). Times are absolute: the two processes share the host's clock.
type SourceState struct {
	Addr        netip.Addr
	Tokens      float64
	Refilled    time.Time
	Filled      bool
	BannedUntil time.Time // zero: not banned
	Violations  []time.Time
}

// State is the gate's memory of its sources: bans, violations within the window and rate buckets.
// Connection counts are not in it: they belong to the connections, each counted again by Adopt.
func (g *Gate) State() []SourceState {
	g.mu.Lock()
	defer g.mu.Unlock()
	abs := func(d time.Duration) time.Time { return g.epoch.Add(d) }
	out := make([]SourceState, 0, len(g.sources))
	for a, st := range g.sources {
		ss := SourceState{Addr: a, Tokens: st.tokens, Filled: st.filled}
		if st.filled {
			ss.Refilled = abs(st.refilled)
		}
		if st.bannedUntil != 0 {
			ss.BannedUntil = abs(st.bannedUntil)
		}
		for _, v := range st.violations {
			ss.Violations = append(ss.Violations, abs(v))
		}
		out = append(out, ss)
	}
	return out
}

// Restore adds what another gate remembered of its sources (State). A source this gate already
// knows keeps its own state.
func (g *Gate) Restore(states []SourceState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rel := func(t time.Time) time.Duration { return t.Sub(g.epoch) }
	for _, ss := range states {
		src := ss.Addr.Unmap()
		if !src.IsValid() || g.sources[src] != nil || len(g.sources) >= g.maxSources {
			continue
		}
		st := &sourceState{tokens: ss.Tokens, filled: ss.Filled}
		if ss.Filled {
			st.refilled = rel(ss.Refilled)
		}
		if !ss.BannedUntil.IsZero() {
			if st.bannedUntil = rel(ss.BannedUntil); st.bannedUntil <= 0 {
				st.bannedUntil = 0 // ran out meanwhile
			} else {
				g.banned[src] = st
			}
		}
		for _, v := range ss.Violations {
			st.violations = append(st.violations, rel(v))
		}
		g.sources[src] = st
	}
}

// Adopt counts a connection from src that another process admitted and hands over, whatever the
// caps say now: it is live, and refusing it would cut it. It returns the release func, as Admit.
func (g *Gate) Adopt(src netip.Addr) (release func()) {
	src = src.Unmap()
	cfg := g.cfg.Load()
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.sources[src]
	if st == nil && (cfg.PerSourceConnections > 0 || cfg.PerSourceRate > 0) {
		st = &sourceState{} // beyond maxSources if need be: the connection exists
		g.sources[src] = st
	}
	g.active++
	if st != nil {
		st.conns++
	}
	return g.releaser(st)
}
