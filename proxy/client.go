package proxy

import (
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/internal/tcpcount"
	"github.com/storeguard/storeguard/keeper"
	"github.com/storeguard/storeguard/tlsrec"
	"github.com/storeguard/storeguard/tlsrelay"
	"golang.org/x/sys/unix"
)

// A connection's client side is one type, client, whichever kind it is (docs/design.md, "A
// connection's client side"):
//   - a socket: the accepted TCP connection, or the guard's end of a TLS relay's loopback pair (a
//     mutual-TLS connection handed over as a relay, tlsrelay.Relay, which opens its records into
//     the pair);
//   - a TLS End (tlsrelay.End): the connection opens and seals its records itself, on its socket.
//
// Either may be kept: its keeper holds the socket, and what the guard has not passed on stays
// there (a socket is peeked, and its bytes consumed once passed on: its hold, below; an End keeps
// its records in the ledger it shares with the keeper). The transports read the next plaintext,
// settle what the guard passed on, write without waiting, detach the client for a loop and attach
// it back, hand it over and release it through client's methods, and never ask which kind it is:
// this file and client_linux.go do.
type client struct {
	tls  *tlsConn     // what mutual TLS adds (below; the handshake: tls.go): nil for plaintext
	hold hold         // a kept socket's start of the message in progress (below)
	kp   *keeper.Link // the server's keeper (Server.UseKeeper, before it serves): nil without one
	// rc is the raw connection of rcOf, the socket the goroutines read last: taken once a socket,
	// not once a read.
	rc   syscall.RawConn
	rcOf clientConn
}

// kept reports whether a keeper holds the connection's sockets: a TLS connection's too when its
// End's or relay's state is in the ledger shared with the keeper (docs/design.md, "What a crash
// costs a TLS connection").
func (cl *client) kept() bool {
	if cl.kp == nil {
		return false
	}
	switch t := cl.tls; {
	case t == nil:
		return true
	case t.end != nil:
		return t.end.Slot() >= 0
	case t.relay != nil:
		return t.relay.Slot() >= 0
	}
	return false
}

// useTLS makes the client a mutual-TLS one, t (nil: plaintext).
func (cl *client) useTLS(t *tlsConn) { cl.tls = t }

// proved reports whether the client proved an identity by mutual TLS.
func (cl *client) proved() bool { return cl.tls != nil }

// identity is the identity the client proved, "" without TLS.
func (cl *client) identity() string { return cl.tls.identity() }

// record is the client's TLS record for the connection's events, nil without TLS.
func (cl *client) record() *audit.TLS { return cl.tls.record() }

// peer is the identity the client proved, and its certificate's names (cert): zero when it was
// handed over by an upgrade or a keeper (only its identity came along); "" without TLS.
func (cl *client) peer() (id string, cert identity.Peer) {
	if t := cl.tls; t != nil {
		return t.id, t.peer
	}
	return "", identity.Peer{}
}

// chain is the certificate chain the client presented: nil without TLS, or when handed over.
func (cl *client) chain() []*x509.Certificate {
	if t := cl.tls; t != nil {
		return t.chain
	}
	return nil
}

// keptEnd reports whether the client is a TLS End in the keeper's ledger.
func (cl *client) keptEnd() bool {
	e := cl.tls.merged()
	return e != nil && e.Slot() >= 0
}

// unopened reports whether the client has read bytes it has not opened yet (an End's records):
// a loop would not hear of them, since they are no longer in the socket.
func (cl *client) unopened() bool {
	e := cl.tls.merged()
	return e != nil && e.Buffered() > 0
}

// A kept connection's keeper holds both its sockets; the client tells it of the store's and of
// the end, and the store's socket is peeked (readReply), its bytes left there until the client
// has them: what a crash would otherwise lose. Without a keeper these do nothing.

// storeConnected tells the keeper that connection id's store socket is fd.
func (cl *client) storeConnected(id uint64, fd int) {
	if cl.kept() {
		cl.kp.Connected(id, fd)
	}
}

// storeConnectedSock is storeConnected with the store's socket up.
func (cl *client) storeConnectedSock(id uint64, up syscall.Conn) {
	if cl.kept() {
		sockFd(up, func(fd int) { cl.storeConnected(id, fd) })
	}
}

// ended tells the keeper that connection id ended.
func (cl *client) ended(id uint64) {
	if cl.kept() {
		cl.kp.Ended(id)
	}
}

