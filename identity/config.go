package identity

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"time"
)

// ServerConfig is the TLS 1.3 config a serving guard accepts peers with. VerifyConnection does
// every check itself, rather than crypto/tls's ClientAuth, so that each refusal is a
// *RefusedError with an exact Reason. All state lives in closures over src and allow, so a
// Clone (with a KeyLogWriter, say) verifies the same way.
func ServerConfig(src Source, allow Allow) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		ClientAuth: tls.RequestClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return src.Certificate()
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := verifyPeer(src, allow, cs.PeerCertificates, x509.ExtKeyUsageClientAuth)
			return err
		},
		// Off until TicketKeys.Resume: handshakes run on clones, which would each make keys of
		// their own. VerifyConnection runs on resumed handshakes too (with the peer's
		// certificates from the ticket), so a resumption is judged as a full handshake is.
		SessionTicketsDisabled: true,
	}
}

// ClientConfig is the TLS 1.3 config a client guard dials a serving guard with. The server's
// certificate must chain to src.Roots() and be permitted by allow; with an empty allow list it
// must match serverName instead, and an empty serverName then refuses every server.
func ClientConfig(src Source, allow Allow, serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return src.Certificate()
		},
		// Verification is VerifyConnection's, against roots that may rotate.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			peer, err := verifyPeer(src, allow, cs.PeerCertificates, x509.ExtKeyUsageServerAuth)
			if err != nil || !allow.Empty() {
				return err
			}
			if err := cs.PeerCertificates[0].VerifyHostname(serverName); err != nil {
				return &RefusedError{Reason: NotAllowed, Peer: &peer, Err: err}
			}
			return nil
		},
	}
}

// verifyPeer checks that certs chain to src's roots for usage and that allow permits the leaf.
func verifyPeer(src Source, allow Allow, certs []*x509.Certificate, usage x509.ExtKeyUsage) (Peer, error) {
	if len(certs) == 0 {
		return Peer{}, &RefusedError{Reason: NoCertificate, Err: errors.New("peer sent no certificate")}
	}
	leaf := certs[0]
	peer := PeerOf(leaf)
	roots, err := src.Roots()
	if err != nil {
		return peer, &RefusedError{Reason: BadHandshake, Peer: &peer, Err: err}
	}
	opts := chainOptions(certs, roots, usage)
	if _, err := leaf.Verify(opts); err != nil {
		return peer, &RefusedError{Reason: chainReason(leaf, opts, err), Peer: &peer, Err: err}
	}
	if why := peer.ambiguous(); why != "" {
		return peer, &RefusedError{Reason: Ambiguous, Peer: &peer, Err: errors.New(why)}
	}
	if !allow.Permits(peer) {
		return peer, &RefusedError{Reason: NotAllowed, Peer: &peer, Err: errors.New("not in tls.allow: " + allow.String())}
	}
	return peer, nil
}

// chainOptions verifies certs[0] against roots for usage, with the rest of certs as intermediates.
func chainOptions(certs []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage) x509.VerifyOptions {
	opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{usage}}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	return opts
}

// Chains reports whether a client's certificate chain (leaf first), which a handshake verified,
// still chains to roots, judged as at time at: what a trust-bundle rotation asks of a live
// connection.
func Chains(certs []*x509.Certificate, roots *x509.CertPool, at time.Time) bool {
	if len(certs) == 0 {
		return false
	}
	opts := chainOptions(certs, roots, x509.ExtKeyUsageClientAuth)
	opts.CurrentTime = at
	_, err := certs[0].Verify(opts)
	return err == nil
}

// chainReason tells an expired certificate of our own CA from a stranger's: x509 checks the
// leaf's dates before its chain, so an expired leaf of another CA also fails as expired. It is
// ours when it would have verified at the middle of its validity.
func chainReason(leaf *x509.Certificate, opts x509.VerifyOptions, err error) Reason {
	if !isExpired(err) {
		return UnknownCA
	}
	opts.CurrentTime = leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2)
	if _, err := leaf.Verify(opts); err != nil && !isExpired(err) {
		return UnknownCA
	}
	return Expired
}

func isExpired(err error) bool {
	var invalid x509.CertificateInvalidError
	return errors.As(err, &invalid) && invalid.Reason == x509.Expired
}
