package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/internal/origdst"
	"github.com/storeguard/storeguard/internal/tcpcount"
)

// The goroutine transport: a connection read and decoded on a goroutine of its own, the store's
// replies copied back on another, through Go's poller. Every connection starts here unless a loop
// takes it from its first byte (loopable), and comes back here whenever a loop cannot go on
// without waiting. Either way the store is connected only when the client's first valid message
// is ready to go (storeUp): a connection that sends nothing valid costs the store nothing.

// goroutines is the state of a connection its goroutines forward: it writes to the store with
// blocking writes and waits for budget.
type goroutines struct {
	client     clientConn // the client side (client.go): a socket, or a TLS End on its socket
	up         *net.TCPConn
	s2cStarted bool // the reply direction's goroutine runs (or ran)
	s2cDone    chan struct{}
	deadline   time.Time   // the read deadline set on client
	vec        net.Buffers // reused for writev of carry + the rest of a message
	vecArr     [2][]byte
	// kick: the store is connected and the reading goroutine is to offer the connection to a loop.
	kick bool
	// Parked for a freeze (freeze.go), under c.mu: the reader, the reply reader. readEnded: the
	// reader is done, the client's end of stream passed on. upDeadline: the read deadline set on up.
	parkC2S, parkS2C, readEnded bool
	upDeadline                  time.Time
	// left: what a freeze interrupted, or a loop or a previous process handed over, to finish
	// before reading on (resume).
	left leftover
}

func (g *goroutines) leftover() *leftover { return &g.left }

// send writes a, then b, to the store, dialling it for the first message. A freeze that begins
// meanwhile (a wait for a store slot or the store, or a write the store does not take: the freeze
// sets a write deadline in the past, and nothing else sets one on the store's socket) leaves what
// was not written pending, as a loop does: to be written after the thaw (resume) or by the next
// process.
func (*goroutines) send(c *conn, a, b []byte) bool {
	if len(a)+len(b) == 0 {
		return true
	}
	up, deferred := c.storeUp()
	if deferred {
		c.leavePending(a, b, 0)
		return true
	}
	if !up {
		return false
	}
	var n int64
	var err error
	if len(a) == 0 {
		var w int
		w, err = c.gr.up.Write(b)
		n = int64(w)
	} else {
		c.gr.vecArr = [2][]byte{a, b}
		c.gr.vec = c.gr.vecArr[:]
		n, err = c.gr.vec.WriteTo(c.gr.up)
	}
	c.wroteStore(int(n))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.leavePending(a, b, int(n))
		return true
	}
	if err != nil {
		c.closeBoth()
		return false
	}
	return true
}

// leavePending keeps what a freeze stopped send from writing, n bytes of a and b written: the rest
// of a, the carry, in its own buffer and budget (pendCarry), and a copy of the rest of b.
func (c *conn) leavePending(a, b []byte, n int) {
	c.gr.left.up, c.gr.left.upCarry = a[min(n, len(a)):], c.gr.left.upCarry || n < len(a)
	c.gr.left.upTail = append([]byte(nil), b[max(0, n-len(a)):]...)
}

// reserve waits for the budget, at most timeouts.message (or until a drain ends). The wait is not
// the client's: the guard moves the message's deadline by it, and a connection that waited in
// vain is closed without a violation (budget_wait_timeouts_total), nothing of its message sent.
// A freeze ends the wait at once: tail is kept after the thaw (resume), or the next process,
// fed the message again from its start, waits there; so no client's wait can hold an upgrade up.
func (*goroutines) reserve(c *conn, n int64, tail []byte) (ok, alive bool) {
	ctx, cancel := c.s.waitFor(c.st.cfg.Timeouts.Message)
	defer cancel()
	start := c.s.now()
	err := c.s.buf.acquire(ctx, c.src.Addr(), n, c.held)
	c.g.Paused(c.s.now().Sub(start))
	switch {
	case err == nil:
		return true, true
	case frozeFirst(ctx):
		c.gr.left.tail = append([]byte(nil), tail...)
		return false, true
	}
	c.s.m.budgetTimeouts.Inc()
	if c.s.every.budget.allow(c.s.now()) {
		c.s.log.Warn("closing a connection that waited timeouts.message for buffer budget (not a violation; "+
			"logged at most once a second)", "conn", c.id, "source", c.src.String(), "bytes", n)
	}
	c.closeBoth()
	return false, false
}

