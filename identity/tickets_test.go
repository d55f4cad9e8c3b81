package identity

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/testpki"
)

// TestTicketKeys: a ticket resumes on a clone of the config it was issued by (each handshake
// runs on one), still after one rotation, and not after two: the key that sealed it is gone.
func TestTicketKeys(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	store := source(ca.Issue(t, testpki.Leaf{URIs: []string{"spiffe://td/store"}}), ca)
	worker := source(ca.Issue(t, testpki.Leaf{URIs: []string{"spiffe://td/worker/1"}}), ca)
	t0 := time.Now()
	for _, tc := range []struct {
		name      string
		rotations int
		resumed   bool
	}{
		{"the same key", 0, true},
		{"the key before", 1, true},
		{"two rotations on", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys := NewTicketKeys(store, time.Hour)
			server := ServerConfig(store, mustAllow(t, "spiffe://td/worker/*"))
			if err := keys.Resume(server, t0); err != nil {
				t.Fatal(err)
			}
			client := ClientConfig(worker, mustAllow(t, "spiffe://td/store"), "store") // the cache's key
			client.ClientSessionCache = tls.NewLRUClientSessionCache(1)
			if serr, cerr, saw := handshake(t, server.Clone(), client); serr != nil || cerr != nil || saw.DidResume {
				t.Fatalf("first handshake: server %v, client %v", serr, cerr)
			}
			for i := 1; i <= tc.rotations; i++ {
				if err := keys.Rotate(server, t0.Add(time.Duration(i)*(time.Hour+time.Minute))); err != nil {
					t.Fatal(err)
				}
			}
			serr, cerr, saw := handshake(t, server.Clone(), client)
			if serr != nil || cerr != nil {
				t.Fatalf("second handshake: server %v, client %v", serr, cerr)
			}
			if saw.DidResume != tc.resumed {
				t.Fatalf("resumed %v, want %v", saw.DidResume, tc.resumed)
			}
			if len(saw.PeerCertificates) == 0 {
				t.Fatal("no peer certificate on the server's side")
			}
		})
	}
}
