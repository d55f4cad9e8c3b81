package identity

import (
	"crypto/sha256"
	"crypto/tls"
)

// SessionCache is a client guard's cache of sessions with master guards. A session is offered
// only while this guard's certificate is the one the session was made with: after a rotation (a
// renewal, a new key, a new CA) the next connection makes a full handshake and shows the master
// the new certificate, instead of resuming with the old one until its ticket runs out.
type SessionCache struct {
	src Source
	c   tls.ClientSessionCache
}

// NewSessionCache keeps up to n sessions (one per master guard).
func NewSessionCache(src Source, n int) *SessionCache {
	return &SessionCache{src: src, c: tls.NewLRUClientSessionCache(n)}
}

// Get and Put are tls.ClientSessionCache's, under this guard's certificate of the moment.
func (s *SessionCache) Get(key string) (*tls.ClientSessionState, bool) {
	return s.c.Get(s.mine() + key)
}

func (s *SessionCache) Put(key string, cs *tls.ClientSessionState) { s.c.Put(s.mine()+key, cs) }

// mine is the prefix of this guard's certificate of the moment: the first 8 bytes of its leaf's
// SHA-256.
func (s *SessionCache) mine() string { return string(fingerprint(s.src)) }

// fingerprint is the first 8 bytes of the SHA-256 of src's leaf certificate; empty without one.
func fingerprint(src Source) []byte {
	if src == nil {
		return nil
	}
	cert, err := src.Certificate()
	if err != nil || cert == nil || len(cert.Certificate) == 0 {
		return nil
	}
	h := sha256.Sum256(cert.Certificate[0])
	return h[:8]
}