// stalled waits for the reply, not reading the client meanwhile; behind requests a freeze kept
// from the store (send), there is none to wait for: rest waits for them (resume).
func (*goroutines) stalled(c *conn, rest []byte) (judge, alive bool) {
	if c.gr.left.pendingUp() {
		c.gr.left.rest = append([]byte(nil), rest...)
		return false, true
	}
	ok, froze := c.awaitReply()
	if froze { // the rest is judged once the reader goes on (pipeClientToStore), here or in the next process
		c.gr.left.rest = append([]byte(nil), rest...)
		return false, true
	}
	return ok, ok
}

// errFreezing is why a wait ended when a freeze began (frozeFirst).
var errFreezing = errors.New("a freeze began")

// waitFor is the context of a wait that ends after d (0: no limit), when a drain ends, or when a
// freeze begins (frozeFirst): a connection waiting for budget, a store slot or the store parks
// then, and waits again after the thaw or in the next process.
func (s *Server) waitFor(d time.Duration) (context.Context, context.CancelFunc) {
	base, stop := context.WithCancelCause(context.Background())
	ctx, cancel := context.Context(base), context.CancelFunc(func() {})
	if d > 0 {
		ctx, cancel = context.WithTimeout(base, d)
	}
	freezing := s.cont.frz.startedCh() // closed already when a freeze is on
	go func() {
		select {
		case <-s.draining.end:
			stop(nil)
		case <-freezing:
			stop(errFreezing)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(); stop(nil) }
}

// frozeFirst reports whether the wait of ctx (waitFor) ended because a freeze began.
func frozeFirst(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errFreezing) }

// handle admits a connection Serve accepted, on a goroutine of its own, and serves it.
func (s *Server) handle(tc *net.TCPConn) {
	remote := addrPort(tc.RemoteAddr())
	src := netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	dst := origdst.Of(tc)
	st := s.set.Load() // one snapshot: a reload in between must not admit to prove, then take plaintext
	release, reason := s.admit(src.Addr(), st)
	if reason != "" {
		s.refuseConn(tc, src, dst, reason)
		s.cont.accepting.Add(-1)
		s.handlers.Done()
		return
	}
	var client clientConn = tc
	var t *tlsConn
	id := s.nextID.Add(1)
	if !st.cfg.TLS.Plaintext(src.Addr()) {
		var ok bool
		var idRelease func()
		if client, t, idRelease, ok = s.handshake(tc, id, src, dst, st); !ok {
			release()
			s.m.active.Dec()
			s.cont.accepting.Add(-1)
			s.handlers.Done()
			return
		}
		addrRelease := release
		release = func() { idRelease(); addrRelease() }
	}
	c := s.acceptedAs(id, client, src, dst, release)
	c.setTLS(t)
	c.cl.keepSock(c.id, c.src, c.dst, tc) // an End's TLS socket is the client's
	s.track(c, true)
	s.cont.accepting.Add(-1)
	c.serve(nil)
}

// awaitGeneration holds a connection that arrived before the store's generation was known (auto
// mode) until it is: nothing is read from the client or sent to the store meanwhile. It reports
// false, having counted it, when timeouts.upstream-dial passed first (or drain ended).
func (c *conn) awaitGeneration() bool {
	info, ok := c.s.store.Await(c.st.cfg.Timeouts.UpstreamDial, c.s.draining.end)
	if !ok && c.isClosed() {
		return false // drain closed it
	}
	if !ok {
		c.s.m.storeWaits.WithLabelValues("timeout").Inc()
		c.s.log.Info("auto: closing a connection that waited for the store's generation", "conn", c.id,
			"source", c.src.String(), "waited", c.st.cfg.Timeouts.UpstreamDial.String())
		return false
	}
	c.s.m.storeWaits.WithLabelValues("learned").Inc()
	c.dial.awaitStore = false
	c.resetGuard(c.st.decoderFor(info))
	return true
}

