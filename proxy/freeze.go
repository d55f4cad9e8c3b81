package proxy

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Freezing stops every connection at a point where all it holds is plain data, for an upgrade in
// place (upgrade_linux.go) to hand it to the next process, or to thaw it again if that fails. Nothing
// is cut short: reads stop (the kernel keeps what comes meanwhile), writes under way finish, and what
// the guard holds (the start of a message, bytes not judged yet, replies the client has not taken)
// stays in the connection's fields.
//
// Accepting stops first and the event loops hand their connections to goroutines; then each
// goroutine parks at its next read: the reader at the top of pipeClientToStore (a read deadline in
// the past wakes one that waits), the reply reader likewise, and the reply writer stops with its
// queue as it is. A reader stalled at max-pending-replies keeps the rest of its read unjudged.

// freezer is the server's freeze state.
type freezer struct {
	on      atomic.Bool
	mu      sync.Mutex
	started chan struct{} // closed when a freeze begins (readers stalled for a reply wake)
	thawed  chan struct{} // closed when it ends; parked goroutines go on
}

func (f *freezer) init() {
	f.started = make(chan struct{})
	f.thawed = make(chan struct{})
}

// begin starts a freeze.
func (f *freezer) begin() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.thawed = make(chan struct{})
	f.on.Store(true)
	close(f.started)
}

// end thaws: every parked goroutine goes on.
func (f *freezer) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.on.Store(false)
	f.started = make(chan struct{})
	close(f.thawed)
}

func (f *freezer) startedCh() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started
}

func (f *freezer) thawedCh() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.thawed
}

// frozen reports whether a freeze is on.
func (s *Server) frozen() bool { return s.cont.frz.on.Load() }

// past is a deadline long gone: set on a socket, it wakes the goroutine that waits on it.
var past = time.Unix(1, 0)

// unsetDeadline makes setDeadline arm the read deadline again (another goroutine changed it).
var unsetDeadline = time.Unix(2, 0)

// errFreezeTimeout: a connection did not park in time.
var errFreezeTimeout = errors.New("connections did not reach a safe point in time")

// errPeerGone: the process a freeze was for ended first.
var errPeerGone = errors.New("the new process exited (or closed the hand-over socket) during the freeze")

// freeze stops accepting and parks every connection, within timeout, and gives up at once when
// gone reports that the process it freezes for has ended. Connections that are closing end
// meanwhile and are not waited for beyond that. No client can keep one from parking: a wait for
// budget, a store slot or the store ends when the freeze begins (waitFor), and a write to a store
// that does not read when quiet sets its deadline (send). On an error the caller thaws (the
// connections returned are those that parked).
func (s *Server) freeze(timeout time.Duration, gone func() bool) ([]*conn, error) {
	s.cont.frz.begin()
	s.pauseAccept()
	s.stopLoops() // their connections go to goroutines, which park
	deadline := time.Now().Add(timeout)
	for {
		conns, waiting := s.quietConns()
		switch {
		case waiting == 0 && s.cont.accepting.Load() == 0:
			return conns, freezeRelays(conns, time.Until(deadline))
		case gone():
			return conns, errPeerGone
		case time.Now().After(deadline):
			return conns, fmt.Errorf("%w: %d of %d still busy after %s",
				errFreezeTimeout, waiting, len(conns)+waiting, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// quietConns returns the connections that are parked, and how many others are not closed yet.
func (s *Server) quietConns() (conns []*conn, waiting int) {
	s.reg.mu.Lock()
	all := make([]*conn, 0, len(s.reg.conns))
	for c := range s.reg.conns {
		all = append(all, c)
	}
	s.reg.mu.Unlock()
	for _, c := range all {
		switch {
		case c.quiet():
			conns = append(conns, c)
		case !c.isClosed():
			waiting++
		}
	}
	return conns, waiting
}

// thaw ends a freeze that handed nothing over: every connection goes on where it stopped, and
// accepting resumes.
func (s *Server) thaw(conns []*conn) {
	// Every connection, parked or not, may have the freeze's deadline in the past on a socket: the
	// write deadline goes (the reply writer sets its own per write); a read that times out because
	// of it is taken for what it is (spuriousTimeout).
	s.reg.mu.Lock()
	for c := range s.reg.conns {
		c.mu.Lock()
		if c.gr.client != nil {
			c.gr.client.SetWriteDeadline(time.Time{})
		}
		if c.gr.up != nil {
			c.gr.up.SetWriteDeadline(time.Time{})
		}
		c.mu.Unlock()
	}
	s.reg.mu.Unlock()
	s.cont.frz.end()
	for _, c := range conns {
		c.cl.thaw()
	}
	for _, c := range conns {
		c.rep.mu.Lock()
		start := len(c.rep.queue) > 0 && !c.rep.writing && !c.rep.failed
		c.rep.writing = c.rep.writing || start
		c.rep.mu.Unlock()
		if start {
			go c.writeReplies()
		}
	}
	s.startLoops()
	s.resumeAccept()
}
