// Package tlsrelay carries one connection between a TCP socket that speaks TLS 1.3 (records
// sealed and opened with tlsrec) and a TCP socket that speaks plaintext: on the master host, a
// remote rank's mutual-TLS connection and the guard's end of a loopback pair (the proxy judges
// the plaintext as it judges any client); on a worker host, a local rank's connection and the
// mutual-TLS connection to the master's guard (storeguard connect).
//
// A relay holds nothing that is not either in the kernel or in its ledger slot (ledger.go).
// Records are read into the slot itself; plaintext is peeked, and consumed only once the record
// it became is written and counted in the saved state. A relay frozen for an upgrade is its
// State; a relay whose process was killed is its slot in a keeper's shared ledger. Either way
// Resume goes on from the sockets' counters, with no byte lost or sent twice.
package tlsrelay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/tlsrec"
)

// Sock is a TCP socket (*net.TCPConn); an interface so that the proxy can hold either kind of
// client socket.
type Sock interface {
	net.Conn
	CloseWrite() error
	SyscallConn() (syscall.RawConn, error)
}

// Relay is one connection's relay. Run it once; Freeze, then Left, to hand it over.
type Relay struct {
	TLS   Sock
	Plain Sock

	ledger  *Ledger
	ix      int
	slot    slot
	st      State // as made or resumed; each direction then keeps its own copy
	inH     *tlsrec.Half
	outH    *tlsrec.Half
	resumed bool
	asked   atomic.Uint64 // the KeyUpdates the peer asked for (In.Updates), for Out
	ticket  func([]byte)  // the session's Ticket (a client's, until its first record): in's alone

	mu      sync.Mutex
	frozen  bool
	parked  int           // directions parked (0..2)
	thawed  chan struct{} // closed by Thaw
	parkedC chan struct{} // signalled when a direction parks
	done    int           // directions ended
	closed  bool
	freed   bool
	// OnEnd, if set, is called once both directions have ended and both sockets are closed.
	OnEnd func(err error)
	err   error
}

// New makes the relay of connection id from a session that has just finished its handshake on
// tlsSock, with its state in a slot of ledger (nil: a ledger of its own).
func New(tlsSock, plain Sock, s *tlsrec.Session, ledger *Ledger, id uint64) (*Relay, error) {
	ss := s.State()
	st := State{ID: id, Suite: ss.Suite,
		In:  Dir{Secret: ss.InSecret, Seq: ss.InSeq},
		Out: Dir{Secret: ss.OutSecret, Seq: ss.OutSeq}}
	var err error
	if st.In.From, st.Out.To, err = counts(tlsSock); err != nil {
		return nil, err
	}
	if st.Out.From, st.In.To, err = counts(plain); err != nil {
		return nil, err
	}
	r, err := adopt(tlsSock, plain, st, ledger)
	if err != nil {
		return nil, err
	}
	r.resumed, r.ticket = false, s.Ticket
	return r, nil
}

// Resume makes a relay from the State a previous owner left (an upgrade), in a slot of ledger
// (nil: a ledger of its own). It finishes what the previous owner had under way when it stopped.
// The sockets are the relay's from the call: if it cannot be made, they are closed.
func Resume(tlsSock, plain Sock, st State, ledger *Ledger) (*Relay, error) {
	r, err := adopt(tlsSock, plain, st, ledger)
	return r, closedOn(err, tlsSock, plain)
}

// Restore makes a relay from its slot ix in a keeper's shared ledger, which says it belongs to
// connection id (a crash: its process was killed). The sockets are the relay's from the call: if
// it cannot be made, they are closed.
func Restore(tlsSock, plain Sock, ledger *Ledger, ix int, id uint64) (*Relay, error) {
	s, st, err := ledger.claim(ix, id)
	var r *Relay
	if err == nil {
		r, err = newRelay(tlsSock, plain, st, ledger, ix, s)
	}
	return r, closedOn(err, tlsSock, plain)
}

// closedOn closes tlsSock and plain if err is not nil, and returns err.
func closedOn(err error, tlsSock, plain Sock) error {
	if err != nil {
		tlsSock.Close()
		plain.Close()
	}
	return err
}

