package admission

import (
	"slices"
	"time"
)

// Reasons a connection whose TLS handshake proved an identity was refused (AdmitIdentity).
// Violations never ban an identity, only the source (Gate.Violation): a job's ranks often share one
// identity (a service account's SPIFFE ID), and its ban would refuse every host of the job, where a
// source's ban throttles a source serving a job instead of refusing it.
const (
	IdentityDenied      Reason = "identity_denied"      // identity matches access.deny-identities
	IdentityConnections Reason = "identity_connections" // caps.per-identity-connections
	IdentityTable       Reason = "identity_table_full"  // no room to track a new identity
)

// identityState is what the gate counts of one identity: its open connections.
type identityState struct {
	conns int
}

// AdmitIdentity admits a connection, already admitted by address (Admit), whose TLS handshake
// proved identity id (identity.Peer.ID) and the certificate's other names (identity.Peer.Names):
// access.deny-identities refuses it if any of them matches, since tls.allow admits by any; "" (a
// plaintext connection) is always admitted. When
// admitted (reason ""), release must be called when the connection ends, besides Admit's
// release; calling it again does nothing. When refused, release is nil and the caller releases
// Admit's.
//
// Checks run in this order: access.deny-identities, caps.per-identity-connections. Without that
// cap it takes no lock.
func (g *Gate) AdmitIdentity(id string, names ...string) (release func(), reason Reason) {
	if id == "" {
		return noRelease, ""
	}
	cfg := g.cfg.Load()
	if cfg.DeniesIdentity(id, names) {
		return nil, IdentityDenied
	}
	if cfg.PerIdentityConnections <= 0 {
		return noRelease, ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
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