// serve forwards the connection with goroutines until it ends, then ends it, unless a loop takes
// it (the loop then ends it). A new connection goes straight to a loop when connectNow can
// connect it; from: a loop or a previous process handed the connection over, with what it left.
func (c *conn) serve(from *leftover) {
	took := false
	defer func() {
		if !took {
			c.end()
		}
	}()
	defer c.s.recoverConn(c) // first: a panic closes the sockets, so finish does not wait forever
	if c.dial.awaitStore && !c.awaitGeneration() {
		close(c.dial.ready) // no store connection: there is nothing to wait for
		c.closeBoth()
		return
	}
	switch {
	case from != nil:
		if !c.fromLoop(*from) {
			return
		}
	case c.loopable():
		var live bool
		if took, live = c.toLoop(); took || !live {
			return
		}
	}
	took = c.pipeClientToStore()
}

// storeUp connects to the store for the first message to send, on the reading goroutine (the
// client's next bytes wait in its socket meanwhile). up: the store is connected. deferred: a
// freeze began while it waited for a store slot or the store; the caller keeps the message for
// after it, and storeUp asks again then.
func (c *conn) storeUp() (up, deferred bool) {
	if !c.dial.done {
		if c.dialStore() {
			return false, true
		}
		c.dial.done = true
		close(c.dial.ready)
	}
	return c.awaitUp(), false
}

// dialUpstream connects to the store, retrying refused connections until ctx ends: workers often
// start before the master's store listens, and torch retries a refused connect but not a
// connection that is accepted and then closed, which is what the guard would otherwise do to
// them. It gives up early once stop reports true (the client left or was refused).
func dialUpstream(ctx context.Context, addr string, stop func() bool) (net.Conn, error) {
	for backoff := 20 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		d := net.Dialer{KeepAlive: -1} // no keep-alive probes to the local store
		up, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return up, nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || stop() {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff):
		}
	}
}

// dialStore connects to the store, once it has a store slot, and starts the reply direction, or has
// the connection offered to a loop; on failure it closes the client. deferred: a freeze began
// while it waited; nothing changed but the slot it may hold, kept for the next try.
func (c *conn) dialStore() (deferred bool) {
	s, st := c.s, c.st
	ok, deferred := c.awaitStoreSlot()
	if !ok {
		if !deferred {
			c.closeBoth()
		}
		return deferred
	}
	ctx, cancel := s.waitFor(st.cfg.Timeouts.UpstreamDial)
	defer cancel()
	up, err := dialUpstream(ctx, s.route.Route().Dial, c.isClosed)
	if err != nil {
		if c.isClosed() {
			return false // the client left or was refused: not the store's failure
		}
		if frozeFirst(ctx) {
			return true
		}
		s.m.dialFailures.Inc()
		if s.every.dial.allow(s.now()) {
			s.log.Warn("upstream dial failed; closing client (logged at most once a second)", "conn", c.id,
				"upstream", st.cfg.Upstream, "err", err)
		}
		c.closeBoth()
		return false
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		up.Close()
		return false
	}
	c.gr.up = up.(*net.TCPConn)
	c.cl.storeConnectedSock(c.id, c.gr.up)
	if s.loops != nil && st.cfg.Timeouts.Idle == 0 {
		c.gr.kick = true // the reading goroutine offers the connection to a loop before its next read
		c.mu.Unlock()
		return false
	}
	c.mu.Unlock()
	c.startReplies()
	return false
}