// adopt gives st a slot of ledger: of a ledger of its own when ledger is nil or full (the relay
// then runs with its state in this process only, and Slot says -1).
func adopt(tlsSock, plain Sock, st State, ledger *Ledger) (*Relay, error) {
	if ledger == nil {
		ledger = NewLedger(1)
	}
	ix, s, err := ledger.alloc(&st)
	if errors.Is(err, errFull) {
		ledger = NewLedger(1)
		ix, s, err = ledger.alloc(&st)
	}
	if err != nil {
		return nil, err
	}
	return newRelay(tlsSock, plain, st, ledger, ix, s)
}

// newRelay makes the relay of state st in slot ix of ledger, which it gives back when st is one
// its halves cannot be built from.
func newRelay(tlsSock, plain Sock, st State, ledger *Ledger, ix int, s slot) (*Relay, error) {
	in, err := tlsrec.NewHalf(st.Suite, st.In.Secret, st.In.Seq)
	if err != nil {
		ledger.free(ix)
		return nil, err
	}
	out, err := tlsrec.NewHalf(st.Suite, st.Out.Secret, st.Out.Seq)
	if err != nil {
		ledger.free(ix)
		return nil, err
	}
	r := &Relay{TLS: tlsSock, Plain: plain, ledger: ledger, ix: ix, slot: s, st: st, inH: in, outH: out,
		resumed: true, thawed: make(chan struct{}), parkedC: make(chan struct{}, 2)}
	r.asked.Store(st.In.Updates)
	return r, nil
}

// Slot is the relay's slot in a shared ledger (its keeper restores it from there), or -1 when
// its ledger is this process's own.
func (r *Relay) Slot() int {
	if r.ledger.Fd() < 0 {
		return -1
	}
	return r.ix
}

// Run starts both directions on goroutines of their own.
func (r *Relay) Run() {
	go r.in()
	go r.out()
}

