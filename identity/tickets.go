package identity

import (
	"crypto/rand"
	"crypto/tls"
	"sync"
	"time"
)

// TicketKeys are a serving guard's session ticket keys, which turn TLS session resumption on
// for its ServerConfigs (Resume). A new key seals tickets every period and the one before it
// still opens them, so a ticket resumes for at most two periods; then the client's guard makes a
// full handshake. A resumed handshake proves the peer holds the session's secret instead of
// its private key; VerifyConnection still checks the peer's certificate (kept in the ticket)
// against the roots and allow list of the moment, and crypto/tls resumes no session whose
// client certificate has expired. The keys live in this process only: after an upgrade or a
// restart, every client makes a full handshake once. When this guard's own certificate changes,
// the keys start afresh and no ticket sealed before resumes: each client's next handshake is a
// full one and sees the new certificate (a client guard whose roots no longer take the old one
// would refuse a resumption that shows it).
type TicketKeys struct {
	period time.Duration
	src    Source

	mu      sync.Mutex
	keys    [][32]byte // newest first
	gen     uint64     // keys' generation: one more at each rotation
	next    time.Time  // when a new key is due
	cert    string     // the fingerprint of src's certificate the keys were made under
	applied map[*tls.Config]uint64
}

// TicketPeriod is how long one key seals tickets: a ticket resumes for up to twice this.
const TicketPeriod = time.Hour

// NewTicketKeys makes a keyring for the guard whose certificate src gives, rotating every period.
func NewTicketKeys(src Source, period time.Duration) *TicketKeys {
	return &TicketKeys{src: src, period: period, applied: make(map[*tls.Config]uint64)}
}

// Resume turns resumption on for cfg, a ServerConfig no handshake uses yet: its tickets are
// sealed with k's keys (every handshake runs on a clone of cfg, which takes them).
func (k *TicketKeys) Resume(cfg *tls.Config, now time.Time) error {
	cfg.SessionTicketsDisabled = false
	return k.Rotate(cfg, now)
}

// Rotate makes a new key when one is due and gives cfg the keys it does not have yet. Call it
// before each handshake on cfg; it is safe while other handshakes clone cfg.
func (k *TicketKeys) Rotate(cfg *tls.Config, now time.Time) error {
	cert := string(fingerprint(k.src))
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.keys == nil || !now.Before(k.next) || cert != k.cert {
		var key [32]byte
		if _, err := rand.Read(key[:]); err != nil {
			return err
		}
		keep := min(len(k.keys), 1)
		if cert != k.cert {
			keep = 0 // tickets of the old certificate: none resumes
		}
		k.keys = append([][32]byte{key}, k.keys[:keep]...)
		k.cert = cert
		k.gen++
		k.next = now.Add(k.period)
	}
	if g, ok := k.applied[cfg]; !ok || g != k.gen {
		if len(k.applied) >= 8 { // configs of reloads gone by: one still in use is given its keys again
			clear(k.applied)
		}
		cfg.SetSessionTicketKeys(k.keys)
		k.applied[cfg] = k.gen
	}
	return nil
}
