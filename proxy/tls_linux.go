package proxy

import (
	"encoding/json"
	"errors"
	"net"
	"sync/atomic"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/tlsrelay"
	"github.com/storeguard/storeguard/upgrade"
	"golang.org/x/sys/unix"
)

// A mutual-TLS connection in an upgrade: its relay, frozen with it, goes as data
// (upgrade.TLSConn) with the connection, and the new process resumes it. An End goes as a relay
// too, with a new loopback pair (tlsrelay.End.Handover): any build that takes relays takes it.

// tlsState is a frozen connection's relay as data, with its descriptors (valid while c is). An
// End's are its TLS socket and the relay's end of the pair it is handed over with, whose other
// end frozenState sends as the connection's client socket.
func (c *conn) tlsState() (*upgrade.TLSConn, error) {
	if c.tls == nil {
		return nil, nil
	}
	if e := c.tls.end; e != nil && e.Slot() >= 0 && c.s.cont.keptEnds {
		st, err := e.HandOff(c.id) // the next process takes it from its slot
		if err != nil {
			return nil, err
		}
		return &upgrade.TLSConn{Relay: st, Slot: e.Slot(), Kept: true, Identity: c.tls.id, Info: c.tls.info,
			Fd: -1, PlainFd: -1}, nil
	}
	if e := c.tls.end; e != nil {
		c.tls.dropHandover() // a hand-over tried before
		st, relaySide, guardSide, err := e.Handover(c.id)
		if err != nil {
			return nil, err
		}
		c.tls.handover = [2]*net.TCPConn{relaySide, guardSide}
		t := &upgrade.TLSConn{Relay: st, Slot: -1, Identity: c.tls.id, Info: c.tls.info}
		sockFd(e.TLS, func(fd int) { t.Fd = fd })
		sockFd(relaySide, func(fd int) { t.PlainFd = fd })
		if t.Fd < 0 || t.PlainFd < 0 {
			return nil, errors.New("TLS: no descriptor for a socket to hand over")
		}
		return t, nil
	}
	r := c.tls.relay
	left, err := r.Left()
	if err != nil {
		return nil, err
	}
	t := &upgrade.TLSConn{Relay: left, Slot: r.Slot(), Identity: c.tls.id, Info: c.tls.info}
	if t.Fd, t.PlainFd, err = r.Fds(); err != nil {
		return nil, err
	}
	return t, nil
}

// endFrom makes an adopted mutual-TLS connection an End again when no keeper holds it (a keeper
// needs the relay's pair and slot) and the relay's pair has settled (tlsrelay.EndFrom), as an
// End's hand-over leaves it and a relay between records does: what waited in the pair goes to
// the client's bytes to judge (after Refeed) and the replies to write (ahead of ToClient), the
// pair's sockets close, and the TLS socket is the connection's client socket. It reports whether
// it did; if not, the relay goes on (resumeTLS), unless err: the connection cannot go on.
func (c *conn) endFrom(ac *adoptedConn) (bool, error) {
	t := ac.st.TLS
	if c.s.cont.kp != nil || relaysStay.Load() {
		return false, nil
	}
	e, toStore, toClient, err := tlsrelay.EndFrom(t.Fd, t.Relay, t.PlainFd, ac.st.ClientFd, ac.st.ToClient)
	switch {
	case errors.Is(err, tlsrelay.ErrPairLost):
		unix.Close(t.Fd)
		unix.Close(t.PlainFd)
		return false, err
	case err != nil:
		if !errors.Is(err, tlsrelay.ErrPairBusy) {
			c.s.log.Debug("upgrade: a TLS connection goes on as a relay", "conn", c.id, "err", err.Error())
		}
		return false, nil
	}
	unix.Close(t.PlainFd)
	unix.Close(ac.st.ClientFd)
	ac.st.ClientFd, ac.st.TLS, ac.st.ToClient = t.Fd, nil, toClient
	ac.st.Refeed = append(ac.st.Refeed, toStore...)
	c.setTLS(&tlsConn{end: e, info: t.Info, id: t.Identity})
	return true, nil
}

// relaysStay keeps adopted relays relays, as builds before EndFrom did (tests).
var relaysStay atomic.Bool

// resumeTLS makes an adopted connection's relay from what the previous process handed over
// and starts it; on failure the connection closes (its client's TLS session cannot go on).
func (c *conn) resumeTLS(t *upgrade.TLSConn) error {
	tlsSock, plain, err := tlsrelay.FromFds(t.Fd, t.PlainFd)
	if err != nil {
		return err
	}
	r, err := tlsrelay.Resume(tlsSock, plain, t.Relay, c.s.cont.ledger)
	if err != nil {
		return err
	}
	c.setTLS(&tlsConn{relay: r, info: t.Info, id: t.Identity})
	r.Run()
	return nil
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

// keepTLS gives the keeper a TLS connection: a kept End's TLS socket (cfd) as its client socket,
// with its slot in the shared ledger; or a relay's: the guard's end of the relay's pair (cfd) as
// its client socket, with the relay's two sockets and its slot.
func (c *conn) keepTLS(cfd int) {
	if e := c.tls.end; e != nil {
		data, err := json.Marshal(keptTLS{Slot: e.Slot(), End: true, Identity: c.tls.id, Info: c.tls.info})
		if err == nil && cfd >= 0 {
			c.s.cont.kp.OpenedWith(c.id, c.src, c.dst, cfd, data)
		}
		return
	}
	r := c.tls.relay
	data, err := json.Marshal(keptTLS{Slot: r.Slot(), Identity: c.tls.id, Info: c.tls.info})
	if err != nil {
		return
	}
	tlsFd, plainFd, err := r.Fds()
	if err != nil {
		return
	}
	c.s.cont.kp.OpenedWith(c.id, c.src, c.dst, cfd, data, tlsFd, plainFd)
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
