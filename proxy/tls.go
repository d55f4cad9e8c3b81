package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/tlsrec"
	"github.com/storeguard/storeguard/tlsrelay"
)

// Mutual TLS between guards (tls.*). A client from outside tls.plaintext-sources completes a
// TLS 1.3 handshake with a certificate that chains to the configured CA and names an allowed
// identity before anything else happens; then the connection is judged as any other, on its
// plaintext. The connection's goroutines, or the event loop that takes it, read and write that
// plaintext themselves (a tlsrelay.End, the connection's client socket). Under a keeper the End
// keeps its state in a slot of the ledger it shares with the keeper (End.Keep): its records from
// the start of the message in progress on, and each record it writes, so that a restarted worker
// goes on where a dead one stopped (tlsrelay.RestoreEnd). Either way the TLS state is data
// (tlsrelay.State), so that it can change hands with the connection: an upgrade hands a kept End
// over in its slot (End.HandOff), or any End, to a build before that, as a relay and its pair
// (Handover). A relay (tlsrelay.Relay: its records opened into one end of a loopback TCP pair, the
// connection's client socket the other) is what a connection handed over as one goes on as.

// setTLS makes c a mutual-TLS connection (t nil: plaintext): its guard's policy sees the
// peer's identity.
func (c *conn) setTLS(t *tlsConn) {
	c.cl.useTLS(t)
	c.g.As(c.cl.identity())
}

