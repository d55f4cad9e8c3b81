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
		{"spiffe://td/ns/**", spiffe("spiffe://td/ns"), true}, // idpattern: ** is any number of segments, none included
		{"spiffe://td/ns/**", spiffe("spiffe://td/nsx/a"), false},
		{"spiffe://td/**", spiffe("spiffe://td.evil/a"), false},
		{"spiffe://td/ns/train-*", spiffe("spiffe://td/ns/train-7"), true},
		{"spiffe://td/ns/train-*", spiffe("spiffe://td/ns/train-7/x"), false},
		// A spiffe pattern is about the SPIFFE ID, not any spiffe-looking text elsewhere.
		{"spiffe://td/a", Peer{CommonName: "spiffe://td/a", DNSNames: []string{"td"}}, false},
		{"dns:store.example", dns("x.example", "Store.Example"), true},
		{"dns:store.example", dns("a.store.example"), false},
		{"dns:*.store.example", dns("a.store.example"), true},
		{"dns:*.store.example", dns("store.example"), false},
		{"dns:*.store.example", dns("a.b.store.example"), false},
		{"dns:*.store.example", dns("a.evilstore.example"), false},
		{"uri:https://id.example/w/1", Peer{URIs: []string{"https://id.example/w/1"}}, true},
		{"uri:https://id.example/w/1", Peer{URIs: []string{"https://id.example/w/10"}}, false},
		{"uri:https://id.example/w/*", Peer{URIs: []string{"x:y", "https://id.example/w/9"}}, true},
		{"uri:https://id.example/**", Peer{URIs: []string{"https://id.example.evil/w"}}, false},
		{"uri:spiffe://td/a", spiffe("spiffe://td/a"), true},
		{"cn:rank-host", Peer{CommonName: "rank-host"}, true},
		{"cn:rank-host", Peer{CommonName: "rank-host2", DNSNames: []string{"rank-host"}}, false},
		// Any name the certificate carries, not only the ID.
		{"dns:w1.hosts.example", Peer{ID: "spiffe://td/w1", URIs: []string{"spiffe://td/w1"}, DNSNames: []string{"w1.hosts.example"}}, true},
		{"uri:https://id.example/w", Peer{ID: "dns:a", URIs: []string{"https://id.example/w"}, DNSNames: []string{"a"}}, true},
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
		{"store.example", "not spiffe://, uri:, dns: or cn:"},
		{"spiffe:///a", "no trust domain"},
		{"dns:", "nothing after the prefix"},
		{"cn:", "nothing after the prefix"},
		{"spiffe://td/a**", "** stands for whole segments"},
		{"dns:a b.example", "a space or a control character"},
	} {
		_, err := ParseAllow([]string{"cn:fine", tc.pattern})
		var pe *PatternError
		if !errors.As(err, &pe) || pe.Index != 1 || pe.Pattern != tc.pattern || !strings.Contains(pe.Problem, tc.problem) {
			t.Errorf("ParseAllow(%q) = %v, want a PatternError at [1] saying %q", tc.pattern, err, tc.problem)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "tls.allow[1]: ") {
			t.Errorf("error %q does not name the key", err)
		}
	}
}

// Every SAN is a name; the CN only when there is no SAN (RFC 6125): a cn: pattern, in tls.allow or
// access.deny-identities, did match a certificate's CN beside its SANs.
func TestPeerNames(t *testing.T) {
	p := Peer{URIs: []string{"spiffe://td/a", "https://x/y"}, DNSNames: []string{"h.example"}, CommonName: "c"}
	want := []string{"spiffe://td/a", "uri:https://x/y", "dns:h.example"}
	if got := p.Names(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("Names = %q, want %q", got, want)
	}
	if got := (Peer{CommonName: "c"}).Names(); strings.Join(got, " ") != "cn:c" {
		t.Errorf("a CN-only certificate's names: %q", got)
	}
}
