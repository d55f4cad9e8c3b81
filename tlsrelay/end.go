package tlsrelay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/storeguard/storeguard/internal/tcpcount"
	"github.com/storeguard/storeguard/tlsrec"
)

// End is a TLS connection whose plaintext the proxy reads and writes itself, in the goroutines
// that judge it: the master's guard when no keeper holds its connections (a keeper needs a
// Relay, whose state is the kernel's counters and a ledger slot). Against a Relay it saves, for
// each request and its reply, a loopback pair's two writes, two reads and their wake-ups
// (docs/design.md, "What the master's relay costs").
//
// Next reads and opens records (one goroutine); Write and TryWrite seal and write them
// (one at a time). Deadlines are the TLS socket's, so a freeze stops both as it stops any
// client. An event loop takes an End's descriptor (Detach) and gives it back (Attach). A frozen
// End goes to another process as a Relay (Handover): its state, a new loopback pair and the
// sockets.
type End struct {
	TLS           Sock
	suite         uint16
	local, remote net.Addr
	tmu           sync.Mutex // TLS, for the deadlines another goroutine sets, while Detach and Attach change it

	// The read side (Next's goroutine).
	in       *tlsrec.Half
	rbuf     []byte  // records read: rbuf[roff:rn] not opened yet (nil: none, and nothing read)
	rbp      *[]byte // rbuf's, from recBufs
	roff, rn int
	rc       syscall.RawConn
	readFn   func(fd uintptr) bool
	// fd, when not -1: the End is detached (Detach) and reads and writes this descriptor
	// without waiting; TLS is nil meanwhile.
	fd int
	rd struct {
		dst []byte // where to read (a kept End's ring); nil: rbuf[rn:]
		n   int
		err error
	}
	k      *kept // the End's state in a keeper's ledger (kept.go); nil: in this process only
	rEnded bool  // close_notify came, or the end of stream between records
	asked  atomic.Uint64

	// The write side.
	wmu      sync.Mutex
	out      *tlsrec.Half
	answered uint64 // KeyUpdates sent (each answers every one asked before it)
	// The record under way: wrec[wsent:] is still to write (wrec, in wbuf, is nil when none
	// is). It was sealed at wseq from wlen bytes at the start of what the caller passed (kind
	// 'd'), or is a KeyUpdate ('k', sealed under wsecret) or close_notify ('c').
	wbuf    []byte
	wbp     *[]byte // wbuf's, from sealBufs
	wrec    []byte
	wsent   int
	wlen    int
	wkind   byte
	wseq    uint64
	wsecret []byte
	wprev   uint64 // answered before a KeyUpdate under way
	wc      syscall.RawConn
	writeFn func(fd uintptr) bool
	wr      struct {
		p   []byte
		n   int
		err error
	}
	wEnded bool // close_notify sent
	closed atomic.Bool
	// handed: Handover made the End another process's, until Thaw; it reads and writes nothing.
	handed atomic.Bool
}

// NewEnd makes the End of a session that has just finished its handshake on tlsSock.
func NewEnd(tlsSock Sock, s *tlsrec.Session) (*End, error) {
	ss := s.State()
	in, err := tlsrec.NewHalf(ss.Suite, ss.InSecret, ss.InSeq)
	if err != nil {
		return nil, err
	}
	out, err := tlsrec.NewHalf(ss.Suite, ss.OutSecret, ss.OutSeq)
	if err != nil {
		return nil, err
	}
	e := &End{TLS: tlsSock, suite: ss.Suite, in: in, out: out, fd: -1, local: tlsSock.LocalAddr(),
		remote: tlsSock.RemoteAddr()}
	if ss.UpdateOwed {
		e.asked.Store(1)
	}
	return e, nil
}

