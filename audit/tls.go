package audit

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"net/netip"
	"strings"
)

// Bounds on what a certificate puts in an event: a client of any CA may present one, and a
// refused handshake is audited with it.
const (
	MaxAltNames  = 16
	MaxCertField = 256 // bytes of a distinguished name or an alternative name
)

// TLSReasonPrefix begins the event.reason of a refused handshake: tls_ and the identity
// package's reason (tls_unknown_ca, tls_no_certificate, tls_expired, tls_identity_not_allowed,
// tls_identity_ambiguous, tls_not_tls, tls_handshake_failed, tls_handshake_timeout).
const TLSReasonPrefix = "tls_"

// IsTLSReason reports whether an event.reason is a refused handshake's.
func IsTLSReason(reason string) bool { return strings.HasPrefix(reason, TLSReasonPrefix) }

// identityVouched is the one refusal reason whose certificate chained to a configured CA: its
// identity is real, only not allowed.
const identityVouched = TLSReasonPrefix + "identity_not_allowed"

// NewTLS is the TLS of a connection whose handshake negotiated version and cipherSuite (0: not
// known) and whose client presented cert (nil: none), with identity as the identity package names
// it ("" if none). Call it once a connection; every event of it shares the result.
func NewTLS(version, cipherSuite uint16, cert *x509.Certificate, established bool, identity string) *TLS {
	t := &TLS{Established: established, Identity: identity}
	if version != 0 {
		t.VersionProtocol = "tls"
		t.Version = strings.TrimPrefix(tls.VersionName(version), "TLS ")
	}
	if cipherSuite != 0 {
		t.Cipher = tls.CipherSuiteName(cipherSuite)
	}
	if cert == nil {
		return t
	}
	t.Subject, t.Issuer = clipText(cert.Subject.String()), clipText(cert.Issuer.String())
	for _, n := range cert.URIs {
		t.addAltName(n.String())
	}
	for _, n := range cert.DNSNames {
		t.addAltName(n)
	}
	for _, n := range cert.IPAddresses {
		if a, ok := netip.AddrFromSlice(n); ok {
			t.addAltName(a.Unmap().String())
		}
	}
	for _, n := range cert.EmailAddresses {
		t.addAltName(n)
	}
	if cert.SerialNumber != nil {
		t.Serial = clipText(strings.ToUpper(cert.SerialNumber.Text(16)))
	}
	t.NotBefore, t.NotAfter = cert.NotBefore.UTC(), cert.NotAfter.UTC()
	sum := sha256.Sum256(cert.Raw)
	t.SHA256 = strings.ToUpper(hex.EncodeToString(sum[:]))
	return t
}

// TLSOf is NewTLS of a finished handshake's state: its leaf certificate, established.
func TLSOf(cs *tls.ConnectionState, identity string) *TLS {
	var leaf *x509.Certificate
	if len(cs.PeerCertificates) > 0 {
		leaf = cs.PeerCertificates[0]
	}
	return NewTLS(cs.Version, cs.CipherSuite, leaf, cs.HandshakeComplete, identity)
}

func (t *TLS) addAltName(n string) {
	if len(t.AltNames) < MaxAltNames && n != "" {
		t.AltNames = append(t.AltNames, clipText(n))
	}
}

// clipText cuts s to MaxCertField bytes, at a rune boundary.
func clipText(s string) string {
	if len(s) <= MaxCertField {
		return s
	}
	s = s[:MaxCertField]
	for len(s) > 0 && s[len(s)-1]&0xc0 == 0x80 {
		s = s[:len(s)-1]
	}
	if len(s) > 0 && s[len(s)-1] >= 0x80 {
		s = s[:len(s)-1] // a lead byte whose continuation was cut
	}
	return s
}

// PeerIdentity is e's storeguard.identity: "" without TLS or without a vouched identity.
func (e *Event) PeerIdentity() string {
	if e.TLS == nil {
		return ""
	}
	return e.TLS.Identity
}

// HandshakeEvent is the event of a TLS handshake refused on src → dst: action denied, reason
// tls_ and why (the identity package's reason: unknown_ca, no_certificate, expired,
// identity_not_allowed, not_tls, handshake_failed, handshake_timeout), carrying t, what is known of
// the client's certificate (nil: nothing, as for not_tls). Its storeguard.identity is kept only for
// identity_not_allowed, whose certificate chained to a configured CA: any other's names are the
// client's own claim, in tls.client.x509.alternative_names.
func HandshakeEvent(src, dst netip.AddrPort, why string, t *TLS) Event {
	e := AdmissionEvent(src, dst, ActionDenied, TLSReasonPrefix+why)
	if t != nil {
		c := *t
		c.Established = false
		if e.Reason != identityVouched {
			c.Identity = ""
		}
		e.TLS = &c
	}
	return e
}
