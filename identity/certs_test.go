package identity

import (
	"crypto/tls"
	"crypto/x509"

	"github.com/storeguard/storeguard/internal/testpki"
)

// staticSource is a Source that never rotates.
type staticSource struct {
	cert  *tls.Certificate
	roots *x509.CertPool
}

func (s staticSource) Certificate() (*tls.Certificate, error) { return s.cert, nil }
func (s staticSource) Roots() (*x509.CertPool, error)         { return s.roots, nil }
func (s staticSource) Close() error                           { return nil }

func source(l testpki.Issued, roots *testpki.CA) staticSource {
	return staticSource{cert: &l.TLS, roots: roots.Pool()}
}

func x509VerifyOptions(roots *x509.CertPool) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
}