// readReply reads the store's next bytes for the goroutines from rc, the store's socket, into a
// pooled buffer, waiting for them: peeked when the keeper holds the connection, and then
// consumed (consumePeeked) only once the client has them.
func (cl *client) readReply(rc syscall.RawConn) (bp *[]byte, n int, peeked bool, err error) {
	peeked = cl.kept()
	bp, n, err = readPooled(rc, peeked, 0)
	return bp, n, peeked, err
}

// clientRead is what one read of the goroutines' took: a socket's pooled buffer and the bytes
// read (peeked) into it.
type clientRead struct {
	bp *[]byte
	n  int
}

// next reads the client's next plaintext for the goroutines, from sk (the client socket they
// hold), waiting for it: p to judge, valid until passed is called with r; and the error that ended
// the read, if any. p is empty when there was nothing new: a kept socket's hold alone (the
// client's end or a reset follows it, and the hold is dropped), or an End's record without
// plaintext. An End first settles what was judged before (what a previous process handed on, or
// the last read), then opens a record.
func (cl *client) next(sk clientConn, carry int, unfinished bool) (p []byte, r clientRead, err error) {
	if e := cl.tls.merged(); e != nil {
		settleEnd(e, carry, unfinished)
		p, err = e.Next()
		return p, r, err
	}
	if sk != cl.rcOf {
		if cl.rc, err = rawOf(sk); err != nil {
			return nil, r, err
		}
		cl.rcOf = sk
	}
	r.bp, r.n, err = readPooled(cl.rc, cl.kept(), cl.hold.n)
	if r.n > 0 && r.n <= cl.hold.n { // nothing after the hold, and the client's end or a reset follows it
		readBufs.Put(r.bp)
		cl.rc.Control(func(fd uintptr) { cl.hold.drop(int(fd)) })
		return nil, clientRead{}, err
	}
	if r.n > 0 {
		p = (*r.bp)[cl.hold.n:r.n]
	}
	return p, r, err
}

// passed is called once the plaintext of r (next) was judged and acted on, carry bytes of it being
// the message in progress: a kept socket's bytes passed on are consumed, and its buffer goes back.
func (cl *client) passed(r clientRead, carry int, unfinished bool) {
	if r.bp == nil {
		return
	}
	if cl.kept() {
		cl.rc.Control(func(fd uintptr) { cl.hold.settle(int(fd), r.n, carry, unfinished) })
	}
	readBufs.Put(r.bp)
}

// settleEnd tells a kept TLS End how much of the plaintext it opened is passed on (all but the
// message in progress, carry bytes), so that it keeps only the records from that message's start
// (tlsrelay.End.Settle): the End's ring is its hold. What is left to finish (unfinished: judged
// bytes not written yet) is in this process's memory only, so nothing settles then; the next read
// settles it. Goroutines settle
// before each read, so that what a previous process handed on (Refeed, ToStore) is settled once
// judged and written, before the End reads on.
func settleEnd(e *tlsrelay.End, carry int, unfinished bool) {
	if unfinished {
		return
	}
	e.Settle(carry)
}

// tryWrite writes p to the client without waiting (sk: the client socket the goroutines hold):
// what it takes now.
func (cl *client) tryWrite(sk clientConn, p []byte) (int, error) {
	if e := cl.tls.merged(); e != nil {
		return e.TryWrite(p)
	}
	rc, err := rawOf(sk)
	if err != nil {
		return 0, err
	}
	var n int
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		for {
			n, werr = syscall.Write(int(fd), p)
			if werr != syscall.EINTR {
				break
			}
		}
		return true
	})
	if werr == syscall.EAGAIN {
		return 0, nil
	}
	if n < 0 {
		n = 0
	}
	if err == nil && werr != nil {
		err = os.NewSyscallError("write", werr)
	}
	return n, err
}

// release gives back what the client holds beyond its socket as the connection ends: an End's
// slot in the ledger.
func (cl *client) release() {
	if e := cl.tls.merged(); e != nil {
		e.Release()
	}
}

// freeze stops a relay's copying for a freeze (an End stops with its connection: its deadlines are
// the client socket's); false when it did not stop within timeout.
func (cl *client) freeze(timeout time.Duration) bool {
	if t := cl.tls; t != nil && t.relay != nil {
		return t.relay.Freeze(max(timeout, 100*time.Millisecond))
	}
	return true
}

// thaw lets the client go on after a freeze that handed nothing over: a relay copies again; an
// End goes on as it was, and the pair it was to be handed over with goes.
func (cl *client) thaw() {
	switch t := cl.tls; {
	case t == nil:
	case t.relay != nil:
		t.relay.Thaw()
	default:
		t.end.Thaw()
		t.dropHandover()
	}
}

