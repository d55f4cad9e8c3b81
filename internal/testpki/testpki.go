// Package testpki issues the certificates of storeguard's tests: CAs and leaves in memory, with
// P-256 keys, nothing read from disk. Tests only.
package testpki

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
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority of a test.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	DER  []byte
}

// NewCA makes a CA named name, valid from an hour ago for a day.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
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
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, Key: key, DER: der}
}

// Pool is a pool of the CA's certificate alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// PEM is the CA's certificate as a file holds it.
func (ca *CA) PEM() []byte { return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.DER}) }

// Leaf is what a test wants in a leaf. Zero dates: valid from an hour ago for two hours; nil
// Usages: client and server authentication.
type Leaf struct {
	CN                  string
	DNS, URIs           []string
	NotBefore, NotAfter time.Time
	Usages              []x509.ExtKeyUsage
}

// Issued is a leaf as crypto/tls wants it (its Leaf parsed) and as files hold it.
type Issued struct {
	TLS             tls.Certificate
	CertPEM, KeyPEM []byte
	Serial          string // hexadecimal, as identity.Peer has it
}

// Issue signs a leaf as l asks.
func (ca *CA) Issue(t testing.TB, l Leaf) Issued {
	t.Helper()
	key := newKey(t)
	if l.NotBefore.IsZero() {
		l.NotBefore = time.Now().Add(-time.Hour)
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = l.NotBefore.Add(2 * time.Hour)
	}
	if l.Usages == nil {
		l.Usages = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: l.CN},
		NotBefore:    l.NotBefore,
		NotAfter:     l.NotAfter,
		DNSNames:     l.DNS,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  l.Usages,
	}
	for _, u := range l.URIs {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return Issued{
		TLS:     tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		Serial:  leaf.SerialNumber.Text(16),
	}
}

// Files writes is as dir/name.pem and dir/name.key, and the CA's certificate as dir/ca.pem; it
// returns the three paths.
func (ca *CA) Files(t testing.TB, dir, name string, is Issued) (cert, key, caFile string) {
	t.Helper()
	write := func(file string, b []byte) string {
		p := filepath.Join(dir, file)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write(name+".pem", is.CertPEM), write(name+".key", is.KeyPEM), write("ca.pem", ca.PEM())
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// serial is a random serial number: unique across the CAs of a test run.
func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	return n.Add(n, big.NewInt(1))
}