// Next returns the application data of the next record, read from the TLS socket as it comes
// (waiting, up to the read deadline); it aliases the End's buffer until the next call. At the
// peer's close_notify, or its end of stream between records, err is io.EOF. While it waits with
// no record begun it holds no buffer (an idle connection holds none; see readRecords).
func (e *End) Next() ([]byte, error) {
	if e.k != nil {
		return e.nextKept()
	}
	for {
		if e.handed.Load() {
			return nil, errHanded
		}
		if e.rEnded {
			return nil, io.EOF
		}
		if have := e.rn - e.roff; have >= 5 {
			n, err := tlsrec.RecordLen(e.rbuf[e.roff : e.roff+5])
			if err != nil {
				return nil, err
			}
			if have >= n {
				rec := e.rbuf[e.roff : e.roff+n]
				plain, asked, err := e.in.OpenRecord(rec)
				e.roff += n
				if asked {
					e.asked.Add(1)
				}
				switch {
				case errors.Is(err, tlsrec.ErrClosed):
					e.rEnded = true
					return nil, io.EOF
				case err != nil:
					return nil, err
				case len(plain) > 0:
					return plain, nil
				}
				continue // a KeyUpdate or a ChangeCipherSpec: nothing for the caller
			}
		}
		if e.roff > 0 { // the start of a record goes to the buffer's start, with room for all of it
			e.rn = copy(e.rbuf, e.rbuf[e.roff:e.rn])
			e.roff = 0
		}
		if err := e.readEnded(e.readRecords(), e.rn == e.roff); err != nil {
			return nil, err
		}
	}
}

// readEnded is what Next makes of a read's error: nil to go on; io.EOF at the end of the stream
// between records (between), which ends the read side; io.ErrUnexpectedEOF inside one.
func (e *End) readEnded(err error, between bool) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF) && between:
		e.rEnded = true
		return io.EOF
	case errors.Is(err, io.EOF):
		return io.ErrUnexpectedEOF
	}
	return err
}

// Buffered is how many bytes Next has read and not opened yet (Next's goroutine): an event loop,
// which hears only of what comes to the socket, takes an End with none.
func (e *End) Buffered() int {
	if e.k != nil {
		return int(e.k.read - e.k.open)
	}
	return e.rn - e.roff
}

// readRecords reads what the TLS socket has after rbuf[:rn], waiting for it (a detached End:
// what its descriptor has now, or ErrWouldBlock): the buffer comes from a pool once bytes are
// there, and goes back while the socket has none and no record is begun.
func (e *End) readRecords() error {
	n, err := e.readRaw()
	e.rn += n
	if e.rn == 0 && e.rbuf != nil {
		e.putRbuf()
	}
	return err
}

// readRaw reads what the TLS socket has into rd.dst, or rbuf[rn:] (readSome): n > 0, or err.
func (e *End) readRaw() (int, error) {
	var err error
	switch {
	case e.fd >= 0: // detached: what the descriptor has now
		if !e.readSome(uintptr(e.fd)) {
			return 0, ErrWouldBlock
		}
	case e.rc == nil:
		if e.rc, err = e.TLS.SyscallConn(); err != nil {
			return 0, err
		}
		e.readFn = e.readSome // made once: a closure per read would be an allocation
		fallthrough
	default:
		err = e.rc.Read(e.readFn)
	}
	n, serr := e.rd.n, e.rd.err
	switch {
	case err != nil:
	case serr != nil:
		err = os.NewSyscallError("read", serr)
	case n == 0:
		err = io.EOF
	default:
		return n, nil
	}
	return 0, err
}

// readSome is readRecords' read from the socket's descriptor (syscall.RawConn.Read).
func (e *End) readSome(fd uintptr) bool {
	dst := e.rd.dst
	if dst == nil {
		if e.rbuf == nil {
			e.rbp = recBufs.Get().(*[]byte)
			e.rbuf = *e.rbp
		}
		dst = e.rbuf[e.rn:]
	}
	for {
		e.rd.n, e.rd.err = unix.Read(int(fd), dst)
		if e.rd.err != unix.EINTR {
			break
		}
	}
	if e.rd.err == unix.EAGAIN {
		if e.rd.dst == nil && e.rn == 0 {
			e.putRbuf()
		}
		return false
	}
	return true
}

// ErrWouldBlock: a detached End has nothing more to read now, or a record to write that the
// socket does not take now.
var ErrWouldBlock = errors.New("tlsrelay: would block")

// Detach takes the End's socket away from Go's poller, for an event loop: from then on the End
// reads and writes fd (a duplicate of the socket's descriptor, which the caller owns and closes)
// and never waits, Next saying ErrWouldBlock when nothing complete is there. The End's Sock is
// closed, sending nothing. Attach undoes it.
func (e *End) Detach(fd int) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.fd = fd
	e.TLS.Close()
	e.tmu.Lock()
	e.TLS, e.rc, e.wc = nil, nil, nil
	e.tmu.Unlock()
}

