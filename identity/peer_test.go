package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/storeguard/storeguard/internal/testpki"
)

func TestPeerOfID(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	for _, tc := range []struct {
		name string
		spec testpki.Leaf
		want string
	}{
		{"spiffe wins over dns", testpki.Leaf{CN: "x", DNS: []string{"a.example"}, URIs: []string{"https://u.example/x", "spiffe://td/w"}}, "spiffe://td/w"},
		{"first dns", testpki.Leaf{CN: "x", DNS: []string{"a.example", "b.example"}, URIs: []string{"https://u.example/x"}}, "dns:a.example"},
		{"first uri", testpki.Leaf{CN: "x", URIs: []string{"https://u.example/x", "https://v.example/"}}, "uri:https://u.example/x"},
		{"cn only", testpki.Leaf{CN: "rank-host-3"}, "cn:rank-host-3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PeerOf(ca.Issue(t, tc.spec).TLS.Leaf).ID; got != tc.want {
				t.Errorf("ID = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPeerOfFields(t *testing.T) {
	ca := testpki.NewCA(t, "the ca")
	l := ca.Issue(t, testpki.Leaf{DNS: []string{"h.example"}, URIs: []string{"spiffe://td/a"}})
	p := PeerOf(l.TLS.Leaf)
	sum := sha256.Sum256(l.TLS.Leaf.Raw)
	if p.Serial != l.Serial || p.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("serial %s sha256 %s, want %s %x", p.Serial, p.SHA256, l.Serial, sum)
	}
	if p.Issuer != "CN=the ca,O=storeguard tests" {
		t.Errorf("Issuer = %q", p.Issuer)
	}
	if p.ID != "spiffe://td/a" || len(p.DNSNames) != 1 || p.URIs[0] != "spiffe://td/a" {
		t.Errorf("peer = %+v", p)
	}
	nameless := PeerOf(ca.Issue(t, testpki.Leaf{}).TLS.Leaf)
	if nameless.ID != "sha256:"+nameless.SHA256 {
		t.Errorf("a certificate with no name: ID = %q", nameless.ID)
	}
}