// stoppedByFreeze: a read or write ended by a deadline, which only Freeze sets.
func stoppedByFreeze(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// park waits while the relay is frozen (a deadline error after a thaw returns at once); it
// reports false if the relay closed meanwhile.
func (r *Relay) park() bool {
	r.mu.Lock()
	if !r.frozen {
		closed := r.closed
		r.mu.Unlock()
		return !closed
	}
	r.parked++
	th := r.thawed
	r.mu.Unlock()
	r.parkedC <- struct{}{}
	<-th
	return !r.isClosed()
}

func (r *Relay) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// retry reports whether an operation that failed with err is to be tried again: it was stopped
// by a freeze, and the relay was thawed (not handed over or closed) after.
func (r *Relay) retry(err error) bool { return stoppedByFreeze(err) && r.park() }

// end records one direction's end; the second closes both sockets. err nil after a freeze that
// handed the relay over: the sockets are the next owner's.
func (r *Relay) end(err error) {
	r.mu.Lock()
	if err != nil && r.err == nil && !r.closed {
		r.err = err
	}
	if err != nil && !r.closed { // a failure ends both directions at once
		r.closed = true
		r.TLS.Close()
		r.Plain.Close()
	}
	r.done++
	last := r.done == 2
	if last && !r.closed {
		r.closed = true
		r.TLS.Close()
		r.Plain.Close()
	}
	if last {
		r.release()
	}
	err = r.err
	if r.frozen { // a freeze waits for this direction too
		r.parked++
		r.mu.Unlock()
		r.parkedC <- struct{}{}
	} else {
		r.mu.Unlock()
	}
	if last && r.OnEnd != nil {
		r.OnEnd(err)
	}
}

// release gives the slot back (r.mu held).
func (r *Relay) release() {
	if !r.freed {
		r.freed = true
		r.ledger.free(r.ix)
	}
}

// writeAll writes p to w, going on after a freeze that is thawed.
func (r *Relay) writeAll(w Sock, p []byte, at string) error {
	for len(p) > 0 {
		q := p
		if writeCap > 0 {
			q = q[:min(len(q), writeCap)]
		}
		n, err := write(w, q) // one write(2) at a time, so that a test can stop between them
		p = p[n:]
		if len(p) > 0 {
			crashPoint(at)
		}
		if err != nil && !r.retry(err) {
			return err
		}
	}
	return nil
}

// crashPoint marks the instants between a direction's steps, for the test that kills a relay
// at each of them (crash_linux_test.go); it does nothing otherwise.
var crashPoint = func(string) {}

// writeCap, when set (by that test), is the most one write(2) is given: records go in parts.
var writeCap = 0

// ended: the relay stopped because it was handed over or closed, not because of err.
func (r *Relay) stopped(err error) error {
	if stoppedByFreeze(err) || r.isClosed() {
		return nil
	}
	return err
}

// in: records from the TLS side, opened, to the plaintext side. The TLS side is read into the
// slot's ring, so that what was read is saved as it is read (the socket's counter says how much);
// a whole record is opened, its plaintext written, and the state that counts both saved.
func (r *Relay) in() {
	d, h := r.st.In, r.inH
	ring := r.slot.ring()
	rec := make([]byte, tlsrec.MaxRecord)
	var have, skip uint64 // bytes of the ring read past d.From; plaintext of the next record written
	var err error
	if r.resumed && !d.Ended {
		if have, skip, err = r.reconcileIn(&d); err != nil {
			r.end(r.stopped(err))
			return
		}
	}
	for !d.Ended {
		need := uint64(5)
		if have >= need {
			ringCopy(rec[:5], ring, d.From)
			n, err := tlsrec.RecordLen(rec[:5])
			if err != nil {
				r.end(err)
				return
			}
			need = uint64(n)
		}
		if have < need { // read what comes, as far as the ring has room
			pos := (d.From + have) % ringSize
			end := min(ringSize, pos+ringSize-have)
			n, err := r.TLS.Read(ring[pos:end])
			have += uint64(n)
			if n > 0 {
				crashPoint("in-read")
			}
			switch {
			case err == nil:
			case errors.Is(err, io.EOF) && have == 0: // the end of the stream, between records
				d.Ended = true
				r.slot.save(false, &d)
			case errors.Is(err, io.EOF):
				r.end(io.ErrUnexpectedEOF) // inside a record
				return
			case r.retry(err):
			default:
				r.end(r.stopped(err))
				return
			}
			continue
		}
		ringCopy(rec[:need], ring, d.From)
		plain, asked, oerr := h.OpenTicket(rec[:need], &r.ticket)
		closed := errors.Is(oerr, tlsrec.ErrClosed)
		if oerr != nil && !closed {
			r.end(oerr)
			return
		}
		if skip > uint64(len(plain)) {
			r.end(fmt.Errorf("tlsrelay: %d bytes written of a record of %d", skip, len(plain)))
			return
		}
		if err := r.writeAll(r.Plain, plain[skip:], "in-wrote-part"); err != nil {
			r.end(r.stopped(err))
			return
		}
		skip = 0
		d.Seq = h.Seq()
		if d.Seq == 0 { // a KeyUpdate
			d.Secret = h.Secret()
		}
		d.From += need
		d.To += uint64(len(plain))
		have -= need
		if asked {
			d.Updates++
		}
		d.Ended = closed
		r.slot.save(false, &d)
		crashPoint("in-saved")
		if asked {
			r.asked.Store(d.Updates)
		}
	}
	r.Plain.CloseWrite() // the peer's close_notify or end of stream, passed on as a half-close
	r.end(nil)
}

// ringPut copies p into the ring, starting at stream offset from.
func ringPut(ring []byte, from uint64, p []byte) {
	pos := from % ringSize
	n := copy(ring[pos:], p)
	copy(ring, p[n:])
}

// ringCopy copies len(dst) bytes from the ring, starting at stream offset from.
func ringCopy(dst, ring []byte, from uint64) {
	pos := from % ringSize
	n := copy(dst, ring[pos:])
	copy(dst[n:], ring)
}

// reconcileIn squares a resumed read direction's state with its sockets' counters: have is
// the bytes read into the ring past the last record counted, skip the plaintext of the next
// record already written.
func (r *Relay) reconcileIn(d *Dir) (have, skip uint64, err error) {
	read, _, err := counts(r.TLS)
	if err != nil {
		return 0, 0, err
	}
	_, written, err := counts(r.Plain)
	if err != nil {
		return 0, 0, err
	}
	if read < d.From || read-d.From > ringSize || written < d.To || written-d.To > tlsrec.MaxPlaintext {
		return 0, 0, fmt.Errorf("tlsrelay: the sockets (read %d, written %d) do not match the saved state (%d, %d)",
			read, written, d.From, d.To)
	}
	return read - d.From, written - d.To, nil
}

// out: plaintext to the TLS side, sealed. For each record: peek the plaintext, save what record
// is under way, write it, save the state that counts it, then consume the plaintext. The
// plaintext side's end of stream ends the relay: close_notify goes to the peer, and its side has
// closeGrace to finish.
func (r *Relay) out() {
	d, h := r.st.Out, r.outH
	pbuf := make([]byte, tlsrec.MaxPlaintext)
	wbuf := make([]byte, 0, tlsrec.MaxRecord)
	var extra uint64 // bytes of the record under way written before a crash or hand-over
	var err error
	if r.resumed && !d.Ended {
		if extra, err = r.reconcileOut(&d); err != nil {
			r.end(r.stopped(err))
			return
		}
	}
	for !d.Ended {
		kind, n, asked := d.Intent, int(d.IntentLen), r.asked.Load()
		if kind == 0 {
			if asked > d.Updates {
				kind = 'k'
			} else {
				m, eof, err := peek(r.Plain, pbuf, 1)
				if err != nil {
					if r.retry(err) {
						continue
					}
					r.end(r.stopped(err))
					return
				}
				kind, n = 'd', m
				if eof {
					kind, n = 'c', 0
				}
			}
			d.Intent, d.IntentLen = kind, uint32(n)
			r.slot.save(true, &d)
			crashPoint("out-intent")
		} else if kind == 'd' { // resumed with a record under way: its plaintext is still there
			if _, _, err := peek(r.Plain, pbuf[:n], n); err != nil {
				r.end(r.stopped(err))
				return
			}
		}
		switch kind {
		case 'd':
			wbuf = h.SealData(wbuf[:0], pbuf[:n])
		case 'k':
			wbuf = h.SealKeyUpdate(wbuf[:0])
		case 'c':
			wbuf = h.SealClose(wbuf[:0])
		default:
			r.end(fmt.Errorf("tlsrelay: a record under way of kind %q", kind))
			return
		}
		if extra > uint64(len(wbuf)) {
			r.end(fmt.Errorf("tlsrelay: %d bytes written of a record of %d", extra, len(wbuf)))
			return
		}
		if err := r.writeAll(r.TLS, wbuf[extra:], "out-wrote-part"); err != nil {
			r.end(r.stopped(err))
			return
		}
		extra = 0
		d.Seq = h.Seq()
		if kind == 'k' {
			d.Secret, d.Updates = h.Secret(), max(asked, d.Updates+1)
		}
		d.Ended = kind == 'c'
		d.From += uint64(n)
		d.To += uint64(len(wbuf))
		d.Intent, d.IntentLen = 0, 0
		r.slot.save(true, &d)
		crashPoint("out-saved")
		if n > 0 {
			if err := consume(r.Plain, n); err != nil {
				r.end(r.stopped(err))
				return
			}
		}
		crashPoint("out-consumed")
	}
	r.TLS.CloseWrite()
	time.AfterFunc(closeGrace, r.Close)
	r.end(nil)
}

// reconcileOut squares a resumed write direction's state with its sockets' counters: plaintext
// counted and not consumed is consumed; extra is the bytes of the record under way (d.Intent)
// already written; a record under way with none written is begun again from scratch.
func (r *Relay) reconcileOut(d *Dir) (extra uint64, err error) {
	read, _, err := counts(r.Plain)
	if err != nil {
		return 0, err
	}
	_, written, err := counts(r.TLS)
	if err != nil {
		return 0, err
	}
	switch {
	case read > d.From || written < d.To:
		return 0, fmt.Errorf("tlsrelay: the sockets are past the saved state (read %d > %d or written %d < %d)",
			read, d.From, written, d.To)
	case read < d.From:
		if d.From-read > tlsrec.MaxPlaintext || written != d.To || d.Intent != 0 {
			return 0, fmt.Errorf("tlsrelay: %d bytes of plaintext to consume, %d written past them", d.From-read, written-d.To)
		}
		return 0, consume(r.Plain, int(d.From-read))
	}
	extra = written - d.To
	if extra > 0 && d.Intent == 0 {
		return 0, fmt.Errorf("tlsrelay: %d bytes written past the saved state, and no record was under way", extra)
	}
	if extra == 0 {
		d.Intent, d.IntentLen = 0, 0 // nothing of it left: the next record is chosen afresh
	}
	return extra, nil
}

// closeGrace is how long the TLS side may take to end after the plaintext side ended.
const closeGrace = 30 * time.Second

// Freeze stops both directions at their next read or write and waits for them to park (or
// end), up to timeout; it reports whether they did. Writes under way stop too: the sockets'
// counters tell the next owner how far they got.
func (r *Relay) Freeze(timeout time.Duration) bool {
	r.mu.Lock()
	if r.frozen {
		r.mu.Unlock()
		return true
	}
	r.frozen, r.parked = true, r.done
	r.thawed = make(chan struct{})
	r.mu.Unlock()
	past := time.Unix(1, 0)
	r.TLS.SetDeadline(past)
	r.Plain.SetDeadline(past)
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		n := r.parked
		r.mu.Unlock()
		if n >= 2 {
			return true
		}
		select {
		case <-r.parkedC:
		case <-deadline:
			return false
		}
	}
}