// Attach gives a detached End its socket back in Go's poller (s: made from the descriptor
// Detach was given).
func (e *End) Attach(s Sock) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.tmu.Lock()
	e.TLS, e.fd = s, -1
	e.tmu.Unlock()
}

// putRbuf gives the read buffer back to the pool; nothing in it is the End's any more.
func (e *End) putRbuf() {
	recBufs.Put(e.rbp)
	e.rbp, e.rbuf, e.roff, e.rn = nil, nil, 0, 0
}

// recBufs holds the buffers an End reads records into: the start of one, and room for a whole
// one after it.
var recBufs = sync.Pool{New: func() any { b := make([]byte, 2*tlsrec.MaxRecord); return &b }}

// Write seals p into records and writes them, waiting up to the write deadline. n counts the
// plaintext of records written whole: a record stopped part way (a deadline) stays under way,
// and the next Write or TryWrite, which must be given the same bytes from p[n:] on, finishes it.
func (e *End) Write(p []byte) (n int, err error) { return e.write(p, true) }

// TryWrite is Write without waiting: what the socket takes now.
func (e *End) TryWrite(p []byte) (n int, err error) { return e.write(p, false) }

func (e *End) write(p []byte, wait bool) (n int, err error) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	defer e.putWbuf()
	for {
		if e.wrec == nil {
			switch {
			case e.handed.Load():
				return n, errHanded
			case e.wEnded || e.closed.Load():
				return n, net.ErrClosed
			case e.asked.Load() > e.answered:
				e.seal('k', nil)
			case n == len(p):
				return n, nil
			default:
				e.seal('d', p[n:n+min(len(p)-n, tlsrec.MaxPlaintext)])
			}
		} else if e.wkind == 'd' && e.wlen > len(p)-n {
			return n, fmt.Errorf("tlsrelay: a record of %d bytes under way, and %d given to finish it", e.wlen, len(p)-n)
		}
		done, err := e.flush(wait)
		if done && e.wkind == 'd' {
			n += e.wlen
		}
		if done {
			e.recordDone()
		}
		if err != nil || !done {
			return n, err
		}
	}
}

// putWbuf gives the seal buffer back to the pool when no record is under way (e.wmu held):
// a connection between replies holds none.
func (e *End) putWbuf() {
	if e.wrec == nil && e.wbp != nil {
		*e.wbp = e.wbuf[:0]
		sealBufs.Put(e.wbp)
		e.wbp, e.wbuf = nil, nil
	}
}

// sealBufs holds the buffers an End seals a record in.
var sealBufs = sync.Pool{New: func() any { b := make([]byte, 0, tlsrec.MaxRecord); return &b }}

// seal makes the record under way (e.wmu held).
func (e *End) seal(kind byte, p []byte) {
	if e.wbp == nil {
		e.wbp = sealBufs.Get().(*[]byte)
		e.wbuf = *e.wbp
	}
	e.wkind, e.wlen, e.wsent, e.wseq = kind, len(p), 0, e.out.Seq()
	switch kind {
	case 'd':
		e.wbuf = e.out.SealData(e.wbuf[:0], p)
	case 'k':
		e.wsecret = e.out.Secret() // the update moves it
		e.wbuf = e.out.SealKeyUpdate(e.wbuf[:0])
		e.wprev, e.answered = e.answered, e.asked.Load()
	case 'c':
		e.wbuf = e.out.SealClose(e.wbuf[:0])
		e.wEnded = true
	}
	e.wrec = e.wbuf
	if e.k != nil {
		e.keptIntent()
	}
}

// recordDone ends the record under way, written whole (e.wmu held): a kept End saves the state
// that counts it.
func (e *End) recordDone() {
	if e.k != nil {
		e.keptWritten()
	}
	e.wrec = nil
}

// flush writes the rest of the record under way; done: all of it.
func (e *End) flush(wait bool) (done bool, err error) {
	for e.wsent < len(e.wrec) {
		var n int
		wait := wait && e.fd < 0 // a detached End never waits
		q := e.wrec[e.wsent:]
		if writeCap > 0 {
			q = q[:min(len(q), writeCap)]
		}
		if wait {
			n, err = e.TLS.Write(q)
		} else {
			n, err = e.writeNow(q)
		}
		e.wsent += n
		if n > 0 && e.wsent < len(e.wrec) {
			crashPoint("end-wrote-part")
		}
		if err != nil || (!wait && n == 0) {
			return e.wsent == len(e.wrec), err
		}
	}
	return true, nil
}

