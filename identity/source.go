package identity

import (
	"crypto/tls"
	"crypto/x509"
)

// Source is this guard's own certificate and the roots its peers must chain to, both current.
// The configs ask it on every handshake, so a rotation is picked up by the next handshake and
// never touches established connections.
type Source interface {
	Certificate() (*tls.Certificate, error)
	Roots() (*x509.CertPool, error)
	Close() error
}