// startReplies starts the reply direction's goroutine, once.
func (c *conn) startReplies() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gr.s2cStarted || c.gr.up == nil || c.closed {
		return
	}
	c.gr.s2cStarted = true
	go c.pipeStoreToClient()
}

func (c *conn) replying() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gr.s2cStarted
}

// awaitUp waits for dialStore and reports whether the store is connected.
func (c *conn) awaitUp() bool {
	<-c.dial.ready
	return c.gr.up != nil
}

// pipeClientToStore reads the client, decodes, and forwards complete valid messages, until the
// connection ends or a loop takes it (took: the loop owns it now).
func (c *conn) pipeClientToStore() (took bool) {
	for {
		if c.s.frozen() {
			c.park(&c.gr.parkC2S)
			c.gr.deadline = unsetDeadline // the freeze set its own
			continue
		}
		if c.gr.left.unfinished() {
			if !c.resume() {
				return false
			}
			continue // done, or a freeze began first: park
		}
		if c.takeKick() {
			if c.adoptable() {
				took, live := c.toLoop()
				if took || !live {
					return took
				}
			} else {
				c.startReplies()
			}
		}
		c.setDeadline()
		p, r, err := c.cl.next(c.gr.client, len(c.carry), c.gr.left.unfinished())
		if len(p) > 0 {
			c.readClient(p)
			ok := c.process(p)
			c.cl.passed(r, len(c.carry), c.gr.left.unfinished())
			if !ok {
				return false
			}
		}
		if err != nil && !c.endRead(err) {
			return false
		}
	}
}

func (c *conn) takeKick() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.gr.kick
	c.gr.kick = false
	return k
}

// adoptable reports whether a loop may take the connection now: the store is connected, no
// goroutine copies its replies yet, and the client is between messages, with no deadline to watch;
// a TLS End's records all opened (the loop hears only of what comes to the socket).
func (c *conn) adoptable() bool {
	if c.cl.unopened() {
		return false
	}
	return c.gr.up != nil && !c.g.Passing() && !c.g.InMessage() && len(c.carry) == 0 && c.g.Deadline().IsZero() &&
		!c.g.Stalled() && !c.isClosed() && !c.replying()
}

// consumePeeked takes n bytes, which readPooled peeked, out of the socket (tcpcount.Discard).
// They are there, so it never waits; and it ignores the read deadline (a freeze's may have passed
// since the peek: bytes passed on and left in the socket would be passed on again). One that
// fails leaves them for the next read to fail too.
func consumePeeked(rc syscall.RawConn, n int) {
	rc.Control(func(fd uintptr) { tcpcount.Discard(int(fd), uint64(n)) })
}

// setDeadline arms the read deadline the connection's state calls for: the guard's deadline (a
// message in progress, or the first message), else the idle timeout; none by default, since a
// WAIT may last hours.
func (c *conn) setDeadline() {
	dl := c.g.Deadline()
	if idle := c.st.cfg.Timeouts.Idle; dl.IsZero() && idle > 0 && !c.g.Passing() {
		dl = c.s.now().Add(idle)
	}
	if !dl.Equal(c.gr.deadline) {
		c.gr.deadline = dl
		c.gr.client.SetReadDeadline(dl)
	}
}

// endRead handles a read error; it reports whether to keep reading.
func (c *conn) endRead(err error) bool {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		if c.s.frozen() {
			return true // woken to park (or a deadline too: judged once thawed)
		}
		if c.gr.deadline != unsetDeadline && c.spuriousTimeout(c.gr.deadline) {
			c.gr.deadline = unsetDeadline // a freeze's, and it ended: setDeadline arms the real one again
			return true
		}
		if c.g.Deadline().IsZero() {
			c.s.log.Debug("idle timeout", "conn", c.id)
			c.flow.ended(endedByGuard)
			c.closeBoth()
			return false
		}
		return c.expired()
	case errors.Is(err, io.EOF):
		// The client is done sending: pass the half-close on (a partial message is dropped,
		// never forwarded) and let the store's last replies through for a while.
		c.flow.ended(endedByClient)
		if !c.dial.done || !c.awaitUp() {
			c.closeBoth()
			return false
		}
		c.gr.up.CloseWrite()
		c.mu.Lock()
		c.gr.upDeadline, c.gr.readEnded = c.s.now().Add(c.s.replyGrace), true
		c.gr.up.SetReadDeadline(c.gr.upDeadline)
		c.mu.Unlock()
		return false
	default:
		c.flow.ended(endedByClient) // a reset, unless the guard closed it first
		c.closeBoth()
		return false
	}
}

