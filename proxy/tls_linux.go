package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/tlsrelay"
	"github.com/storeguard/storeguard/upgrade"
	"golang.org/x/sys/unix"
)

// A mutual-TLS connection in an upgrade: its relay, frozen with it, goes as data
// (upgrade.TLSConn) with the connection, and the new process resumes it. An End goes as a relay
// too, with a new loopback pair (tlsrelay.End.Handover): any build that takes relays takes it.

// endFrom makes an adopted mutual-TLS connection an End again when no keeper holds it (a keeper
// needs the relay's pair and slot) and the relay's pair has settled (tlsrelay.EndFrom), as an
// End's hand-over leaves it and a relay between records does: what waited in the pair goes to
// the client's bytes to judge (after Refeed) and the replies to write (ahead of ToClient), the
// pair's sockets close, and the TLS socket is the connection's client socket. Its End, or nil: the
// relay goes on (resumeTLS), unless err: the connection cannot go on. keeper: the process has one.
func endFrom(ac *adoptedConn, keeper bool, log *slog.Logger) (*tlsConn, error) {
	t := ac.st.TLS
	if keeper || relaysStay.Load() {
		return nil, nil
	}
	e, toStore, toClient, err := tlsrelay.EndFrom(t.Fd, t.Relay, t.PlainFd, ac.st.ClientFd, ac.st.ToClient)
	switch {
	case errors.Is(err, tlsrelay.ErrPairLost):
		unix.Close(t.Fd)
		unix.Close(t.PlainFd)
		return nil, err
	case err != nil:
		if !errors.Is(err, tlsrelay.ErrPairBusy) {
			log.Debug("upgrade: a TLS connection goes on as a relay", "conn", ac.c.id, "err", err.Error())
		}
		return nil, nil
	}
	unix.Close(t.PlainFd)
	unix.Close(ac.st.ClientFd)
	ac.st.ClientFd, ac.st.TLS, ac.st.ToClient = t.Fd, nil, toClient
	ac.st.Refeed = append(ac.st.Refeed, toStore...)
	return &tlsConn{end: e, info: t.Info, id: t.Identity}, nil
}

// adopt makes the client of a connection adopted from an upgrade or a keeper (ac), and reports
// whether it is a kept End: a plaintext one is its socket; a TLS one goes on from its slot in the
// ledger (ac.tls: a crash, or an upgrade that handed the ledger over), or as the End or relay the
// previous process handed over (endFrom, resumeTLS), and then the keeper, if it holds the
// connection, learns its new state. On an error the connection cannot go on.
func (cl *client) adopt(ac *adoptedConn, ledger *tlsrelay.Ledger, log *slog.Logger) (keptEnd bool, err error) {
	c := ac.c
	if t := ac.st.TLS; t != nil {
		tc, err := endFrom(ac, cl.kp != nil, log)
		if err == nil && tc == nil {
			tc, err = resumeTLS(t, ledger)
		}
		if err != nil {
			return false, err
		}
		cl.tls = tc
		cl.runRelay()
		cl.keepIn(c.id, c.src, c.dst, ac.st.ClientFd) // its state is in this process's ledger now
		if ac.st.StoreFd >= 0 {
			cl.storeConnected(c.id, ac.st.StoreFd)
		}
	}
	if ac.tls != nil {
		cl.tls = ac.tls
		cl.runRelay()
	}
	return cl.keptEnd(), nil
}

// relaysStay keeps adopted relays relays, as builds before EndFrom did (tests).
var relaysStay atomic.Bool

// resumeTLS makes an adopted connection's relay from what the previous process handed over (t);
// on failure the connection closes (its client's TLS session cannot go on).
func resumeTLS(t *upgrade.TLSConn, ledger *tlsrelay.Ledger) (*tlsConn, error) {
	tlsSock, plain, err := tlsrelay.FromFds(t.Fd, t.PlainFd)
	if err != nil {
		return nil, err
	}
	r, err := tlsrelay.Resume(tlsSock, plain, t.Relay, ledger)
	if err != nil {
		return nil, err
	}
	return &tlsConn{relay: r, info: t.Info, id: t.Identity}, nil
}

