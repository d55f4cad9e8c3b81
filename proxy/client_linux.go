package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/tlsrelay"
	"github.com/storeguard/storeguard/upgrade"
	"golang.org/x/sys/unix"
)

// The client side in an event loop, in a hand-over and in a keeper (client.go); and the client
// of a connection adopted from a previous process or a keeper's restart, made here whatever its
// kind (adopt, restoreTLS, takeSlots).

// loopRead reads what the client has for a loop into buf, without waiting (cfd: the client's
// descriptor, which the loop holds): p to judge, n the bytes a socket's read (peek) put in buf,
// and more when the client may have more without another event (an End's records already read,
// which epoll will not announce again). p is empty when there is nothing to judge: a kept socket's
// hold alone, its client's end or a reset following it (the hold is dropped; the next event says
// which). err: tlsrelay.ErrWouldBlock when nothing is there, io.EOF at the client's end, or what
// failed.
func (cl *client) loopRead(cfd int32, buf []byte) (p []byte, n int, more bool, err error) {
	if e := cl.tls.merged(); e != nil {
		p, err = e.Next()
		return p, 0, err == nil, err
	}
	var errno unix.Errno
	if cl.kept() {
		n, errno = peekFd(cfd, buf)
	} else {
		n, errno = readFd(cfd, buf)
	}
	switch {
	case n > 0 && n <= cl.hold.n: // consumed: it is in carry
		cl.hold.drop(int(cfd))
		return nil, 0, false, nil
	case n > 0:
		return buf[cl.hold.n:n], n, false, nil
	case errno == unix.EAGAIN:
		return nil, 0, false, tlsrelay.ErrWouldBlock
	case errno == 0:
		return nil, 0, false, io.EOF
	}
	return nil, 0, false, errno
}

// loopReadReply reads what the store's socket ufd has into buf for a loop, without waiting:
// peeked when the keeper holds the connection (client.readReply), and then consumed only once the
// client has it.
func (cl *client) loopReadReply(ufd int32, buf []byte) (n int, peeked bool, errno unix.Errno) {
	if cl.kept() {
		n, errno = peekFd(ufd, buf)
		return n, true, errno
	}
	n, errno = readFd(ufd, buf)
	return n, false, errno
}

// loopPassed is passed (client.go) for a loop: of the n bytes of cfd's read, those passed on are
// consumed from a kept socket, carry bytes being the message in progress; a kept End keeps only
// the records from that message's start.
func (cl *client) loopPassed(cfd int32, n, carry int, unfinished bool) {
	if e := cl.tls.merged(); e != nil {
		settleEnd(e, carry, unfinished)
		return
	}
	if cl.kept() {
		cl.hold.settle(int(cfd), n, carry, unfinished)
	}
}

// loopWrite writes p to the client for a loop, without waiting: the bytes it took (an End's,
// sealed into records written whole), and the errno that stopped it (EAGAIN: full).
func (cl *client) loopWrite(cfd int32, p []byte) (int, unix.Errno) {
	if e := cl.tls.merged(); e != nil {
		w, err := e.TryWrite(p)
		if err != nil {
			return w, unix.EIO
		}
		return w, 0
	}
	return writeFd(cfd, p, nil)
}

// detach takes the client's socket (sk, the goroutines') and the store's (up; nil when not
// connected yet) away from Go's poller for a loop: their descriptors, for the caller to own. An
// End goes on reading and writing its socket's descriptor without waiting. On an error the
// sockets are left as they were.
func (cl *client) detach(sk clientConn, up *net.TCPConn) (cfd, ufd int32, err error) {
	e := cl.tls.merged()
	var s syscall.Conn
	if e != nil {
		s = e.TLS
	} else if s, _ = sk.(sock); s == nil {
		return -1, -1, errors.New("the client is not a socket")
	}
	if cfd, err = dupFd(s); err != nil {
		return -1, -1, err
	}
	ufd = -1
	if up != nil {
		if ufd, err = dupFd(up); err != nil {
			unix.Close(int(cfd))
			return -1, -1, err
		}
		up.Close() // it lives on through the duplicate
	}
	if e != nil {
		e.Detach(int(cfd))
	} else {
		sk.Close()
	}
	return cfd, ufd, nil
}

// attach gives the client's descriptor (a loop's, or a previous process's) to Go's poller: the
// client socket the goroutines read and write (an End, on that socket).
func (cl *client) attach(cfd int32) (clientConn, error) {
	sk, err := attach(cfd)
	if err != nil {
		return nil, err
	}
	if e := cl.tls.merged(); e != nil {
		e.Attach(sk)
		return e, nil
	}
	return sk, nil
}

// closing is called before a loop's client descriptor (cfd; -1: none) is closed: an End sends its
// close_notify, if the socket takes it now.
func (cl *client) closing(cfd int32) {
	if e := cl.tls.merged(); e != nil && cfd >= 0 {
		e.Close()
	}
}