// sock is a socket: the accepted TCP connection, the guard's end of a TLS relay's loopback pair,
// the store's.
type sock = tlsrelay.Sock

// clientConn is the client side as the goroutines hold it (goroutines.client): a socket, or a TLS
// End on its socket; its deadlines, its writes that wait, its close. Reads and writes that do not
// wait go through client (next, tryWrite), which knows which it is: an End is no socket.
type clientConn = net.Conn

// rawOf is the raw connection of a socket kind's sk: an End has none.
func rawOf(sk clientConn) (syscall.RawConn, error) {
	sc, ok := sk.(syscall.Conn)
	if !ok {
		return nil, errors.New("the client is not a socket")
	}
	return sc.SyscallConn()
}

// tlsConn is what mutual TLS adds to a connection: its End or its relay, and who the peer
// proved to be.
type tlsConn struct {
	end   *tlsrelay.End   // the connection reads and writes the plaintext itself
	relay *tlsrelay.Relay // handed over as a relay: through a loopback pair
	info  *audit.TLS      // on every event and flow record of the connection
	id    string          // the peer's identity (identity.Peer.ID)
	peer  identity.Peer   // its certificate's names, judged again when a reload changes the rules (revoke); zero when handed over
	// chain: the certificates it presented, verified again when the trust bundle changes
	// (revokeUntrusted); nil when handed over
	chain []*x509.Certificate
	// handover: the loopback pair an End is being handed over with (frozenState), closed by a
	// thaw.
	handover [2]*net.TCPConn
}

// start makes t's End on the client's TLS socket tc, from the handshake's session (sess): the
// client socket the goroutines hold. With a ledger (a keeper's) the End keeps its state there
// under connection id; kerr says why it could not (a crash then closes the connection).
func (t *tlsConn) start(tc *net.TCPConn, sess *tlsrec.Session, ledger *tlsrelay.Ledger, id uint64) (client clientConn, kerr, err error) {
	if t.end, err = tlsrelay.NewEnd(tc, sess); err != nil {
		return nil, nil, err
	}
	if ledger != nil {
		kerr = t.end.Keep(ledger, id)
	}
	return t.end, kerr, nil
}

// merged is the connection's TLS End: its goroutines, or the event loop that takes it, open and
// seal its records themselves. Nil for plaintext and relayed connections.
func (t *tlsConn) merged() *tlsrelay.End {
	if t == nil {
		return nil
	}
	return t.end
}

// record is the connection's TLS record for its events, nil without TLS.
func (t *tlsConn) record() *audit.TLS {
	if t == nil {
		return nil
	}
	return t.info
}

// identity is the peer's proved identity, "" without TLS.
func (t *tlsConn) identity() string {
	if t == nil {
		return ""
	}
	return t.id
}

// dropHandover closes the loopback pair an End was to be handed over with.
func (t *tlsConn) dropHandover() {
	for i, s := range t.handover {
		if s != nil {
			s.Close()
			t.handover[i] = nil
		}
	}
}

// readSize is the size of the pooled read buffers. Buffers are taken only once a socket is
// readable and given back after each read, so an idle connection holds none.
const readSize = 16 << 10

var readBufs = sync.Pool{New: func() any { b := make([]byte, readSize); return &b }}

// readPooled reads what the socket has into a pooled buffer, taking the buffer only once data is
// there: while the socket would block, the buffer goes back to the pool, so an idle connection
// holds none. The caller returns the buffer when n > 0. It costs the same system calls as a
// plain Read (a read that would block, then the read that succeeds). With peek, the bytes stay
// in the socket until hold.settle takes them, once they are passed on: a connection its keeper
// holds is read so, and a worker that dies in between loses none of them (keeper_linux.go). The
// first held of them are a hold (below): it waits for a byte after them, and returns n <= held
// only when none will come (the peer's end of stream or a reset).
func readPooled(rc syscall.RawConn, peek bool, held int) (bp *[]byte, n int, err error) {
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		if bp == nil {
			bp = readBufs.Get().(*[]byte)
		}
		for {
			if peek {
				n, _, rerr = syscall.Recvfrom(int(fd), *bp, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			} else {
				n, rerr = syscall.Read(int(fd), *bp)
			}
			if rerr != syscall.EINTR {
				break
			}
		}
		if rerr == syscall.EAGAIN || rerr == nil && n > 0 && n <= held && tcpcount.PeerOpen(int(fd)) {
			readBufs.Put(bp)
			bp = nil
			return false
		}
		return true
	})
	if bp == nil {
		// The last try found nothing past the hold (or nothing at all), and the wait ended (a
		// freeze's deadline): nothing was read. Its n must not pass for a read of the hold
		// alone, which the caller takes for the client's end and consumes.
		n = 0
	}
	switch {
	case err != nil:
	case rerr != nil:
		err = os.NewSyscallError("read", rerr)
	case n == 0:
		err = io.EOF
	}
	if n <= 0 {
		if bp != nil {
			readBufs.Put(bp)
		}
		return nil, 0, err
	}
	return bp, n, err
}

