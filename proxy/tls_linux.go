package proxy

import (
	"encoding/json"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/storeguard/storeguard/audit"
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

// keptTLS is what a keeper keeps of a mutual-TLS connection besides its sockets (keeper.Conn.Data),
// for the process it starts after a crash: where the relay's state is, and who the peer proved to
// be.
type keptTLS struct {
	Slot     int
	End      bool `json:",omitempty"` // a kept End (tlsrelay.End.Keep), not a relay
	Identity string
	Info     *audit.TLS
}

// restoreTLS makes the relay of a TLS connection a keeper gave back after a crash, from its
// sockets (tlsFd, plainFd: the relay's end of the pair) and its slot in the shared ledger.
func (s *Server) restoreTLS(id uint64, data []byte, tlsFd, plainFd int) (*tlsConn, error) {
	var k keptTLS
	if err := json.Unmarshal(data, &k); err != nil {
		unix.Close(tlsFd)
		unix.Close(plainFd)
		return nil, err
	}
	return s.slotRelay(id, k, tlsFd, plainFd)
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