// handoverSock is the client socket a frozen connection's state cs hands over, sk being the
// goroutines': a kept End's TLS socket (the next process takes the End from its slot); an End's
// the guard's end of the pair it goes as (what it was given to write and had not goes there,
// ToClient); else sk. A kept socket's hold stays in it when the next process holds it as this one
// did (socketHolds: cs.InSocket says so), so that a crash of that process before the message
// completes leaves it for the keeper's restart (client.go: hold); else it is consumed, its bytes being in
// Refeed as the carry they are, and reads wake for any byte.
func (cl *client) handoverSock(cs *upgrade.Conn, sk clientConn, carry int, socketHolds bool) syscall.Conn {
	switch {
	case cs.TLS != nil && cs.TLS.Kept:
		return cl.tls.end.TLS
	case cl.tls.merged() != nil:
		return cl.tls.handover[1]
	}
	s, ok := sk.(sock)
	switch {
	case !ok:
		return nil
	case cl.hold.n > 0 && cl.hold.n == carry && len(cs.Refeed) == carry && socketHolds:
		cs.InSocket = cl.hold.n
	default:
		sockFd(s, cl.hold.drop)
	}
	return s
}

// state is a frozen connection's (id) TLS as data, with its descriptors (valid while the
// connection is), nil without TLS. A kept End goes from its slot when the next process takes it
// so (keptEnds). Another End goes as a relay: its TLS socket and the relay's end of the pair it is
// handed over with, whose other end handoverSock sends as the connection's client socket. A relay
// goes as itself.
func (cl *client) state(id uint64, keptEnds bool) (*upgrade.TLSConn, error) {
	t := cl.tls
	if t == nil {
		return nil, nil
	}
	if e := t.end; e != nil && e.Slot() >= 0 && keptEnds {
		st, err := e.HandOff(id) // the next process takes it from its slot
		if err != nil {
			return nil, err
		}
		return &upgrade.TLSConn{Relay: st, Slot: e.Slot(), Kept: true, Identity: t.id, Info: t.info,
			Fd: -1, PlainFd: -1}, nil
	}
	if e := t.end; e != nil {
		t.dropHandover() // a hand-over tried before
		st, relaySide, guardSide, err := e.Handover(id)
		if err != nil {
			return nil, err
		}
		t.handover = [2]*net.TCPConn{relaySide, guardSide}
		ts := &upgrade.TLSConn{Relay: st, Slot: -1, Identity: t.id, Info: t.info}
		sockFd(e.TLS, func(fd int) { ts.Fd = fd })
		sockFd(relaySide, func(fd int) { ts.PlainFd = fd })
		if ts.Fd < 0 || ts.PlainFd < 0 {
			return nil, errors.New("TLS: no descriptor for a socket to hand over")
		}
		return ts, nil
	}
	r := t.relay
	left, err := r.Left()
	if err != nil {
		return nil, err
	}
	ts := &upgrade.TLSConn{Relay: left, Slot: r.Slot(), Identity: t.id, Info: t.info}
	if ts.Fd, ts.PlainFd, err = r.Fds(); err != nil {
		return nil, err
	}
	return ts, nil
}

// keepSock is keepIn with the client's socket tc.
func (cl *client) keepSock(id uint64, src, dst netip.AddrPort, tc syscall.Conn) {
	if cl.kept() {
		sockFd(tc, func(fd int) { cl.keepIn(id, src, dst, fd) })
	}
}

// keepIn gives the keeper the client socket, cfd, of connection id when it holds it: a plaintext
// one as it is; a kept End's TLS socket, with its slot in the shared ledger; a relay's guard end
// of its pair, with the relay's two sockets and its slot.
func (cl *client) keepIn(id uint64, src, dst netip.AddrPort, cfd int) {
	if !cl.kept() {
		return
	}
	kp, t := cl.kp, cl.tls
	switch {
	case t == nil:
		kp.Opened(id, src, dst, cfd)
	case t.end != nil:
		data, err := json.Marshal(keptTLS{Slot: t.end.Slot(), End: true, Identity: t.id, Info: t.info})
		if err == nil && cfd >= 0 {
			kp.OpenedWith(id, src, dst, cfd, data)
		}
	default:
		data, err := json.Marshal(keptTLS{Slot: t.relay.Slot(), Identity: t.id, Info: t.info})
		if err != nil {
			return
		}
		tlsFd, plainFd, err := t.relay.Fds()
		if err != nil {
			return
		}
		kp.OpenedWith(id, src, dst, cfd, data, tlsFd, plainFd)
	}
}

// runRelay starts the copying of an adopted connection's relay (a relay handed over, or from its slot).
func (cl *client) runRelay() {
	if t := cl.tls; t != nil && t.relay != nil {
		t.relay.Run()
	}
}

// takeHold holds, as its own, the n bytes a previous process left at the head of the client
// socket cfd (upgrade.Conn.InSocket), refeed long: a socket of a plaintext client that is kept
// and peeked.
func (cl *client) takeHold(cfd, n, refeed int) {
	cl.hold.take(cfd, n, refeed, cl.kept() && cl.tls == nil)
}

// discard closes what an adopted connection's TLS (t, nil: none) holds, when it is not started.
func (t *tlsConn) discard() {
	if t == nil {
		return
	}
	if t.relay != nil {
		t.relay.Close()
	}
	if t.end != nil {
		t.end.Release()
	}
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

// The client of an adopted connection.
//
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
