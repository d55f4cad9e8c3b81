package identity

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
)

// Reason is why a handshake was refused: a stable id for audit events and a bounded metric label.
type Reason string

const (
	NoCertificate Reason = "no_certificate"
	UnknownCA     Reason = "unknown_ca" // does not chain to the configured roots (for this key usage)
	Expired       Reason = "expired"    // expired or not yet valid, but otherwise from our roots
	NotAllowed    Reason = "identity_not_allowed"
	Ambiguous     Reason = "identity_ambiguous" // a SPIFFE certificate with more than one URI SAN
	NotTLS        Reason = "not_tls"            // first bytes are not a TLS handshake (e.g. plaintext TCPStore)
	BadHandshake  Reason = "handshake_failed"   // anything else (version, ciphers, alerts, EOF mid-handshake)
	Timeout       Reason = "handshake_timeout"
)

// Reasons lists every Reason, so that a metric can start each label at zero.
var Reasons = []Reason{NoCertificate, UnknownCA, Expired, NotAllowed, Ambiguous, NotTLS, BadHandshake, Timeout}

// RefusedError is a handshake this package's VerifyConnection refused.
type RefusedError struct {
	Reason Reason
	Peer   *Peer // nil when the peer sent no certificate
	Err    error
}

func (e *RefusedError) Error() string {
	s := "identity: refused (" + string(e.Reason) + ")"
	if e.Peer != nil {
		s += " " + e.Peer.ID
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *RefusedError) Unwrap() error { return e.Err }

// Classify names why a handshake failed; it returns "" for a nil error.
func Classify(err error) Reason {
	var refused *RefusedError
	var header tls.RecordHeaderError
	var netErr net.Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &refused):
		return refused.Reason
	// crypto/tls sets Conn only for "first record does not look like a TLS handshake"; the
	// other header errors (oversized record, wrong version later on) come from TLS peers.
	case errors.As(err, &header) && header.Conn != nil:
		return NotTLS
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &netErr) && netErr.Timeout():
		return Timeout
	}
	return BadHandshake
}
