package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/url"
	"sync/atomic"
	"testing"
	"time"
)

// testCA issues the certificates of these tests; nothing is read from disk.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

var serials atomic.Int64

func newCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serials.Add(1)),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"storeguard tests"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// leafSpec is what a test wants in a leaf; zero dates mean valid now, zero usages mean both.
type leafSpec struct {
	cn                  string
	dns, uris           []string
	notBefore, notAfter time.Time
	usages              []x509.ExtKeyUsage
}

// testLeaf is an issued leaf as crypto/tls wants it and as files hold it.
type testLeaf struct {
	tls             tls.Certificate
	certPEM, keyPEM []byte
	serial          string
}

func (ca *testCA) issue(t testing.TB, s leafSpec) testLeaf {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if s.notBefore.IsZero() {
		s.notBefore = time.Now().Add(-time.Hour)
	}
	if s.notAfter.IsZero() {
		s.notAfter = time.Now().Add(time.Hour)
	}
	if s.usages == nil {
		s.usages = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serials.Add(1)),
		Subject:      pkix.Name{CommonName: s.cn},
		NotBefore:    s.notBefore,
		NotAfter:     s.notAfter,
		DNSNames:     s.dns,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  s.usages,
	}
	for _, u := range s.uris {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return testLeaf{
		tls:     tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		serial:  leaf.SerialNumber.Text(16),
	}
}

// staticSource is a Source that never rotates.
type staticSource struct {
	cert  *tls.Certificate
	roots *x509.CertPool
}

func (s staticSource) Certificate() (*tls.Certificate, error) { return s.cert, nil }
func (s staticSource) Roots() (*x509.CertPool, error)         { return s.roots, nil }
func (s staticSource) Close() error                           { return nil }

func source(l testLeaf, roots *testCA) staticSource {
	return staticSource{cert: &l.tls, roots: roots.pool()}
}

func x509VerifyOptions(roots *x509.CertPool) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
}
