package identity

import (
	"errors"
	"strings"
	"testing"
)

func TestAllowPermits(t *testing.T) {
	spiffe := func(id string) Peer { return Peer{ID: id, URIs: []string{id}} }
	dns := func(names ...string) Peer { return Peer{DNSNames: names} }
	for _, tc := range []struct {
		pattern string
		peer    Peer
		want    bool
	}{
		{"spiffe://td/ns/job/rank", spiffe("spiffe://td/ns/job/rank"), true},
		{"spiffe://td/ns/job/rank", spiffe("spiffe://td/ns/job/rank2"), false},
		{"spiffe://td/ns/job/rank", spiffe("spiffe://other/ns/job/rank"), false},
		{"spiffe://td/ns/*/rank", spiffe("spiffe://td/ns/job7/rank"), true},
		{"spiffe://td/ns/*/rank", spiffe("spiffe://td/ns/a/b/rank"), false},
		{"spiffe://td/ns/*", spiffe("spiffe://td/ns"), false},
		{"spiffe://td/ns/**", spiffe("spiffe://td/ns/a"), true},
		{"spiffe://td/ns/**", spiffe("spiffe://td/ns/a/b/c"), true},
		{"spiffe://td/ns/**", spiffe("spiffe://td/ns"), false},
		{"spiffe://td/ns/**", spiffe("spiffe://td/nsx/a"), false},
		{"spiffe://td/**", spiffe("spiffe://td.evil/a"), false},
		// A spiffe pattern is about the SPIFFE ID, not any spiffe-looking text elsewhere.
		{"spiffe://td/a", Peer{CommonName: "spiffe://td/a", DNSNames: []string{"td"}}, false},
		{"dns:store.example", dns("x.example", "Store.Example."), true},
		{"dns:store.example", dns("a.store.example"), false},
		{"dns:*.store.example", dns("a.store.example"), true},
		{"dns:*.store.example", dns("store.example"), false},
		{"dns:*.store.example", dns("a.b.store.example"), false},
		{"dns:*.store.example", dns("*.store.example"), false},
		{"dns:*.store.example", dns("a.evilstore.example"), false},
		{"uri:https://id.example/w/1", Peer{URIs: []string{"https://id.example/w/1"}}, true},
		{"uri:https://id.example/w/1", Peer{URIs: []string{"https://id.example/w/10"}}, false},
		{"uri:https://id.example/w/*", Peer{URIs: []string{"x:y", "https://id.example/w/9"}}, true},
		{"uri:https://id.example/**", Peer{URIs: []string{"https://id.example.evil/w"}}, false},
		{"uri:spiffe://td/a", spiffe("spiffe://td/a"), true},
		{"cn:rank-host", Peer{CommonName: "rank-host"}, true},
		{"cn:rank-host", Peer{CommonName: "rank-host2", DNSNames: []string{"rank-host"}}, false},
	} {
		a, err := ParseAllow([]string{tc.pattern})
		if err != nil {
			t.Fatalf("%s: %v", tc.pattern, err)
		}
		if got := a.Permits(tc.peer); got != tc.want {
			t.Errorf("%s permits %+v = %v, want %v", tc.pattern, tc.peer, got, tc.want)
		}
	}
}

func TestAllowAnyOf(t *testing.T) {
	a, err := ParseAllow([]string{"cn:a", "dns:b.example"})
	if err != nil {
		t.Fatal(err)
	}
	if !a.Permits(Peer{DNSNames: []string{"b.example"}}) || a.Permits(Peer{CommonName: "b"}) {
		t.Error("a list permits a peer that any one pattern permits, and only that")
	}
	if a.Empty() || a.String() != "cn:a, dns:b.example" {
		t.Errorf("Empty %v, String %q", a.Empty(), a)
	}
	var none Allow
	if !none.Empty() || !none.Permits(Peer{}) {
		t.Error("the empty list leaves the decision to the roots")
	}
}

func TestParseAllowErrors(t *testing.T) {
	for _, tc := range []struct{ pattern, problem string }{
		{"store.example", "want spiffe://"},
		{"spiffe:/td/a", "want spiffe://trust-domain/path"},
		{"spiffe://td", "no path"},
		{"spiffe://TD/a", "trust domain"},
		{"spiffe://*/a", "trust domain"},
		{"spiffe://td/a*", "a glob is a whole segment"},
		{"spiffe://td/**/a", "** must be the last"},
		{"spiffe://td/a//b", "path segment 2"},
		{"dns:", "want a host name"},
		{"dns:a.*.example", "want a host name"},
		{"dns:*", "want a host name"},
		{"dns:a..example", "label"},
		{"uri:relative/path", "absolute URI"},
		{"uri:https://*.example/a", "only stand for path segments"},
		{"uri:https://id.example/w*", "a glob is a whole segment"},
		{"cn:", "empty common name"},
	} {
		_, err := ParseAllow([]string{"cn:fine", tc.pattern})
		var pe *PatternError
		if !errors.As(err, &pe) || pe.Pattern != tc.pattern || !strings.Contains(pe.Problem, tc.problem) {
			t.Errorf("ParseAllow(%q) = %v, want a PatternError saying %q", tc.pattern, err, tc.problem)
		}
	}
}
