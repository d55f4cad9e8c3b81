package identity

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Allow is the identities a guard accepts (config key tls.allow). The zero value allows any
// certificate that chains to the roots.
type Allow struct {
	patterns []string
	match    []func(Peer) bool
}

// PatternError is a tls.allow pattern ParseAllow refused.
type PatternError struct {
	Pattern string
	Problem string
}

func (e *PatternError) Error() string {
	return fmt.Sprintf("tls.allow: %q: %s", e.Pattern, e.Problem)
}

// ParseAllow reads tls.allow patterns:
//   - "spiffe://td/path": the SPIFFE ID; a path segment "*" matches one segment, a last "**" one
//     or more. The trust domain is always exact.
//   - "dns:name": any DNS SAN, case-insensitively; "dns:*.example.com" matches one label in
//     place of the "*" (not example.com, not a.b.example.com, not a wildcard SAN).
//   - "uri:u": any URI SAN, exactly or with the same "*" and "**" path segments.
//   - "cn:name": the subject CN, exactly.
func ParseAllow(patterns []string) (Allow, error) {
	a := Allow{patterns: patterns}
	for _, p := range patterns {
		m, problem := parsePattern(p)
		if problem != "" {
			return Allow{}, &PatternError{Pattern: p, Problem: problem}
		}
		a.match = append(a.match, m)
	}
	return a, nil
}

// Permits says whether p is allowed: any pattern matches, or there are none.
func (a Allow) Permits(p Peer) bool {
	if a.Empty() {
		return true
	}
	for _, m := range a.match {
		if m(p) {
			return true
		}
	}
	return false
}

// Empty says no pattern was given: only the roots decide.
func (a Allow) Empty() bool { return len(a.match) == 0 }

func (a Allow) String() string {
	if a.Empty() {
		return "any certificate from the roots"
	}
	return strings.Join(a.patterns, ", ")
}

func parsePattern(p string) (func(Peer) bool, string) {
	kind, rest, _ := strings.Cut(p, ":")
	switch kind {
	case "spiffe":
		return parseSPIFFE(p)
	case "dns":
		return parseDNS(rest)
	case "uri":
		return parseURI(rest)
	case "cn":
		if rest == "" {
			return nil, "empty common name"
		}
		return func(peer Peer) bool { return peer.CommonName == rest }, ""
	}
	return nil, `want spiffe://trust-domain/path, dns:name, uri:uri or cn:name`
}

func parseSPIFFE(p string) (func(Peer) bool, string) {
	rest := strings.TrimPrefix(p, "spiffe://")
	if rest == p {
		return nil, "want spiffe://trust-domain/path"
	}
	td, path, _ := strings.Cut(rest, "/")
	if _, err := spiffeid.TrustDomainFromString(td); err != nil {
		return nil, "trust domain: " + err.Error()
	}
	if path == "" {
		return nil, "no path: name the workloads, e.g. spiffe://" + td + "/** for all of them"
	}
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if s == "*" || s == "**" {
			continue
		}
		if strings.Contains(s, "*") {
			return nil, fmt.Sprintf("path segment %q: a glob is a whole segment, * or **", s)
		}
		if err := spiffeid.ValidatePathSegment(s); err != nil {
			return nil, fmt.Sprintf("path segment %d: %v", i+1, err)
		}
	}
	if problem := checkDoubleStar(segs); problem != "" {
		return nil, problem
	}
	prefix := "spiffe://" + td + "/"
	return func(peer Peer) bool {
		id, ok := peer.spiffeID()
		return ok && strings.HasPrefix(id, prefix) && matchSegments(segs, strings.Split(id[len(prefix):], "/"))
	}, ""
}

func parseURI(rest string) (func(Peer) bool, string) {
	u, err := url.Parse(strings.ReplaceAll(rest, "*", "x"))
	if err != nil || u.Scheme == "" {
		return nil, "want an absolute URI, e.g. uri:https://example.com/workload"
	}
	if !strings.Contains(rest, "*") {
		return func(peer Peer) bool { return contains(peer.URIs, rest) }, ""
	}
	// Globs only in the path: scheme and authority stay exact, like the SPIFFE trust domain.
	scheme, after, _ := strings.Cut(rest, "://")
	authority, path, ok := strings.Cut(after, "/")
	if !ok || strings.Contains(scheme+authority, "*") {
		return nil, "a glob may only stand for path segments"
	}
	segs := strings.Split(path, "/")
	for _, s := range segs {
		if s != "*" && s != "**" && strings.Contains(s, "*") {
			return nil, fmt.Sprintf("path segment %q: a glob is a whole segment, * or **", s)
		}
	}
	if problem := checkDoubleStar(segs); problem != "" {
		return nil, problem
	}
	prefix := scheme + "://" + authority + "/"
	return func(peer Peer) bool {
		for _, u := range peer.URIs {
			if strings.HasPrefix(u, prefix) && matchSegments(segs, strings.Split(u[len(prefix):], "/")) {
				return true
			}
		}
		return false
	}, ""
}

func checkDoubleStar(segs []string) string {
	for i, s := range segs {
		if s == "**" && i != len(segs)-1 {
			return "** must be the last path segment"
		}
	}
	return ""
}

// matchSegments matches a path split at "/": "*" is one non-empty segment, a last "**" one or more.
func matchSegments(pattern, path []string) bool {
	for i, p := range pattern {
		if p == "**" {
			return len(path) > i && !containsEmpty(path[i:])
		}
		if i >= len(path) || path[i] == "" || (p != "*" && p != path[i]) {
			return false
		}
	}
	return len(path) == len(pattern)
}

func parseDNS(name string) (func(Peer) bool, string) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	base, wildcard := strings.CutPrefix(name, "*.")
	if base == "" || strings.Contains(base, "*") {
		return nil, `want a host name, with at most one leading "*." wildcard`
	}
	for _, label := range strings.Split(base, ".") {
		if label == "" || len(label) > 63 {
			return nil, fmt.Sprintf("label %q: want 1 to 63 characters", label)
		}
	}
	return func(peer Peer) bool {
		for _, san := range peer.DNSNames {
			san = strings.ToLower(strings.TrimSuffix(san, "."))
			if !wildcard && san == base {
				return true
			}
			first, parent, ok := strings.Cut(san, ".")
			if wildcard && ok && parent == base && first != "" && !strings.Contains(first, "*") {
				return true
			}
		}
		return false
	}, ""
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func containsEmpty(list []string) bool { return contains(list, "") }
