package identity

import (
	"fmt"
	"strings"

	"github.com/storeguard/storeguard/idpattern"
)

// Allow is the identities a guard accepts (config key tls.allow), in idpattern's syntax, the
// one that access.deny-identities and a policy file's identities use too. The zero value allows
// any certificate that chains to the roots.
type Allow struct {
	set idpattern.Set
}

// AllowOf is the Allow of patterns parsed already (config.Parse).
func AllowOf(set idpattern.Set) Allow { return Allow{set: set} }

// PatternError is a tls.allow pattern ParseAllow refused.
type PatternError struct {
	Index   int
	Pattern string
	Problem string // idpattern's word on it
}

func (e *PatternError) Error() string {
	return fmt.Sprintf("tls.allow[%d]: %s", e.Index, e.Problem)
}

// ParseAllow reads tls.allow patterns: spiffe://td/path, uri:, dns:, cn:, with the globs
// idpattern documents.
func ParseAllow(patterns []string) (Allow, error) {
	var a Allow
	for i, s := range patterns {
		p, err := idpattern.Parse(s)
		if err != nil {
			return Allow{}, &PatternError{Index: i, Pattern: s, Problem: err.Error()}
		}
		a.set = append(a.set, p)
	}
	return a, nil
}

// Permits says whether a pattern matches any name the certificate vouches for (Peer.Names), or
// there are no patterns. Every name counts, not only Peer.ID: the CA signed them all, and a
// certificate with a SPIFFE ID and DNS SANs can then be allowed by either.
func (a Allow) Permits(p Peer) bool {
	if a.Empty() {
		return true
	}
	for _, name := range p.Names() {
		if a.set.Match(name) {
			return true
		}
	}
	return false
}

// Empty says no pattern was given: only the roots decide.
func (a Allow) Empty() bool { return len(a.set) == 0 }

func (a Allow) String() string {
	if a.Empty() {
		return "any certificate from the roots"
	}
	return strings.Join(a.set.Strings(), ", ")
}
