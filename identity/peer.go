package identity

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
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
// use: each URI SAN (a SPIFFE ID as it is, any other as uri:), each DNS SAN as dns:, the CN
// as cn:.
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
	if p.CommonName != "" {
		names = append(names, "cn:"+p.CommonName)
	}
	return names
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
