package identity

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// Peer is who a verified certificate says the peer is.
type Peer struct {
	// ID is the one identity that reports group by: the SPIFFE ID URI SAN (spiffe://...), else
	// "dns:<first DNS SAN>", else "uri:<first URI SAN>", else "cn:<subject CN>", else
	// "sha256:<leaf hash>" so that no two CN-less certificates share an ID.
	ID              string
	Subject, Issuer string // RFC 2253 DNs of the leaf
	CommonName      string // the subject's CN, which cn: patterns match
	Serial          string // hex
	SHA256          string // hex of the leaf's DER
	NotBefore       time.Time
	NotAfter        time.Time
	DNSNames, URIs  []string
}

// PeerOf describes leaf. It does not verify anything: call it on a certificate that has been.
func PeerOf(leaf *x509.Certificate) Peer {
	sum := sha256.Sum256(leaf.Raw)
	p := Peer{
		Subject:    leaf.Subject.String(),
		Issuer:     leaf.Issuer.String(),
		CommonName: leaf.Subject.CommonName,
		Serial:     leaf.SerialNumber.Text(16),
		SHA256:     hex.EncodeToString(sum[:]),
		NotBefore:  leaf.NotBefore,
		NotAfter:   leaf.NotAfter,
		DNSNames:   leaf.DNSNames,
	}
	for _, u := range leaf.URIs {
		p.URIs = append(p.URIs, u.String())
	}
	p.ID = p.identity()
	return p
}

func (p Peer) identity() string {
	if id, ok := p.spiffeID(); ok {
		return id
	}
	switch {
	case len(p.DNSNames) > 0:
		return "dns:" + p.DNSNames[0]
	case len(p.URIs) > 0:
		return "uri:" + p.URIs[0]
	case p.CommonName != "":
		return "cn:" + p.CommonName
	}
	return "sha256:" + p.SHA256
}

// Names are every identity the certificate vouches for, in the forms Peer.ID and idpattern
// use: each URI SAN (a SPIFFE ID as it is, any other as uri:), each DNS SAN as dns:, and the CN
// as cn: only when there is no SAN (RFC 6125 6.4.4: a client must not look at the CN when the
// certificate has SANs; a CA that vouched for the SANs may not have checked it).
func (p Peer) Names() []string {
	names := make([]string, 0, len(p.URIs)+len(p.DNSNames)+1)
	for _, u := range p.URIs {
		if !strings.HasPrefix(u, "spiffe://") {
			u = "uri:" + u
		}
		names = append(names, u)
	}
	for _, d := range p.DNSNames {
		names = append(names, "dns:"+d)
	}
	if p.CommonName != "" && len(names) == 0 {
		names = append(names, "cn:"+p.CommonName)
	}
	return names
}

// ambiguous reports why the certificate names no one identity, "" when it does: an X.509-SVID
// has exactly one URI SAN (the SPIFFE X509-SVID specification, 4.1), so a certificate with a
// SPIFFE ID and another URI SAN would be allowed by one name and logged, capped and judged as the
// other.
func (p Peer) ambiguous() string {
	if _, ok := p.spiffeID(); ok && len(p.URIs) > 1 {
		return "a SPIFFE certificate with " + strconv.Itoa(len(p.URIs)) + " URI SANs (an X.509-SVID has one): " + strings.Join(p.URIs, ", ")
	}
	return ""
}

// spiffeID is the first spiffe:// URI SAN; an X509-SVID has exactly one URI SAN.
func (p Peer) spiffeID() (string, bool) {
	for _, u := range p.URIs {
		if strings.HasPrefix(u, "spiffe://") {
			return u, true
		}
	}
	return "", false
}