// writeNow writes what the TLS socket (a detached End's descriptor) takes of p at once (e.wmu
// held).
func (e *End) writeNow(p []byte) (int, error) {
	var err error
	e.wr.p = p
	if e.fd >= 0 {
		e.writeSome(uintptr(e.fd))
	} else {
		if e.wc == nil {
			if e.wc, err = e.TLS.SyscallConn(); err != nil {
				e.wr.p = nil
				return 0, err
			}
			e.writeFn = e.writeSome // made once, as readRecords' callback
		}
		err = e.wc.Write(e.writeFn)
	}
	n, serr := e.wr.n, e.wr.err
	e.wr.p = nil
	if serr != nil {
		return 0, os.NewSyscallError("write", serr)
	}
	return max(n, 0), err
}

// writeSome is writeNow's write to the socket's descriptor (syscall.RawConn.Write).
func (e *End) writeSome(fd uintptr) bool {
	for {
		e.wr.n, e.wr.err = unix.Write(int(fd), e.wr.p)
		if e.wr.err != unix.EINTR {
			break
		}
	}
	if e.wr.err == unix.EAGAIN {
		e.wr.err = nil
	}
	return true
}

// CloseWrite sends close_notify, after the record under way if the socket takes it now, and
// half-closes the TLS socket.
func (e *End) CloseWrite() error {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	return e.closeNotify()
}

// closeNotify sends close_notify, if it can without waiting (e.wmu held).
func (e *End) closeNotify() error {
	if e.wEnded || e.closed.Load() || e.handed.Load() {
		return nil
	}
	if e.wrec != nil {
		if done, _ := e.flush(false); !done {
			return nil // the peer does not read: no alert can follow a record cut short
		}
		e.recordDone()
	}
	e.seal('c', nil)
	if done, _ := e.flush(false); !done {
		return nil // the alert's rest stays under way: a half-close would cut it short
	}
	e.recordDone()
	e.putWbuf()
	if e.fd >= 0 {
		return unix.Shutdown(e.fd, unix.SHUT_WR)
	}
	return e.TLS.CloseWrite()
}

// Close sends close_notify if it can at once (a Write under way keeps it from that), and
// closes the TLS socket.
func (e *End) Close() error {
	if e.closed.Load() {
		return nil
	}
	if e.wmu.TryLock() {
		e.closeNotify()
		e.closed.Store(true)
		e.wmu.Unlock()
	} else {
		e.closed.Store(true)
	}
	if e.TLS == nil { // detached: its descriptor is its owner's to close
		return nil
	}
	return e.TLS.Close()
}

// LocalAddr and RemoteAddr are the TLS socket's, as it was made.
func (e *End) LocalAddr() net.Addr  { return e.local }
func (e *End) RemoteAddr() net.Addr { return e.remote }

// SetDeadline, SetReadDeadline and SetWriteDeadline set the TLS socket's; a detached End has
// none (an event loop waits for nothing).
func (e *End) SetDeadline(t time.Time) error      { return e.deadline(t, true, true) }
func (e *End) SetReadDeadline(t time.Time) error  { return e.deadline(t, true, false) }
func (e *End) SetWriteDeadline(t time.Time) error { return e.deadline(t, false, true) }

func (e *End) deadline(t time.Time, read, write bool) error {
	e.tmu.Lock()
	s := e.TLS
	e.tmu.Unlock()
	if s == nil {
		return nil
	}
	switch {
	case read && write:
		return s.SetDeadline(t)
	case read:
		return s.SetReadDeadline(t)
	}
	return s.SetWriteDeadline(t)
}

// Thaw lets an End that was to be handed over go on.
func (e *End) Thaw() { e.handed.Store(false) }

// Read is Next into p, for io.Reader's sake (tests): p must hold a whole record's plaintext.
func (e *End) Read(p []byte) (int, error) {
	plain, err := e.Next()
	if len(plain) > len(p) {
		return 0, fmt.Errorf("tlsrelay: a record of %d bytes, and a buffer of %d", len(plain), len(p))
	}
	return copy(p, plain), err
}

// errHanded: the End was handed over (Handover), and not thawed.
var errHanded = errors.New("tlsrelay: the End was handed over")