// A connection its keeper holds is read with MSG_PEEK, and its bytes are consumed only once passed
// on (keeper_linux.go). The start of a message still in progress is not passed on yet: were it
// consumed, a worker that died before the rest came would take it with it, and its successor
// could only close the connection (restart_lost_request). torch 1.13's client sends a message's
// opcode with a send of its own, so a crash can find one half received. So that start, up to
// holdMax bytes, stays in the socket as well as in carry (the hold): the guard judges only what
// comes after it, and the socket's low-water mark (SO_RCVLOWAT) is one byte past it, so that
// neither epoll nor Go's poller reports the socket until something new is there. A worker that
// dies meanwhile leaves the message whole in the socket, consumed up to its first byte: its
// successor starts between messages and reads it again. An upgrade hands the hold on: its bytes go
// to the next process in Refeed, as the carry they are, and stay in the socket (upgrade.Conn.
// InSocket), which the next process holds as its own (hold.take), so that its crash before the
// message completes loses nothing either; to a build from before that, the freeze consumes them.
// A start larger than holdMax is consumed as before.

// holdMax is the largest start of a message left in the socket: each read peeks it again.
const holdMax = readSize / 2

// hold is the start of the message in progress left in the client's socket.
type hold struct {
	n     int // bytes at the head of the socket, judged and in carry
	lowat int // the socket's SO_RCVLOWAT as set (0: the system's default, 1)
}

// settle consumes, of the n bytes peeked from fd's head, those passed on, leaving in the socket
// the start of a message in progress (carry bytes long) when it can be held there: all of it was
// peeked this time or held before, it is small, and nothing judged waits to be written (unfinished).
func (h *hold) settle(fd, n, carry int, unfinished bool) {
	keep := carry
	if keep > n || keep > holdMax || unfinished {
		keep = 0
	}
	if keep > 0 && !h.setLowat(fd, keep+1) {
		keep = 0
	}
	tcpcount.Discard(fd, uint64(n-keep)) // one that fails leaves them for the next read to fail too
	h.n = keep
	if keep == 0 {
		h.setLowat(fd, 1)
	}
}

// take takes the n bytes at the head of fd, the start of a message the previous process held there
// and handed on in Refeed too (refeed bytes long; upgrade.Conn.InSocket), as this process's hold:
// its reads skip them, and a crash before the message completes leaves them in the socket. When
// it cannot hold them (peeked: false, a connection it does not read by peeking; or a hand-over that
// does not add up) it consumes them, as a process that knows no socket hold would have had them.
func (h *hold) take(fd, n, refeed int, peeked bool) {
	if peeked && n <= refeed && n <= holdMax && h.setLowat(fd, n+1) {
		h.n = n
		return
	}
	tcpcount.Discard(fd, uint64(n))
	h.setLowat(fd, 1)
}

// drop consumes the hold (its bytes are in carry) and lets fd's reads wake for any byte: the peer's
// end of stream or a reset came after it, or a freeze hands the connection on.
func (h *hold) drop(fd int) {
	if h.n > 0 {
		tcpcount.Discard(fd, uint64(h.n))
		h.n = 0
	}
	h.setLowat(fd, 1)
}

// setLowat sets fd's SO_RCVLOWAT to v unless it is so already, and reports whether it is.
func (h *hold) setLowat(fd, v int) bool {
	if h.lowat == v || h.lowat == 0 && v == 1 {
		return true
	}
	if setRcvLowat(fd, v) != nil {
		return false
	}
	h.lowat = v
	return true
}

// setRcvLowat sets fd's SO_RCVLOWAT: reads and polls wake once v bytes wait.
func setRcvLowat(fd, v int) error {
	return os.NewSyscallError("setsockopt SO_RCVLOWAT", unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT, v))
}
