package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

func TestPeerOfID(t *testing.T) {
	ca := newCA(t, "ca")
	for _, tc := range []struct {
		name string
		spec leafSpec
		want string
	}{
		{"spiffe wins over dns", leafSpec{cn: "x", dns: []string{"a.example"}, uris: []string{"https://u.example/x", "spiffe://td/w"}}, "spiffe://td/w"},
		{"first dns", leafSpec{cn: "x", dns: []string{"a.example", "b.example"}, uris: []string{"https://u.example/x"}}, "dns:a.example"},
		{"first uri", leafSpec{cn: "x", uris: []string{"https://u.example/x", "https://v.example/"}}, "uri:https://u.example/x"},
		{"cn only", leafSpec{cn: "rank-host-3"}, "cn:rank-host-3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PeerOf(ca.issue(t, tc.spec).tls.Leaf).ID; got != tc.want {
				t.Errorf("ID = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPeerOfFields(t *testing.T) {
	ca := newCA(t, "the ca")
	l := ca.issue(t, leafSpec{dns: []string{"h.example"}, uris: []string{"spiffe://td/a"}})
	p := PeerOf(l.tls.Leaf)
	sum := sha256.Sum256(l.tls.Leaf.Raw)
	if p.Serial != l.serial || p.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("serial %s sha256 %s, want %s %x", p.Serial, p.SHA256, l.serial, sum)
	}
	if p.Issuer != "CN=the ca,O=storeguard tests" {
		t.Errorf("Issuer = %q", p.Issuer)
	}
	if p.ID != "spiffe://td/a" || len(p.DNSNames) != 1 || p.URIs[0] != "spiffe://td/a" {
		t.Errorf("peer = %+v", p)
	}
	nameless := PeerOf(ca.issue(t, leafSpec{}).tls.Leaf)
	if nameless.ID != "sha256:"+nameless.SHA256 {
		t.Errorf("a certificate with no name: ID = %q", nameless.ID)
	}
}
