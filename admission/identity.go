package admission

import (
	"net/netip"
	"time"
)

// Reasons a connection whose TLS handshake proved an identity was refused (AdmitIdentity).
const (
	IdentityDenied      Reason = "identity_denied"      // identity matches access.deny-identities
	IdentityBanned      Reason = "identity_banned"      // identity is serving a ban
	IdentityConnections Reason = "identity_connections" // caps.per-identity-connections
	IdentityTable       Reason = "identity_table_full"  // no room to track a new identity
)

// identityState is what the gate remembers of one identity: its open connections, and its
// violations and ban, which follow it from host to host.
type identityState struct {
	conns int
	ban
	violations []time.Duration // as sourceState.violations
}

// AdmitIdentity admits a connection, already admitted by address (Admit), whose TLS handshake
// proved identity id (identity.Peer.ID); "" (a plaintext connection) is always admitted. When
// admitted (reason ""), release must be called when the connection ends, besides Admit's
// release; calling it again does nothing. When refused, release is nil and the caller releases
// Admit's.
//
// Checks run in this order: access.deny-identities, the identity's ban, caps.per-identity-
// connections. A banned identity is refused outright, wherever it comes from: unlike an address, a
// certificate is not shared by a scanner behind NAT with a job.
func (g *Gate) AdmitIdentity(id string) (release func(), reason Reason) {
	if id == "" {
		return noRelease, ""
	}
	cfg := g.cfg.Load()
	if cfg.DenyIdentities.Match(id) {
		return nil, IdentityDenied
	}
	if cfg.PerIdentityConnections <= 0 && !g.anyIdentityState.Load() {
		return noRelease, "" // nothing to count and no identity ever violated: no lock
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.since()
	is := g.identities[id]
	if is != nil && g.identityBannedLocked(id, is, now) {
		return nil, IdentityBanned
	}
	if cfg.PerIdentityConnections <= 0 {
		return noRelease, ""
	}
	if is == nil {
		if is = g.newIdentityLocked(id, cfg, now); is == nil {
			return nil, IdentityTable
		}
	}
	if is.conns >= cfg.PerIdentityConnections {
		return nil, IdentityConnections
	}
	is.conns++
	return g.identityReleaser(is), ""
}

func noRelease() {}

// identityReleaser gives back a connection counted in is, once.
func (g *Gate) identityReleaser(is *identityState) func() {
	released := false
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if released {
			return
		}
		released = true
		is.conns--
	}
}

// ViolationBy records a violation by src, as Violation does, and, when the violating connection
// had proved identity id, by the identity too: BanViolations of them within BanWindow ban the
// identity (identityBanned), from whichever hosts they came, so that a certificate that hops
// hosts stays banned. A source in BanExempt counts for neither: its traffic is trusted not to be
// banned, identities included. Failed handshakes count for the source alone (Violation(src)).
func (g *Gate) ViolationBy(src netip.Addr, id string) (banned netip.Prefix, identityBanned bool) {
	banned = g.Violation(src)
	if id == "" {
		return banned, false
	}
	cfg := g.cfg.Load()
	if cfg.BanViolations <= 0 || containsAddr(cfg.BanExempt, src.Unmap()) {
		return banned, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.since()
	is := g.identities[id]
	if is == nil {
		if is = g.newIdentityLocked(id, cfg, now); is == nil {
			return banned, false
		}
	}
	if g.identityBannedLocked(id, is, now) {
		return banned, false
	}
	if !violationLog(&is.violations, cfg, now) {
		return banned, false
	}
	is.violations = nil
	is.bannedAt, is.bannedUntil = now, banEnd(cfg, now)
	g.bannedIdentities[id] = is
	return banned, true
}

// identityBannedLocked reports whether is is banned at now, clearing a ban that has run out.
func (g *Gate) identityBannedLocked(id string, is *identityState, now time.Duration) bool {
	return inForce(&is.ban, g.bannedIdentities, id, now)
}

// newIdentityLocked adds state for id, as newSourceLocked does for a source.
func (g *Gate) newIdentityLocked(id string, cfg *Config, now time.Duration) *identityState {
	if !g.roomLocked(func() int { return len(g.identities) }, cfg, now) {
		return nil
	}
	is := &identityState{}
	g.identities[id] = is
	g.anyIdentityState.Store(true)
	return is
}

func (is *identityState) idle(cfg *Config, now time.Duration) bool {
	if is.conns > 0 || is.bannedUntil != 0 {
		return false
	}
	n := len(is.violations)
	return n == 0 || now-is.violations[n-1] >= cfg.BanWindow
}

// AdoptIdentity counts a connection of identity id that another process admitted and hands over,
// whatever the caps say now, as Adopt does for its address. It returns the release func.
func (g *Gate) AdoptIdentity(id string) (release func()) {
	if id == "" {
		return noRelease
	}
	cfg := g.cfg.Load()
	if cfg.PerIdentityConnections <= 0 {
		return noRelease
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	is := g.identities[id]
	if is == nil { // beyond maxSources if need be: the connection exists
		is = &identityState{}
		g.identities[id] = is
		g.anyIdentityState.Store(true)
	}
	is.conns++
	return g.identityReleaser(is)
}
