package admission

import (
	"net/netip"
	"slices"
	"time"
)

// Reasons a connection whose TLS handshake proved an identity was refused (AdmitIdentity; and
// IdentityBanned, proven.go).
const (
	IdentityDenied      Reason = "identity_denied"      // identity matches access.deny-identities
	IdentityConnections Reason = "identity_connections" // caps.per-identity-connections
	IdentityTable       Reason = "identity_table_full"  // no room to track a new identity
)

// identityState is what the gate counts of one identity: its open connections.
type identityState struct {
	conns int
}

// AdmitIdentity admits a connection from src, admitted by address already (AdmitToProve), whose
// TLS handshake proved identity id (identity.Peer.ID) and the certificate's other names
// (identity.Peer.Names): access.deny-identities refuses it if any of them matches, since tls.allow
// admits by any; a ban of id at src (ProvenViolation) refuses it unless src serves a job (serving,
// as Admit's), then throttles it. "" (a plaintext connection) is always admitted. When admitted
// (reason ""), release must be called when the connection ends, besides the address's release;
// calling it again does nothing. When refused, release is nil and the caller releases the
// address's.
//
// Checks run in this order: access.deny-identities, the ban of id at src,
// caps.per-identity-connections. Without that cap, and while no identity is banned anywhere, it
// takes no lock.
func (g *Gate) AdmitIdentity(src netip.Addr, serving bool, id string, names ...string) (release func(), reason Reason) {
	if id == "" {
		return noRelease, ""
	}
	cfg := g.cfg.Load()
	if cfg.DeniesIdentity(id, names) {
		return nil, IdentityDenied
	}
	if cfg.PerIdentityConnections <= 0 && g.provenBans.Load() == 0 {
		return noRelease, ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if reason := g.provenBanLocked(cfg, src, id, serving); reason != "" {
		return nil, reason
	}
	if cfg.PerIdentityConnections <= 0 {
		return noRelease, ""
	}
	is := g.identities[id]
	if is == nil {
		if is = g.newIdentityLocked(id, cfg, g.since()); is == nil {
			return nil, IdentityTable
		}
	}
	if is.conns >= cfg.PerIdentityConnections {
		return nil, IdentityConnections
	}
	is.conns++
	return g.identityReleaser(is), ""
}

// DeniesIdentity reports whether access.deny-identities matches identity id or any of the
// certificate's other names.
func (c *Config) DeniesIdentity(id string, names []string) bool {
	return c.DenyIdentities.Match(id) || slices.ContainsFunc(names, c.DenyIdentities.Match)
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

// newIdentityLocked adds state for id, as newSourceLocked does for a source.
func (g *Gate) newIdentityLocked(id string, cfg *Config, now time.Duration) *identityState {
	if !g.roomLocked(func() int { return len(g.identities) }, cfg, now) {
		return nil
	}
	is := &identityState{}
	g.identities[id] = is
	return is
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
	}
	is.conns++
	return g.identityReleaser(is)
}