// Handover turns a frozen End (no Next, Write or TryWrite under way, nor after) into what
// another process takes as a Relay: its State, and a new loopback pair of which relay is the
// relay's plaintext socket and guard the guard's client socket. The End's socket and the pair
// go on with the State only once the caller has written into guard what the End's Write was
// given and had not written whole, starting with a record under way's plaintext (the State
// says it is under way: the relay seals it again, to the same bytes, and writes its rest).
// From then on the End reads and writes nothing, and its Close sends nothing, until Thaw (the
// hand-over failed: the caller closes the pair, and the End goes on where it stopped).
func (e *End) Handover(id uint64) (st State, relay, guard *net.TCPConn, err error) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	if e.k != nil && e.k.skip > 0 { // a relay would pass on again what a restart is to skip
		return st, nil, nil, errors.New("tlsrelay: a kept End restarted and not read since: no relay can take it")
	}
	e.handed.Store(true)
	defer func() {
		if err != nil {
			e.handed.Store(false)
		}
	}()
	relay, guard, err = LoopbackPair()
	if err != nil {
		return st, nil, nil, err
	}
	defer func() {
		if err != nil {
			relay.Close()
			guard.Close()
		}
	}()
	plainRead, plainWritten, err := counts(relay)
	if err != nil {
		return st, nil, nil, err
	}
	if st, err = e.stateAt(id, plainWritten, plainRead); err != nil {
		return st, nil, nil, err
	}
	return st, relay, guard, nil
}

// stateAt is the End's State, stopped (e.wmu held), its plaintext streams at offsets plainIn
// (the records opened) and plainOut (the replies written whole).
func (e *End) stateAt(id, plainIn, plainOut uint64) (st State, err error) {
	read, written, err := counts(e.TLS)
	if err != nil {
		return st, err
	}
	unopened := uint64(e.Buffered())
	if read < unopened || unopened > ringSize {
		return st, fmt.Errorf("tlsrelay: %d bytes read and %d not opened", read, unopened)
	}
	st = State{ID: id, Suite: e.suite,
		In: Dir{Secret: e.in.Secret(), Seq: e.in.Seq(), From: read - unopened, To: plainIn,
			Updates: e.asked.Load(), Ended: e.rEnded},
		Out: Dir{Secret: e.out.Secret(), Seq: e.out.Seq(), From: plainOut, To: written,
			Updates: e.answered, Ended: e.wEnded}}
	switch {
	case unopened > 0 && e.k != nil:
		st.Rx = make([]byte, unopened)
		ringCopy(st.Rx, e.k.slot.ring(), e.k.open)
	case unopened > 0:
		st.Rx = append([]byte(nil), e.rbuf[e.roff:e.rn]...)
	}
	if e.wrec != nil && e.wsent < len(e.wrec) {
		if written < uint64(e.wsent) {
			return st, fmt.Errorf("tlsrelay: %d bytes written and %d of a record", written, e.wsent)
		}
		st.Out.Seq, st.Out.To = e.wseq, written-uint64(e.wsent)
		st.Out.Intent, st.Out.IntentLen = e.wkind, uint32(e.wlen)
		switch e.wkind {
		case 'k':
			st.Out.Secret = e.wsecret
			st.Out.Updates = e.wprev // the relay counts it once written
		case 'c':
			st.Out.Ended = false
		}
	}
	return st, nil
}

// ErrPairBusy: a relay stopped inside a record: its state does not stand at its pair's counters,
// and it goes on as a relay (EndFrom).
var ErrPairBusy = errors.New("tlsrelay: the relay's pair is not settled")

// MaxPairDrain is the most a relay's pair may hold for EndFrom to take it, out of the kernel's
// socket buffers into the End's caller: a client that reads nothing has its relay's pair full
// (4 MiB on these machines), and a relay with more goes on as a relay.
const MaxPairDrain = 8 << 20

// ErrPairLost: EndFrom had begun to take what waited in the pair, and failed: neither the End nor
// the relay can go on.
var ErrPairLost = errors.New("tlsrelay: the relay's pair was read in part")