// pipeStoreToClient passes the store's bytes to the client untouched, reading them as they come
// whether or not the client takes them (replies.go).
func (c *conn) pipeStoreToClient() {
	defer close(c.gr.s2cDone)
	defer c.dropReplies()
	defer c.closeBoth()
	defer c.awaitWritten() // the store's last replies reach the client before the close
	defer c.s.recoverConn(c)
	if b := c.gr.left.replies; b != nil { // followed already, by the process that read them
		c.gr.left.replies = nil
		c.queueHeld(b)
	}
	if p := c.gr.left.client; p.buf != nil { // followed already, by the loop that read it
		c.gr.left.client = chunk{}
		if !c.toClient(p.buf, p.to) {
			return
		}
	}
	rc, err := c.gr.up.SyscallConn()
	if err != nil {
		return
	}
	for {
		if c.s.frozen() && !c.isClosed() {
			c.park(&c.gr.parkS2C)
			c.mu.Lock()
			c.gr.up.SetReadDeadline(c.gr.upDeadline) // the freeze set its own
			c.mu.Unlock()
			continue
		}
		bp, n, peeked, err := c.cl.readReply(rc)
		if n > 0 {
			c.rep.follow((*bp)[:n])
			ok := c.toClient(bp, n) // which takes bp
			if peeked {
				consumePeeked(rc, n)
			}
			if !ok {
				return
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.mu.Lock()
				own := c.gr.upDeadline
				c.mu.Unlock()
				if c.s.frozen() || c.spuriousTimeout(own) {
					c.gr.up.SetReadDeadline(own) // woken to park, or a freeze's that ended
					continue
				}
			}
			c.flow.ended(endedByStore)
			return
		}
	}
}

// park holds the calling goroutine, one of c's (*at marks it parked), until the freeze ends. It
// returns at once if none is on.
func (c *conn) park(at *bool) {
	f := &c.s.cont.frz
	if !f.on.Load() {
		return
	}
	thawed := f.thawedCh()
	c.mu.Lock()
	*at = true
	c.mu.Unlock()
	<-thawed
	c.mu.Lock()
	*at = false
	c.mu.Unlock()
}

// quiet reports whether c is parked: its reader parked (or done: the client ended its stream), its
// reply reader parked or not started, no reply being written. It wakes what still runs.
func (c *conn) quiet() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.own != ownGoroutines {
		return false
	}
	c2s := c.gr.parkC2S || c.gr.readEnded
	s2c := !c.gr.s2cStarted || c.gr.parkS2C
	c.rep.mu.Lock()
	writing := c.rep.writing
	c.rep.mu.Unlock()
	if !c2s && c.gr.client != nil {
		c.gr.client.SetReadDeadline(past)
	}
	if !c2s && c.gr.up != nil {
		c.gr.up.SetWriteDeadline(past) // a write to a store that does not read: its rest waits (send)
	}
	if !s2c && c.gr.up != nil {
		c.gr.up.SetReadDeadline(past)
	}
	if writing && c.gr.client != nil {
		c.gr.client.SetWriteDeadline(past)
	}
	return c2s && s2c && !writing
}

// spuriousTimeout reports whether a read deadline that passed was not the connection's own, set to
// deadline (zero: none), but a freeze's, which ended: the caller re-arms its own and reads on.
func (c *conn) spuriousTimeout(deadline time.Time) bool {
	return deadline.IsZero() || c.s.now().Before(deadline)
}
