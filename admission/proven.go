package admission

import (
	"net/netip"
	"time"
)

// Proof beats address. A connection whose TLS handshake proved a job's identity is judged by that
// identity, never by what plaintext from its address earned: a neighbour on an IPv6 /64, a local
// user of a worker, or anything behind the worker's NAT can get the address banned by speaking
// plaintext to a port that wants TLS, and the worker's ranks, which prove who they are, must not
// pay for it. So a source that must handshake is admitted to the handshake past its address's or
// network's ban (AdmitToProve), and what its proven connections break counts against the identity
// at that address (ProvenViolation), whose ban (AdmitIdentity) refuses that identity from that
// address only: a job's hosts often share one identity (a service account's SPIFFE ID), and one
// host's ban must not refuse the others.

// IdentityBanned: a proven connection whose identity, at its address, is serving a ban earned by
// connections that proved it there.
const IdentityBanned Reason = "identity_banned"

// provenKey is an identity at an address: what proven connections' violations count against.
type provenKey struct {
	id   string
	addr netip.Addr
}

// AdmitToProve admits a connection from src as Admit does, for a source that must complete a TLS
// handshake before anything of it is judged: an address's or network's ban does not refuse it,
// since the ban was earned by connections that proved nothing, and this one's handshake decides
// (a failed one is refused; a proven one is judged by AdmitIdentity). Access lists, caps and
// rates apply as to any source.
func (g *Gate) AdmitToProve(src netip.Addr, serving bool) (release func(), reason Reason) {
	return g.admit(src, serving, true, true)
}

// ProvenViolation records a violation by a connection from src that proved identity id, and
// reports whether it started a ban of id at src: BanViolations of them within BanWindow, as
// Violation counts an address's. BanExempt addresses are exempt here too.
func (g *Gate) ProvenViolation(src netip.Addr, id string) (banned bool) {
	src = src.Unmap()
	cfg := g.cfg.Load()
	if cfg.BanViolations <= 0 || id == "" || containsAddr(cfg.BanExempt, src) {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.since()
	k := provenKey{id, src}
	st := g.proven[k]
	if st == nil {
		if !g.roomLocked(func() int { return len(g.proven) }, cfg, now) {
			return false
		}
		st = &sourceState{}
		g.proven[k] = st
	}
	if inForce(&st.ban, g.bannedProven, k, now) || !st.violation(cfg, now) {
		return false
	}
	st.violations = nil
	st.bannedAt, st.bannedUntil = now, banEnd(cfg, now)
	g.bannedProven[k] = st
	g.noteProvenBansLocked()
	return true
}

// noteProvenBansLocked publishes whether any identity is banned anywhere, after bannedProven
// changed: while none is, AdmitIdentity without a per-identity cap takes no lock.
func (g *Gate) noteProvenBansLocked() { g.provenBans.Store(int32(len(g.bannedProven))) }

// provenBanLocked decides on a proven connection of id from src by the ban of id at src:
// IdentityBanned while it lasts, unless src serves a job, whose hosts may then open ServingRate
// new connections a second (BanThrottled past it), as a banned address serving a job may.
func (g *Gate) provenBanLocked(cfg *Config, src netip.Addr, id string, serving bool) Reason {
	k := provenKey{id, src.Unmap()}
	st := g.proven[k]
	now := g.since()
	if st == nil || !inForce(&st.ban, g.bannedProven, k, now) {
		g.noteProvenBansLocked()
		return ""
	}
	if !serving || cfg.ServingRate <= 0 {
		return IdentityBanned
	}
	st.refillServing(cfg, st.bannedAt, now)
	if st.serving < 1 {
		return BanThrottled
	}
	st.serving--
	return ""
}

// sweepProvenLocked drops the proven states that carry nothing (Sweep).
func (g *Gate) sweepProvenLocked(cfg *Config, now time.Duration) {
	for k, st := range g.proven {
		inForce(&st.ban, g.bannedProven, k, now)
		if st.idle(cfg, now) {
			delete(g.proven, k)
		}
	}
	g.noteProvenBansLocked()
}

// ProvenState is what a Gate remembers of one identity at one address (ProvenViolation), as one
// process hands its gate to the next; kept apart from SourceState so that a build before it never
// takes an identity's ban for its address's.
type ProvenState struct {
	Identity    string
	Addr        netip.Addr
	BannedUntil time.Time // zero: not banned
	BannedAt    time.Time
	Violations  []time.Time
}

// ProvenStates is the gate's memory of identities at addresses: bans and violations within the
// window.
func (g *Gate) ProvenStates() []ProvenState {
	g.mu.Lock()
	defer g.mu.Unlock()
	abs := func(d time.Duration) time.Time { return g.epoch.Add(d) }
	out := make([]ProvenState, 0, len(g.proven))
	for k, st := range g.proven {
		ps := ProvenState{Identity: k.id, Addr: k.addr}
		ps.BannedUntil, ps.BannedAt, ps.Violations = st.carriedBan(abs)
		out = append(out, ps)
	}
	return out
}

// RestoreProven adds what another gate remembered (ProvenStates); what this gate knows already
// stays.
func (g *Gate) RestoreProven(states []ProvenState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rel := func(t time.Time) time.Duration { return t.Sub(g.epoch) }
	for _, ps := range states {
		k := provenKey{ps.Identity, ps.Addr.Unmap()}
		if k.id == "" || !k.addr.IsValid() || g.proven[k] != nil || len(g.proven) >= g.maxSources {
			continue
		}
		st := &sourceState{}
		if st.restoreBan(ps.BannedUntil, ps.BannedAt, ps.Violations, rel) {
			g.bannedProven[k] = st
		}
		g.proven[k] = st
	}
	g.noteProvenBansLocked()
}
