// Package idpattern matches a peer's identity, as the identity package names it
// ("spiffe://td/ns/x", "dns:host", "cn:name", "uri:https://host/path"), against the patterns the
// configuration gives: tls.allow, access.deny-identities, a policy file's identities. It is the
// one syntax of all three, and imports nothing, so that admission and policy use it without the
// identity package (and go-spiffe) under them.
//
// A pattern is one of
//
//	spiffe://TRUST-DOMAIN/PATH   a SPIFFE ID
//	uri:URI                      any URI identity, a SPIFFE ID included (uri:spiffe://td/x is spiffe://td/x)
//	dns:NAME                     a DNS name, case-insensitive
//	cn:NAME                      a certificate's common name
//
// In a URI or a DNS name, * matches any run of characters within one segment (a path segment, a
// DNS label) and ** standing alone as a segment matches any number of segments, none included:
// spiffe://td/ns/*/sa/worker, spiffe://td/ns/train/**, dns:*.job.example (one label, as a
// certificate's wildcard), dns:**.job.example. In a common name * matches any run of characters.
package idpattern

import (
	"fmt"
	"strings"

	"github.com/storeguard/storeguard/internal/glob"
)

type kind uint8

const (
	kindURI kind = iota + 1
	kindDNS
	kindCN
)

// Pattern is one parsed pattern.
type Pattern struct {
	raw  string
	kind kind
	segs []string // URI: split at '/'; DNS: at '.', lower case; CN: the one glob
}

// Prefixes of identities and patterns.
const (
	spiffePrefix = "spiffe://"
	uriPrefix    = "uri:"
	dnsPrefix    = "dns:"
	cnPrefix     = "cn:"
)

// maxSegments bounds a pattern's and an identity's segments, so that matching stays cheap (SPIFFE
// IDs are at most 2048 bytes; a DNS name has at most 127 labels).
const maxSegments = 256

// Parse reads one pattern. Its errors say what is wrong with it.
func Parse(s string) (Pattern, error) {
	p := Pattern{raw: s}
	if s == "" {
		return p, fmt.Errorf("an empty pattern matches nothing")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			return p, fmt.Errorf("%q: a space or a control character at byte %d", s, i)
		}
	}
	var body string
	var sep string
	switch {
	case strings.HasPrefix(s, spiffePrefix):
		p.kind, body, sep = kindURI, s, "/"
		td, _, _ := strings.Cut(s[len(spiffePrefix):], "/")
		if td == "" {
			return p, fmt.Errorf("%q: no trust domain after spiffe://", s)
		}
	case strings.HasPrefix(s, uriPrefix):
		p.kind, body, sep = kindURI, s[len(uriPrefix):], "/"
	case strings.HasPrefix(s, dnsPrefix):
		p.kind, body, sep = kindDNS, strings.ToLower(s[len(dnsPrefix):]), "."
	case strings.HasPrefix(s, cnPrefix):
		p.kind, body = kindCN, s[len(cnPrefix):]
	default:
		return p, fmt.Errorf("%q: not spiffe://, uri:, dns: or cn: followed by a name", s)
	}
	if body == "" {
		return p, fmt.Errorf("%q: nothing after the prefix", s)
	}
	if sep == "" {
		p.segs = []string{body}
		return p, nil
	}
	p.segs = strings.Split(body, sep)
	if len(p.segs) > maxSegments {
		return p, fmt.Errorf("%q: more than %d segments", s, maxSegments)
	}
	for _, seg := range p.segs {
		if seg != "**" && strings.Contains(seg, "**") {
			return p, fmt.Errorf("%q: ** stands for whole segments, alone between separators (%q)", s, seg)
		}
	}
	return p, nil
}

// MustParse is Parse for patterns known to be valid; it panics on an error.
func MustParse(s string) Pattern {
	p, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return p
}

// String is the pattern as written.
func (p Pattern) String() string { return p.raw }

// Match reports whether the identity id matches p. An identity of no known form matches nothing.
func (p Pattern) Match(id string) bool {
	if p.kind == 0 {
		return false
	}
	switch p.kind {
	case kindURI:
		uri, ok := uriOf(id)
		return ok && matchSegments(p.segs, uri, '/')
	case kindDNS:
		name, ok := strings.CutPrefix(id, dnsPrefix)
		return ok && matchSegments(p.segs, strings.ToLower(name), '.')
	case kindCN:
		name, ok := strings.CutPrefix(id, cnPrefix)
		return ok && glob.Star(p.segs[0], name)
	}
	return false
}

// uriOf is the URI an identity names: a SPIFFE ID as it is, uri:X as X.
func uriOf(id string) (string, bool) {
	if strings.HasPrefix(id, spiffePrefix) {
		return id, true
	}
	return strings.CutPrefix(id, uriPrefix)
}

// matchSegments matches the pattern's segments against s split at sep, in O(segments²): each
// (pattern segment, identity segment) pair is tried at most once.
func matchSegments(pat []string, s string, sep byte) bool {
	segs := strings.Split(s, string(sep))
	if len(segs) > maxSegments {
		return false
	}
	// ok[j]: the pattern's first i segments match the identity's first j, for the i of the loop.
	ok := make([]bool, len(segs)+1)
	ok[0] = true
	for _, ps := range pat {
		if ps == "**" {
			for j := 1; j <= len(segs); j++ {
				ok[j] = ok[j] || ok[j-1]
			}
			continue
		}
		for j := len(segs); j >= 1; j-- {
			ok[j] = ok[j-1] && glob.Star(ps, segs[j-1])
		}
		ok[0] = false
	}
	return ok[len(segs)]
}

// Set is a list of patterns; it matches an identity any of them matches.
type Set []Pattern

// ParseSet reads patterns; an error names the first bad one by its index: "[2] ...".
func ParseSet(ss []string) (Set, error) {
	out := make(Set, 0, len(ss))
	for i, s := range ss {
		p, err := Parse(s)
		if err != nil {
			return nil, fmt.Errorf("[%d] %w", i, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// Match reports whether any pattern of s matches id; "" (no identity) matches none.
func (s Set) Match(id string) bool {
	if id == "" {
		return false
	}
	for _, p := range s {
		if p.Match(id) {
			return true
		}
	}
	return false
}

// Strings are the patterns as written.
func (s Set) Strings() []string {
	out := make([]string, len(s))
	for i, p := range s {
		out[i] = p.raw
	}
	return out
}