// serverTLS is the handshake's configuration for settings p: nil with TLS off.
func (s *Server) serverTLS(p *config.Parsed) (*tls.Config, error) {
	if s.ids == nil {
		return nil, nil
	}
	cfg := identity.ServerConfig(s.ids, p.Allow())
	cfg.CurvePreferences = p.KeyExchange()
	if p.Config().TLS.Resumption {
		if err := s.tickets.Resume(cfg, s.now()); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// handshake runs mutual TLS with a client that must use it. ok: the client socket the
// connection reads from (its End, kept in the keeper's ledger when there is one) and what TLS
// adds; release gives back the identity's admission. Else the client was refused:
// audited with why, counted, a step towards its source's ban, and closed; nothing of it reached
// the store.
func (s *Server) handshake(tc *net.TCPConn, id uint64, src, dst netip.AddrPort, st *settings) (client clientConn, t *tlsConn, release func(), ok bool) {
	start := s.now()
	// A freeze (an upgrade) does not wait for a handshake, which a client may drag out to
	// tls.handshake-timeout: one under way is cut short (storeguard connect tries again).
	done := make(chan struct{})
	if s.frozen() {
		tc.SetDeadline(time.Unix(1, 0))
	} else {
		started := s.cont.frz.startedCh()
		go func() {
			select {
			case <-started:
				tc.SetDeadline(time.Unix(1, 0))
			case <-done:
			}
		}()
	}
	if st.cfg.TLS.Resumption {
		s.tickets.Rotate(st.tls, start) // a new key when one is due; on failure, the keys it had
	}
	sess, cs, err := tlsrec.Server(tc, st.tls, start.Add(st.cfg.TLS.HandshakeTimeout))
	close(done)
	if err == nil && s.frozen() {
		err = errHandshakeFrozen
	}
	if errors.Is(err, errHandshakeFrozen) || (err != nil && s.frozen()) {
		s.log.Info("TLS handshake cut short by an upgrade; the client may try again", "src", src.String())
		tc.Close()
		return nil, nil, nil, false
	}
	if err != nil {
		why := identity.Classify(err)
		var info *audit.TLS
		var re *identity.RefusedError
		if errors.As(err, &re) && re.Peer != nil {
			info = audit.TLSOf(&cs, re.Peer.ID)
		}
		s.m.handshakes.WithLabelValues(string(why)).Inc()
		e := audit.HandshakeEvent(src, dst, string(why), info)
		e.Timestamp = s.now()
		s.ev.write(e)
		s.ev.refusedFlowTLS(src, dst, e.Reason, start, e.TLS)
		s.log.Info("TLS handshake refused", "src", src.String(), "reason", string(why), "err", err.Error())
		tc.Close()
		if banned := s.gate.Violation(src.Addr()); banned.IsValid() {
			s.ev.bannedFor(src, dst, e.Reason, banned)
		}
		return nil, nil, nil, false
	}
	peer := identity.PeerOf(cs.PeerCertificates[0])
	t = &tlsConn{info: audit.TLSOf(&cs, peer.ID), id: peer.ID, peer: peer, chain: cs.PeerCertificates}
	release, reason := s.gate.AdmitIdentity(src.Addr(), s.sources.Serving(src.Addr()), peer.ID, peer.Names()...)
	if reason != "" {
		s.m.refused.WithLabelValues(string(reason)).Inc()
		e := s.ev.event(src, dst, audit.ActionDenied, string(reason))
		e.TLS = t.info
		s.ev.write(e)
		s.ev.refusedFlowTLS(src, dst, string(reason), start, t.info)
		tc.Close()
		return nil, nil, nil, false
	}
	var ledger *tlsrelay.Ledger // a keeper's, shared with it
	if s.cont.kp != nil {
		ledger = s.cont.ledger
	}
	client, kerr, err := t.start(tc, sess, ledger, id)
	if kerr != nil {
		s.log.Debug("keeper: a TLS connection's state is in this process only; a crash closes it", "src", src.String(),
			"err", kerr)
	}
	if err != nil {
		s.log.Error("TLS: cannot start the relay; closing the client", "src", src.String(), "err", err)
		release()
		tc.Close()
		return nil, nil, nil, false
	}
	s.m.handshakes.WithLabelValues("ok").Inc()
	s.peers.provedBy(src.Addr())
	if cs.DidResume {
		s.m.resumed.Inc()
	}
	return client, t, release, true
}

// freezeRelays freezes the TLS relays of parked connections: what each has left is then data
// (frozenState). The connections' own freeze came first, so no relay waits on a guard; an End
// stopped with its connection (its deadlines are the client socket's).
func freezeRelays(conns []*conn, timeout time.Duration) error {
	for _, c := range conns {
		if !c.cl.freeze(timeout) {
			return fmt.Errorf("%w: the TLS relay of connection %d did not stop", errFreezeTimeout, c.id)
		}
	}
	return nil
}

// errHandshakeFrozen: a handshake that finished after a freeze began; the connection is closed as
// if cut short, since what it would relay belongs to a process that no longer forwards.
var errHandshakeFrozen = errors.New("a freeze began during the handshake")

// ReasonRevoked is why a reload closed a live mutual-TLS connection: tls.allow no longer permits
// its certificate, or access.deny-identities now refuses one of its names.
const ReasonRevoked = "identity_revoked"

// revoke closes the live mutual-TLS connections that the rules of cfg would refuse now, each
// audited (denied, identity_revoked), and takes their addresses out of the peer set unless
// another connection of theirs stays: a reload that denies an identity must not leave its open
// connections working, nor its hosts on this host's free ports. Run after the gate has cfg.
func (s *Server) revoke(p *config.Parsed) {
	if s.ids == nil {
		return
	}
	allow, adm := p.Allow(), p.Admission()
	s.revokeWhere("reload: closed connections whose identity the rules no longer admit", func(c *conn) bool {
		id, peer := c.cl.peer()
		if peer.ID == "" { // handed over by an upgrade or a keeper: only its identity came along
			return adm.DeniesIdentity(id, nil)
		}
		return !allow.Permits(peer) || adm.DeniesIdentity(peer.ID, peer.Names())
	})
}

// revokeUntrusted closes the live mutual-TLS connections whose certificate chain no longer
// verifies against roots, the trust bundle now: a CA taken out of it no longer admits what it
// signed. The chain is judged as at the connection's start, so a leaf that expired since (short-
// lived SVIDs renew under a live connection) is not revoked for that.
func (s *Server) revokeUntrusted(roots *x509.CertPool) {
	verdicts := map[string]bool{} // by leaf signature: a host's connections share a certificate
	s.revokeWhere("trust bundle changed: closed connections whose certificate no longer chains to it", func(c *conn) bool {
		chain := c.cl.chain()
		if len(chain) == 0 {
			return false // handed over: its chain did not come along
		}
		if v, ok := verdicts[string(chain[0].Signature)]; ok {
			return v
		}
		untrusted := !identity.Chains(chain, roots, c.start)
		verdicts[string(chain[0].Signature)] = untrusted
		return untrusted
	})
}

// trustLoop watches the trust bundle (identity.Source.Roots) every trustPoll until ctx ends, and
// revokes what a change no longer admits (revokeUntrusted).
func (s *Server) trustLoop(ctx context.Context) {
	if s.ids == nil {
		return
	}
	last, _ := s.ids.Roots()
	t := time.NewTicker(trustPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		roots, err := s.ids.Roots()
		if err != nil || roots == nil || roots.Equal(last) {
			continue
		}
		last = roots
		s.revokeUntrusted(roots)
	}
}

// trustPoll is how often trustLoop reads the trust bundle: a revocation by rotation takes at most
// this long after the source has the new bundle.
const trustPoll = 250 * time.Millisecond

// revokeWhere closes the live mutual-TLS connections refused says no to, each audited (denied,
// identity_revoked), and takes their addresses out of the peer set unless another connection of
// theirs stays; why is logged with their count.
// The connections are judged outside the registry's lock: a chain's verification takes about
// 100 µs, and accepting must not wait for thousands of them.
func (s *Server) revokeWhere(why string, refused func(c *conn) bool) {
	var live []*conn
	s.reg.mu.Lock()
	for c := range s.reg.conns {
		if c.cl.proved() {
			live = append(live, c)
		}
	}
	s.reg.mu.Unlock()
	var revoked []*conn
	kept := map[netip.Addr]bool{}
	for _, c := range live {
		if refused(c) {
			revoked = append(revoked, c)
		} else {
			kept[c.src.Addr()] = true
		}
	}
	var gone []netip.Addr
	for _, c := range revoked {
		s.m.refused.WithLabelValues(ReasonRevoked).Inc()
		e := s.ev.event(c.src, c.dst, audit.ActionDenied, ReasonRevoked)
		e.ConnID, e.TLS = c.id, c.cl.record()
		s.ev.write(e)
		c.flow.decided(audit.VerdictRefused, ReasonRevoked, c.st.monitor)
		c.flow.ended(endedByGuard)
		c.closeBoth()
		if a := c.src.Addr(); !kept[a] {
			kept[a] = true // listed once
			gone = append(gone, a)
		}
	}
	if len(revoked) > 0 {
		s.log.Warn(why, "connections", len(revoked))
	}
	s.peers.gone(gone)
}