// restoreTLS readies the client of a TLS connection a keeper gave back after a crash (ac), from
// what it kept (data: a keptTLS; nil for plaintext) and the sockets of its own (extra): a kept
// End is made from its slot once the worker reconciles it (ac.kend, restoreEnd); a relay now, from
// its two sockets (its end of the pair) and its slot in the shared ledger (ac.tls). On an error
// the connection cannot go on; extra is closed.
func (s *Server) restoreTLS(ac *adoptedConn, data []byte, extra []int) error {
	var k keptTLS
	if len(extra) == 0 {
		if data == nil || json.Unmarshal(data, &k) != nil || !k.End {
			return nil // plaintext
		}
		if s.cont.ledger == nil {
			return errors.New("a kept End's state is in no ledger")
		}
		ac.kend = &k
		return nil
	}
	if len(extra) != 2 || s.cont.ledger == nil {
		fdpass.CloseFds(extra)
		return fmt.Errorf("a relay with %d sockets of its own, ledger %t", len(extra), s.cont.ledger != nil)
	}
	if err := json.Unmarshal(data, &k); err != nil {
		fdpass.CloseFds(extra)
		return err
	}
	var err error
	ac.tls, err = s.slotRelay(ac.c.id, k, extra[0], extra[1])
	return err
}

// takeSlots makes the relays and Ends of the TLS connections handed over from their slots in the
// keeper's ledger (takeLedger), before any relay takes a new slot there (one the old process ran
// in a ledger of its own, its shared one full). Nothing is written to a slot before a relay runs.
func (s *Server) takeSlots(a *adoption) {
	for i := range a.conns {
		ac := &a.conns[i]
		t := ac.st.TLS
		if t == nil || t.Slot < 0 {
			continue
		}
		ac.st.TLS = nil // the relay's sockets are its own from here
		if t.Kept {
			ac.tls, ac.lost = s.slotEnd(ac, t)
			continue
		}
		ac.tls, ac.lost = s.slotRelay(ac.c.id, keptTLS{Slot: t.Slot, Identity: t.Identity, Info: t.Info}, t.Fd, t.PlainFd)
	}
}

// closeTLS closes what an adopted connection that cannot go on (ac) has of TLS: the sockets of a
// relay handed over, or its relay or End from a slot.
func (ac *adoptedConn) closeTLS() {
	if t := ac.st.TLS; t != nil && t.Fd >= 0 {
		unix.Close(t.Fd)
		unix.Close(t.PlainFd)
	}
	ac.tls.discard()
}

// slotEnd makes the kept End an upgrade handed off (t) from its slot in the shared ledger, on the
// connection's client socket (its TLS socket): the connection's carry and bytes to judge are the
// plaintext it had opened, and the replies it had not written whole go first (ToClient).
func (s *Server) slotEnd(ac *adoptedConn, t *upgrade.TLSConn) (*tlsConn, error) {
	if s.cont.ledger == nil {
		return nil, errors.New("a kept End and no ledger")
	}
	e, err := tlsrelay.EndFromSlot(s.cont.ledger, t.Slot, ac.c.id, ac.st.ClientFd, t.Relay, ac.st.ToClient)
	if err != nil {
		return nil, err
	}
	return &tlsConn{end: e, info: t.Info, id: t.Identity}, nil
}

// restoreEnd makes a kept End the keeper gave back after a crash from its slot and its sockets
// (tlsrelay.RestoreEnd), and says why the connection must close if it cannot go on exactly.
func (s *Server) restoreEnd(ac *adoptedConn) (lost string, err error) {
	k := ac.kend
	e, err := tlsrelay.RestoreEnd(s.cont.ledger, k.Slot, ac.c.id, ac.st.ClientFd, ac.st.StoreFd)
	switch {
	case errors.Is(err, tlsrelay.ErrLostRequest):
		return lostRequest, err
	case errors.Is(err, tlsrelay.ErrLostReply):
		return lostReply, err
	case err != nil:
		return lostCounts, err
	}
	ac.tls = &tlsConn{end: e, info: k.Info, id: k.Identity}
	return "", nil
}

// slotRelay makes connection id's relay from its sockets and its slot in the shared ledger (a
// keeper's restart, or an upgrade that handed the ledger over); it writes nothing there before
// the relay runs. The descriptors are the relay's from the call: closed if it cannot be made.
func (s *Server) slotRelay(id uint64, k keptTLS, tlsFd, plainFd int) (*tlsConn, error) {
	tlsSock, plain, err := tlsrelay.FromFds(tlsFd, plainFd)
	if err != nil {
		return nil, err
	}
	r, err := tlsrelay.Restore(tlsSock, plain, s.cont.ledger, k.Slot, id)
	if err != nil {
		return nil, err
	}
	return &tlsConn{relay: r, info: k.Info, id: k.Identity}, nil
}
