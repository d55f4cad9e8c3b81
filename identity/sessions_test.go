package identity

import (
	"crypto/tls"
	"crypto/x509"
	"sync/atomic"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/testpki"
)

// rotating is a Source whose certificate a test changes, as a renewal would.
type rotating struct {
	cert  atomic.Pointer[tls.Certificate]
	roots *x509.CertPool
}

func (s *rotating) Certificate() (*tls.Certificate, error) { return s.cert.Load(), nil }
func (s *rotating) Roots() (*x509.CertPool, error)         { return s.roots, nil }
func (s *rotating) Close() error                           { return nil }

// TestRotationEndsResumption: a client guard resumes while its certificate is the one its
// session was made with, and after a renewal shows the master the new one at once (a full
// handshake), then resumes that; a serving guard whose certificate is renewed resumes no
// session made before (its client would otherwise see the old certificate).
func TestRotationEndsResumption(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	issue := func(id string) *tls.Certificate {
		c := ca.Issue(t, testpki.Leaf{URIs: []string{id}}).TLS
		return &c
	}
	worker, store := &rotating{roots: ca.Pool()}, &rotating{roots: ca.Pool()}
	worker.cert.Store(issue("spiffe://td/worker/1"))
	store.cert.Store(issue("spiffe://td/store"))
	keys := NewTicketKeys(store, time.Hour)
	server := ServerConfig(store, mustAllow(t, "spiffe://td/worker/*"))
	if err := keys.Resume(server, time.Now()); err != nil {
		t.Fatal(err)
	}
	client := ClientConfig(worker, mustAllow(t, "spiffe://td/store"), "store")
	client.ClientSessionCache = NewSessionCache(worker, 4)
	connect := func(step string, resumed bool) {
		t.Helper()
		keys.Rotate(server, time.Now()) // as serve does before each handshake
		serr, cerr, saw := handshake(t, server.Clone(), client)
		if serr != nil || cerr != nil {
			t.Fatalf("%s: server %v, client %v", step, serr, cerr)
		}
		if saw.DidResume != resumed {
			t.Fatalf("%s: resumed %v, want %v", step, saw.DidResume, resumed)
		}
		mine, _ := worker.Certificate()
		if got := saw.PeerCertificates[0].SerialNumber; got.Cmp(mine.Leaf.SerialNumber) != 0 {
			t.Fatalf("%s: the server saw serial %x, the worker's is %x", step, got, mine.Leaf.SerialNumber)
		}
	}
	connect("first", false)
	connect("again", true)
	worker.cert.Store(issue("spiffe://td/worker/1"))
	connect("after the worker's renewal", false)
	connect("again with the new certificate", true)
	store.cert.Store(issue("spiffe://td/store"))
	connect("after the store's renewal", false)
	connect("again with the store's new certificate", true)
}