// Left is the frozen relay's state, with what its read direction had read of the next record.
// The relay must not be thawed after: its sockets belong to the next owner.
func (r *Relay) Left() (State, error) {
	st, err := r.slot.state()
	if err != nil {
		return st, err
	}
	read, _, err := counts(r.TLS)
	if err != nil {
		return st, err
	}
	if read < st.In.From || read-st.In.From > ringSize {
		return st, fmt.Errorf("tlsrelay: the TLS socket's counter %d does not match the saved state %d", read, st.In.From)
	}
	if read > st.In.From {
		st.Rx = make([]byte, read-st.In.From)
		ringCopy(st.Rx, r.slot.ring(), st.In.From)
	}
	return st, nil
}

// Thaw lets a frozen relay go on.
func (r *Relay) Thaw() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.frozen {
		return
	}
	r.frozen = false
	r.TLS.SetDeadline(time.Time{})
	r.Plain.SetDeadline(time.Time{})
	for len(r.parkedC) > 0 {
		<-r.parkedC
	}
	close(r.thawed)
}

// Abandon ends a frozen relay whose sockets went to another owner: its goroutines return
// without touching them. (The caller closes its own copies of the descriptors.)
func (r *Relay) Abandon() {
	r.mu.Lock()
	r.closed = true
	r.release()
	r.mu.Unlock()
	r.Thaw()
}

