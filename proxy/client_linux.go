package proxy

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/tlsrelay"
	"github.com/storeguard/storeguard/upgrade"
	"golang.org/x/sys/unix"
)

// The client side in an event loop, in a hand-over and in a keeper (client.go).

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