// EndFrom makes an End of a relay an upgrade handed over (State st, the descriptor fd of its TLS
// socket and those of its pair's two ends) when the relay stopped between records: the State's
// plaintext counters are where the relay's side of the pair stands. Then all the relay held is
// in the State and in the pair, which EndFrom reads to its end: what the relay wrote and the
// guard had not read (toStore, the client's bytes after any the caller has not judged yet) and
// what the guard wrote and the relay had not consumed (which heads toClient, before the replies
// the caller was handed). An End's hand-over (Handover) leaves the pair empty. A record under way
// (st.Out.Intent) is sealed again, to the same bytes, from the start of toClient for application
// data (the caller writes toClient first, with Write), and its rest is written from there. The
// End is detached on fd (Detach), for the caller to Attach or give to an event loop; the caller
// closes the pair. On an error nothing is closed; ErrPairBusy says the relay should go on
// instead (also when the pair holds more than MaxPairDrain), ErrPairLost that it cannot.
func EndFrom(fd int, st State, relayFd, guardFd int, replies []byte) (e *End, toStore, toClient []byte, err error) {
	pr, pw, err := tcpcount.Counts(relayFd, false)
	if err != nil {
		return nil, nil, nil, err
	}
	if pr != st.Out.From || pw != st.In.To || st.In.Ended || st.Out.Ended {
		return nil, nil, nil, ErrPairBusy
	}
	read, written, err := tcpcount.Counts(fd, false)
	if err != nil {
		return nil, nil, nil, err
	}
	if read != st.In.From+uint64(len(st.Rx)) || len(st.Rx) > 2*tlsrec.MaxRecord || written < st.Out.To {
		return nil, nil, nil, fmt.Errorf("tlsrelay: the TLS socket at %d read and %d written, the state at %d+%d and %d",
			read, written, st.In.From, len(st.Rx), st.Out.To)
	}
	if held, err := pairHolds(relayFd, guardFd); err != nil || held > MaxPairDrain {
		return nil, nil, nil, errors.Join(ErrPairBusy, err)
	}
	head, err := readQueue(relayFd, true) // a relay's record under way was sealed from its start
	if err != nil {
		return nil, nil, nil, err
	}
	if st.Out.Intent == 'd' && len(head) > 0 && len(head) < int(st.Out.IntentLen) {
		return nil, nil, nil, ErrPairBusy
	}
	intent := head
	if len(head) == 0 {
		intent = replies
	}
	if e, err = endOf(fd, st, written-st.Out.To, intent); err != nil {
		return nil, nil, nil, err
	}
	toStore, toRelay, err := drainPair(relayFd, guardFd)
	if err == nil && !bytes.HasPrefix(toRelay, head) {
		err = errors.New("tlsrelay: the pair's bytes changed under EndFrom")
	}
	if err != nil {
		e.putWbuf()
		return nil, nil, nil, errors.Join(ErrPairLost, err)
	}
	if len(toRelay) == 0 {
		return e, toStore, replies, nil
	}
	return e, toStore, append(toRelay, replies...), nil
}

// endOf is EndFrom's End; sent bytes of its record under way are written, and an application
// data record's plaintext heads toClient.
func endOf(fd int, st State, sent uint64, toClient []byte) (*End, error) {
	in, err := tlsrec.NewHalf(st.Suite, st.In.Secret, st.In.Seq)
	if err != nil {
		return nil, err
	}
	out, err := tlsrec.NewHalf(st.Suite, st.Out.Secret, st.Out.Seq)
	if err != nil {
		return nil, err
	}
	e := &End{suite: st.Suite, in: in, out: out, fd: fd, answered: st.Out.Updates}
	if e.local, e.remote, err = sockAddrs(fd); err != nil {
		return nil, err
	}
	e.asked.Store(st.In.Updates)
	switch k := st.Out.Intent; {
	case k == 'd' && st.Out.IntentLen > 0 && int(st.Out.IntentLen) <= len(toClient):
		e.seal(k, toClient[:st.Out.IntentLen])
	case k == 'k' || k == 'c':
		e.seal(k, nil)
	case k != 0:
		return nil, fmt.Errorf("tlsrelay: a record under way of kind %q and %d bytes, %d given", k, st.Out.IntentLen, len(toClient))
	case sent != 0:
		return nil, fmt.Errorf("tlsrelay: %d bytes written past the state, and no record under way", sent)
	}
	if e.wrec != nil {
		if n := len(e.wrec); sent >= uint64(n) {
			e.wrec = nil
			e.putWbuf()
			return nil, fmt.Errorf("tlsrelay: %d bytes of a record of %d written", sent, n)
		}
		e.wsent = int(sent)
	}
	if len(st.Rx) > 0 {
		e.rbp = recBufs.Get().(*[]byte)
		e.rbuf = *e.rbp
		e.rn = copy(e.rbuf, st.Rx)
	}
	return e, nil
}