// Close ends the relay at once: both sockets closed.
func (r *Relay) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		r.TLS.Close()
		r.Plain.Close()
	}
}

// FromFds is FromFd of a relay's two sockets: both, or neither (both descriptors closed).
func FromFds(tlsFd, plainFd int) (tlsSock, plain Sock, err error) {
	tlsSock, err = FromFd(tlsFd)
	if err != nil {
		if plainFd >= 0 {
			os.NewFile(uintptr(plainFd), "").Close()
		}
		return nil, nil, err
	}
	if plain, err = FromFd(plainFd); err != nil {
		tlsSock.Close()
		return nil, nil, err
	}
	return tlsSock, plain, nil
}

// Fds are the descriptors of the relay's two sockets, valid while they are open (to hand them
// over, or to give a keeper copies).
func (r *Relay) Fds() (tlsFd, plainFd int, err error) {
	tlsFd, plainFd = -1, -1
	for _, s := range []struct {
		sock Sock
		fd   *int
	}{{r.TLS, &tlsFd}, {r.Plain, &plainFd}} {
		rc, err := s.sock.SyscallConn()
		if err != nil {
			return -1, -1, err
		}
		if err := rc.Control(func(fd uintptr) { *s.fd = int(fd) }); err != nil {
			return -1, -1, err
		}
	}
	return tlsFd, plainFd, nil
}

// FromFd gives a TCP socket's descriptor (received from another process) to Go's poller; the
// descriptor is closed either way, the returned socket having its own.
func FromFd(fd int) (Sock, error) {
	if fd < 0 {
		return nil, errors.New("no socket")
	}
	f := os.NewFile(uintptr(fd), "")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	s, ok := c.(Sock)
	if !ok {
		c.Close()
		return nil, errors.New("not a stream socket")
	}
	return s, nil
}

// LoopbackPair is a connected pair of TCP sockets on the loopback interface (the master's
// relays write plaintext to one, whose counters a resumed relay reads, and the guard reads the
// other). A stranger's connection to the short-lived listener is closed, not taken.
func LoopbackPair() (a, b *net.TCPConn, err error) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	a, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		return nil, nil, err
	}
	ln.SetDeadline(time.Now().Add(5 * time.Second))
	want := a.LocalAddr().String()
	for {
		b, err = ln.AcceptTCP()
		if err != nil {
			a.Close()
			return nil, nil, err
		}
		if b.RemoteAddr().String() == want {
			return a, b, nil
		}
		b.Close()
	}
}
