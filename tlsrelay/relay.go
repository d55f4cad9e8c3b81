// Package tlsrelay carries one connection between a socket that speaks TLS 1.3 (a
// tlsrec.Session) and one that speaks plaintext: on the master host, a remote rank's mutual-TLS
// connection and the guard's end of a socket pair (the proxy judges the plaintext as it judges
// any client); on a worker host, a local rank's connection and the mutual-TLS connection to the
// master's guard (storeguard connect).
//
// A relay holds nothing it cannot hand over: freezing stops both directions at their next read
// or write, and what is left (the start of a record, plaintext not written yet, records not
// written yet) is plain data with the session's State.
package tlsrelay

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/tlsrec"
)

// Sock is a stream socket: *net.TCPConn or *net.UnixConn.
type Sock interface {
	net.Conn
	CloseWrite() error
	SyscallConn() (syscall.RawConn, error)
}

// Left is what a frozen relay has left to finish, with its session's state.
type Left struct {
	TLS tlsrec.State
	// Rx is the start of a record read from the TLS side; ToPlain plaintext opened and not
	// written; ToTLS records sealed and not written.
	Rx, ToPlain, ToTLS []byte `json:"-"`
	// PlainEOF: the TLS side ended (close_notify or end of stream) and the plaintext side was
	// told (its write half shut); TLSEOF likewise the other way.
	PlainEOF, TLSEOF bool
}

// Relay is one connection's relay. Run it once; Freeze, then Left, to hand it over.
type Relay struct {
	TLS   Sock
	Plain Sock
	s     *tlsrec.Session
	left  Left

	mu      sync.Mutex
	frozen  bool
	parked  int           // directions parked (0..2)
	thawed  chan struct{} // closed by Thaw
	parkedC chan struct{} // signalled when a direction parks
	done    int           // directions ended
	closed  bool
	// OnEnd, if set, is called once both directions have ended and both sockets are closed.
	OnEnd func(err error)
	err   error
}

// New makes a relay from a session that has just finished its handshake on tlsSock.
func New(tlsSock, plain Sock, s *tlsrec.Session) *Relay {
	return &Relay{TLS: tlsSock, Plain: plain, s: s, thawed: make(chan struct{}), parkedC: make(chan struct{}, 2)}
}

// Resume makes a relay from what a previous owner left.
func Resume(tlsSock, plain Sock, left Left) (*Relay, error) {
	s, err := tlsrec.New(left.TLS)
	if err != nil {
		return nil, err
	}
	r := New(tlsSock, plain, s)
	r.left = left
	return r, nil
}

// Run starts both directions on goroutines of their own.
func (r *Relay) Run() {
	go r.up()
	go r.down()
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

// end records one direction's end; the second closes both sockets.
func (r *Relay) end(err error) {
	r.mu.Lock()
	if err != nil && r.err == nil {
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

// writeAll writes p to w; on a freeze's deadline it returns what was not written.
func (r *Relay) writeAll(w Sock, p []byte) (rest []byte, err error) {
	for len(p) > 0 {
		n, err := w.Write(p)
		p = p[n:]
		if err != nil {
			if stoppedByFreeze(err) {
				return p, nil
			}
			return nil, err
		}
	}
	return nil, nil
}

// up: records from the TLS side, opened, to the plaintext side.
func (r *Relay) up() {
	buf := make([]byte, 0, 2*tlsrec.MaxRecord)
	buf = append(buf, r.left.Rx...)
	pending := append([]byte(nil), r.left.ToPlain...)
	eof := r.left.PlainEOF
	r.left.Rx, r.left.ToPlain = nil, nil
	// parkUp leaves what up holds, parks, and takes it back after a thaw.
	parkUp := func() bool {
		r.left.Rx, r.left.ToPlain, r.left.PlainEOF = append([]byte(nil), buf...), pending, eof
		if !r.park() {
			return false
		}
		buf = append(buf[:0], r.left.Rx...)
		pending, eof = r.left.ToPlain, r.left.PlainEOF
		r.left.Rx, r.left.ToPlain = nil, nil
		return true
	}
	for {
		if len(pending) > 0 {
			rest, err := r.writeAll(r.Plain, pending)
			if err != nil {
				r.end(err)
				return
			}
			pending = rest
			if len(pending) > 0 && !parkUp() { // frozen mid-write
				r.end(nil)
				return
			}
			continue
		}
		if eof { // the peer's close_notify or end of stream: passed on as a half-close
			r.Plain.CloseWrite()
			r.end(nil)
			return
		}
		n, err := r.TLS.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		plain, used, oerr := r.s.Open(buf)
		pending = append(pending[:0], plain...)
		buf = buf[:copy(buf, buf[used:])]
		switch {
		case errors.Is(oerr, tlsrec.ErrClosed):
			eof = true
		case oerr != nil:
			r.end(oerr)
			return
		case err == nil:
		case errors.Is(err, io.EOF) && len(buf) == 0:
			eof = true
		case stoppedByFreeze(err):
			if len(pending) == 0 && !parkUp() { // else the write parks first
				r.end(nil)
				return
			}
		default:
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // inside a record
			}
			r.end(err)
			return
		}
		if len(buf) == cap(buf) {
			r.end(errors.New("tlsrelay: a record longer than TLS allows"))
			return
		}
	}
}

// down: plaintext to the TLS side, sealed. The plaintext side's end of stream ends the relay:
// close_notify goes to the peer, and its side has closeGrace to finish.
func (r *Relay) down() {
	buf := make([]byte, 16<<10)
	out := append([]byte(nil), r.left.ToTLS...)
	eof := r.left.TLSEOF
	r.left.ToTLS = nil
	for {
		if len(out) > 0 {
			rest, err := r.writeAll(r.TLS, out)
			if err != nil {
				r.end(err)
				return
			}
			if len(rest) > 0 { // frozen mid-write
				r.left.ToTLS, r.left.TLSEOF = rest, eof
				if !r.park() {
					r.end(nil)
					return
				}
				out, eof, r.left.ToTLS = r.left.ToTLS, r.left.TLSEOF, nil
				continue
			}
			out = out[:0]
		}
		if eof {
			r.TLS.CloseWrite()
			time.AfterFunc(closeGrace, r.Close)
			r.end(nil)
			return
		}
		n, err := r.Plain.Read(buf)
		if n > 0 {
			out = r.s.Seal(out, buf[:n])
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			out, eof = r.s.CloseNotify(out), true
		case stoppedByFreeze(err):
			if len(out) == 0 {
				r.left.TLSEOF = eof
				if !r.park() {
					r.end(nil)
					return
				}
			}
		default:
			r.end(err)
			return
		}
	}
}

// closeGrace is how long the TLS side may take to end after the plaintext side ended.
const closeGrace = 30 * time.Second

// Freeze stops both directions at their next read or write and waits for them to park (or
// end), up to timeout; it reports whether they did. Writes under way stop too: what they did
// not write is left to the next owner.
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

// Left is what the frozen relay has left, with its session's state. The relay must not be
// thawed after: its sockets belong to the next owner.
func (r *Relay) Left() Left {
	l := r.left
	l.TLS = r.s.State()
	return l
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

// FromFd gives a stream socket's descriptor (received from another process) to Go's poller; the
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
