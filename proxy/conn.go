package proxy

import (
	"net"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/guard"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/storeinfo"
)

// A connection is forwarded by one of two transports: its own goroutines (goroutines.go), or an
// event loop (loop_linux.go) that forwards many connections from one thread. Both carry out the
// decisions of one guard.Stream through conn.act, and write to the store through a transport: no
// code outside the transport's own file asks which one runs it. Who owns the sockets at each
// moment is c.own; its transitions (owner_linux.go) and lock rules are drawn in docs/design.md.

// transport is how a connection's bytes reach the store and how it waits for budget.
type transport interface {
	// send writes a and then b (either may be empty) to the store; it reports whether the
	// connection lives on.
	send(c *conn, a, b []byte) bool
	// reserve takes n bytes of budget for holding tail, the start of a message. ok false: not
	// now; alive false: the connection ended.
	reserve(c *conn, n int64, tail []byte) (ok, alive bool)
	// stalled: the client's next message, starting rest, waits for a reply. judge: rest may be
	// judged now; else alive says whether the connection lives on (the transport keeps rest).
	stalled(c *conn, rest []byte) (judge, alive bool)
	// leftover is what the transport has left to finish.
	leftover() *leftover
}

// owner is who has a connection's sockets. Only c.mu's holder changes it.
type owner uint8

const (
	// ownGoroutines: Go's poller has client (and up once dialled); serve's goroutines forward.
	ownGoroutines owner = iota
	// ownLoop: the event loop lp has cfd and ufd; no goroutine reads or writes them.
	ownLoop
	// ownDetached: between a loop and the goroutines, cfd and ufd are nobody's; the goroutine
	// taking them over (fromLoop) closes them if the connection closed meanwhile.
	ownDetached
)

// replyGrace is how long the store's last replies may take after the client's end of stream.
const replyGrace = 30 * time.Second

// keepCarry is the largest partial-message buffer a connection keeps between messages; a larger
// one goes back to the runtime (and its bytes to the budget) once its message is forwarded.
const keepCarry = 4 << 10

// conn is one proxied client connection: what it is whoever forwards it, and each transport's
// own state (gr, lt), each with what it has left to finish (leftover), handed to the next owner
// by the call that moves the connection (owner_linux.go).
type conn struct {
	s        *Server
	st       *settings
	id       uint64
	src, dst netip.AddrPort
	start    time.Time

	g      guard.Stream
	out    transport  // the transport forwarding the connection now: &gr or &lt; only it changes out
	carry  []byte     // the bytes of the message in progress the guard holds (g.Held())
	held   int64      // budget held for carry's capacity
	cl     client     // the client side, whichever kind it is (client.go)
	gives  gives      // what the connection gives back as it ends
	silent silentLink // its place among its source's silent connections (silent.go); under s.reg.mu
	// storeSlot is the store connection's slot (storelimit.go), taken before the store is dialled
	// by whoever owns the connection then; end gives it back.
	storeSlot *admission.Slot

	mu     sync.Mutex // guards own, lt.lp, closed, gr.up, gr.kick, gr.s2cStarted, and gr.client while in a loop
	own    owner
	closed bool // the connection is to end: its owner closes the sockets
	dial   dialState

	gr goroutines    // the goroutine transport's state (goroutines.go)
	lt loopTransport // the event loop's (loop_linux.go)

	flow flowStats // its flow record's account (flow.go)
	rep  replies   // the store-to-client half (replies.go)
	seen seenState // what the stream has shown, for the reply half's goroutines
}

// leftover is what one owner of a connection leaves to the next to finish, in order (resume): a
// loop that would have to wait, a freeze, a previous process (upgrade) or a keeper restore. It is
// a value handed over by the call that moves the connection (leaveLoop, startAdopted), never
// shared: the giver does not touch it again.
type leftover struct {
	up      []byte // judged for the store and not written: the rest of carry (upCarry) or of a read
	upTail  []byte // then this, a copy of the rest of a read
	upCarry bool   // up is in a carry's buffer, whose budget (upHeld) it keeps until written
	upHeld  int64
	tail    []byte // the start of a message the budget could not hold at once, fed to keep again
	rest    []byte // the client's bytes not judged yet (after a stall at max-pending-replies, or refed)
	client  chunk  // a pooled buffer: the store's bytes a loop read and the client did not take
	replies []byte // replies a previous process held for the client, written before any other
}

// pendingUp reports whether bytes judged for the store wait: a loop could not write them, or a
// freeze began before the store was connected.
func (l *leftover) pendingUp() bool { return len(l.up)+len(l.upTail) > 0 }

// unfinished reports whether the goroutines have something to finish (resume).
func (l *leftover) unfinished() bool { return l.pendingUp() || l.tail != nil || l.rest != nil }

// empty reports whether nothing is left to finish.
func (l *leftover) empty() bool {
	return len(l.up)+len(l.upTail)+len(l.tail)+len(l.rest)+len(l.replies) == 0 && l.client.buf == nil
}

// dialState is whether the store was dialled for the connection, by either transport.
type dialState struct {
	done  bool          // the store was dialled (storeUp, connectStore); only the connection's owner sets it
	ready chan struct{} // closed once the dial is done; gr.up or lt.ufd is then set, or the dial failed
	// awaitStore: auto mode, and the store's generation was not known at accept; serve waits for
	// it before a byte moves (awaitGeneration).
	awaitStore bool
}

// gives is what a connection gives back as it ends: its admission (admission.Gate.Admit), and
// its place among the sources serving a job once it completed a message (markTalker; nil before).
type gives struct {
	admission func()
	talker    func()
}

// seenState is what the stream has shown, for the reply half's goroutines: bytes judged, and 1 +
// the generation once known (0 before).
type seenState struct {
	bytes atomic.Uint64
	gen   atomic.Uint32
}

// noteSeen publishes what the guard has judged of the stream (seenBytes, seenGen).
func (c *conn) noteSeen() {
	c.seen.bytes.Store(c.g.Bytes())
	if g, known := c.g.Generation(); known {
		c.seen.gen.Store(1 + uint32(g))
	}
}

// admit decides on a new connection from src under settings st, the snapshot that also decides
// whether it must handshake: a release func, or why it is refused.
func (s *Server) admit(src netip.Addr, st *settings) (release func(), reason admission.Reason) {
	if s.draining.on.Load() {
		return nil, refuseDraining
	}
	serving := s.sources.Serving(src)
	// A source that must handshake is judged by what it proves, not by its address's ban
	// (admission.AdmitToProve).
	toProve := !st.cfg.TLS.Plaintext(src)
	if toProve {
		release, reason = s.gate.AdmitToProve(src, serving)
	} else {
		release, reason = s.gate.Admit(src, serving)
	}
	if reason == admission.MaxConnections && s.reg.silentOver() {
		// Admitted in place of a silent connection (silent.go), closed once this one is in: its
		// slot is then this one's, whoever else is admitted meanwhile.
		if release, reason = s.gate.AdmitInPlace(src, serving, toProve); reason == "" && !s.evictSilent() {
			release() // another admission took the last one meanwhile
			release, reason = nil, admission.MaxConnections
		}
	}
	if reason == "" {
		s.m.accepted.Inc()
		s.m.active.Inc()
	}
	return release, reason
}

// evictSilent closes the newest silent connection of a source over its allowance, for a connection
// admitted in its place (admission.Gate.AdmitInPlace); it reports false when no source is over.
func (s *Server) evictSilent() bool {
	v := s.reg.takeSilentOver()
	if v == nil {
		return false
	}
	s.m.silentEvictions.Inc()
	v.flow.decided(audit.VerdictRefused, reasonSilentEvicted, v.st.monitor)
	v.flow.ended(endedByGuard)
	v.closeBoth()
	if s.every.evict.allow(s.now()) {
		s.log.Warn("caps.max-connections reached: closed a silent connection of a source over caps.per-source-silent "+
			"to admit a new one (not a violation; logged at most once a second)", "conn", v.id, "source", v.src.String())
	}
	return true
}

// newConn is the one constructor of a connection, however it starts (accepted here, taken over
// from a previous process, restored from a keeper): its identity, forwarded by goroutines until
// an owner change (owner_linux.go) says otherwise. The caller readies its guard.
func (s *Server) newConn(id uint64, src, dst netip.AddrPort, start time.Time) *conn {
	c := &conn{s: s, st: s.set.Load(), id: id, src: src, dst: dst, start: start,
		dial: dialState{ready: make(chan struct{})}}
	c.gr.s2cDone = make(chan struct{})
	c.lt.cfd, c.lt.ufd = -1, -1
	c.out = &c.gr
	c.cl.kp = s.cont.kp
	c.rep.init()
	return c
}

// accepted is a connection admitted now (release gives the admission back), not tracked yet;
// client is nil for one a loop accepted. Its guard starts, unless auto mode waits for the
// store's generation (awaitStore).
func (s *Server) accepted(client clientConn, src, dst netip.AddrPort, release func()) *conn {
	return s.acceptedAs(s.nextID.Add(1), client, src, dst, release)
}

// acceptedAs is accepted with the connection id given.
func (s *Server) acceptedAs(id uint64, client clientConn, src, dst netip.AddrPort, release func()) *conn {
	c := s.newConn(id, src, dst, s.now())
	c.gives.admission, c.gr.client = release, client
	if !c.st.dec.Gen.Auto {
		c.resetGuard(c.st.dec)
	} else if info, known := s.store.Get(); known {
		c.resetGuard(c.st.decoderFor(info))
	} else {
		c.dial.awaitStore = true
	}
	return c
}

// resetGuard readies the guard for the connection's stream, decoded as dc.
func (c *conn) resetGuard(dc protocol.Config) {
	c.g.Reset(dc, &c.st.pol, c.start)
	c.attachGuard()
}

// attachGuard tells a reset or restored guard what the connection keeps for it: its source, the
// message in progress (carry) and the replies awaited.
func (c *conn) attachGuard() {
	c.g.From(c.src.Addr())
	c.g.As(c.cl.identity())
	c.g.Hold(c)
	c.g.Await(&c.rep)
}

// Held is the start of the message in progress, for the guard's policy (guard.Holder).
func (c *conn) Held() []byte { return c.carry }

// decoderFor is the decoder configuration of a connection to a store that speaks info (auto
// mode): the store's own generation, fixed, its backend unless one is configured, and that
// backend's limits (auto ones differ: config.LimitsFor). Every byte forwarded is then framed as
// that store frames it. With a generation configured, info is unused.
func (st *settings) decoderFor(info storeinfo.Info) protocol.Config {
	dc := st.dec
	if dc.Gen.Auto {
		dc.Gen = protocol.GenSetting{Gen: info.Gen}
		if dc.Backend == protocol.BackendAny {
			dc.Backend = info.Backend
		}
		dc.Limits = st.cfg.LimitsFor(dc.Backend)
	}
	return dc
}

// process judges one read of the client's bytes and acts on it; it reports whether the
// connection lives on. A client at limits.max-pending-replies has the rest of p judged once a
// reply came (the transport's stalled).
func (c *conn) process(p []byte) bool {
	for {
		now := c.s.now()
		d := c.g.Feed(p, now)
		c.noteSeen()
		if !c.act(d, p[:len(p)-d.Rest], now) {
			return false
		}
		if d.Rest == 0 {
			return true
		}
		p = p[len(p)-d.Rest:]
		if judge, alive := c.out.stalled(c, p); !judge {
			return alive
		}
	}
}

// expired is the guard's deadline passing as the transport's timer measured it.
func (c *conn) expired() bool {
	return c.act(c.g.Expired(c.s.sources.Serving(c.src.Addr())), nil, c.s.now())
}

// act carries out the guard's decision d on p (empty at a deadline), decided at now; it reports
// whether the connection lives on.
func (c *conn) act(d guard.Decision, p []byte, now time.Time) bool {
	for _, w := range d.Warnings {
		c.s.ev.warning(c, w.Violation, w.First)
	}
	if d.Talked {
		c.gives.talker = c.s.markTalker(c.src.Addr())
	}
	if d.Send {
		if !c.sendHeld(p[:d.Forward]) {
			return false
		}
		if d.Violation == nil {
			c.s.m.latency.Observe(c.s.now().Sub(now).Seconds())
		}
	}
	if d.Violation != nil {
		c.s.ev.violation(c, d.Violation, d.First)
		if !c.st.monitor {
			c.flow.ended(endedByGuard)
			c.closeBoth()
			return false
		}
		c.releaseCarry() // the stream goes on undecoded: nothing is held any more
		return true
	}
	if d.Keep {
		return c.keep(p[d.Forward:])
	}
	return true
}

// sendHeld writes carry (the start of a message) and then p.
func (c *conn) sendHeld(p []byte) bool {
	ok := c.out.send(c, c.carry, p)
	switch left := c.out.leftover(); {
	case left.upCarry:
		// The transport left its rest to write: the buffer and its budget go with it, and the
		// next message starts a carry of its own.
		c.carry, left.upHeld, c.held = nil, c.held, 0
	case cap(c.carry) > keepCarry:
		c.releaseCarry()
	default:
		c.carry = c.carry[:0]
	}
	return ok
}

// resume finishes, in order, what a loop left to the goroutines or a freeze interrupted: the bytes
// judged for the store, the start of a message the budget could not hold at once, and bytes not
// judged yet (after a stall at max-pending-replies). It reports whether the connection lives on.
// A freeze that begins meanwhile ends it early, the rest left as it was (unfinished): the reader
// parks, and resumes after the thaw; or the next process gets it all.
func (c *conn) resume() bool {
	if c.gr.left.pendingUp() {
		a, b := c.gr.left.up, c.gr.left.upTail
		c.gr.left.up, c.gr.left.upTail = nil, nil
		ok := c.out.send(c, a, b)
		if c.gr.left.upCarry && len(c.gr.left.up) == 0 { // the carry's buffer is written: its budget goes back now
			c.s.buf.release(c.src.Addr(), c.gr.left.upHeld)
			c.gr.left.upCarry, c.gr.left.upHeld = false, 0
		}
		if !ok || c.gr.left.pendingUp() {
			return ok // a freeze came first: the rest is kept for after it
		}
	}
	if t := c.gr.left.tail; t != nil {
		c.gr.left.tail = nil
		if !c.keep(t) {
			return false
		}
		if c.gr.left.tail != nil {
			return true // the freeze came first: kept for after it
		}
	}
	if r := c.gr.left.rest; r != nil {
		c.gr.left.rest = nil
		return c.process(r)
	}
	return true
}

// keep appends the start of an incomplete message to carry, taking budget for any growth. The
// decoder guarantees the message in progress is within limits.max-message-bytes. Growth covers the
// rest of the key or value being read, as declared: one reservation for a large value, not a
// doubling per read, so that connections holding halves of large values cannot all wait on each
// other for the budget.
func (c *conn) keep(tail []byte) bool {
	need := len(c.carry) + len(tail)
	if need > cap(c.carry) {
		limit := int(c.g.Limits().MaxMessageBytes)
		whole := need + int(min(c.g.BodyLeft(), uint64(limit)))
		newCap := min(max(2*cap(c.carry), whole, 512), max(limit, need))
		grow := int64(newCap - cap(c.carry))
		if ok, alive := c.out.reserve(c, grow, tail); !ok {
			return alive
		}
		c.held += grow
		nc := make([]byte, len(c.carry), newCap)
		copy(nc, c.carry)
		c.carry = nc
	}
	c.carry = append(c.carry, tail...)
	return true
}

func (c *conn) releaseCarry() {
	c.s.buf.release(c.src.Addr(), c.held)
	c.held = 0
	c.carry = nil
}

// end gives back what the connection held, once both directions are done, and writes its flow
// record: a message in progress at the end (the client's FIN or RST, or the store's close) is
// truncated_message.
func (c *conn) end() {
	c.finish()
	if d := c.g.Ended(); d.Violation != nil {
		c.s.ev.truncated(c, d.Violation, d.First)
	}
	c.endFlow()
	if c.storeSlot != nil { // the store's socket is closed by now
		c.storeSlot.Release()
	}
	c.s.track(c, false)
	c.cl.ended(c.id)
	c.cl.release()
	c.s.m.active.Dec()
	c.gives.admission()
	c.s.handlers.Done()
}

// finish waits for the reply direction to end and gives back what the connection held.
func (c *conn) finish() {
	if c.dial.done && c.awaitUp() && c.replying() {
		<-c.gr.s2cDone
	}
	c.releaseCarry()
	c.s.buf.release(c.src.Addr(), c.gr.left.upHeld) // a loop's is handed to the goroutines first (leaveLoop)
	c.gr.left.upHeld = 0
	if c.gives.talker != nil {
		c.gives.talker()
	}
}

// closeBoth ends the connection: its owner closes the sockets (a loop when it has them, the
// goroutine taking detached ones over), or it closes them here.
func (c *conn) closeBoth() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	switch c.own {
	case ownLoop:
		c.lt.lp.requestClose(c)
	case ownGoroutines:
		if c.gr.client != nil {
			c.gr.client.Close()
		}
		if c.gr.up != nil {
			c.gr.up.Close()
		}
	}
}

func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// recoverConn turns a panic in a connection's goroutine into a closed connection and a count:
// hostile input must never stop the proxy.
func (s *Server) recoverConn(c *conn) {
	if r := recover(); r != nil {
		s.panicked(r, c)
	}
}

// panicked counts and logs a recovered panic, and closes c, the connection it was handling (nil:
// none yet).
func (s *Server) panicked(r any, c *conn) {
	s.m.panics.Inc()
	if c == nil {
		s.log.Error("accepting a connection panicked", "panic", r, "stack", string(debug.Stack()))
		return
	}
	s.log.Error("connection handler panicked", "conn", c.id, "panic", r, "stack", string(debug.Stack()))
	c.closeBoth()
}

// everySecond lets one event through per second, for logs a flood could otherwise fill.
type everySecond struct{ last atomic.Int64 }

func (e *everySecond) allow(now time.Time) bool {
	t, prev := now.Unix(), e.last.Load()
	return t != prev && e.last.CompareAndSwap(prev, t)
}

// track adds c to the server's connections (on) or takes it out; one that has sent nothing is
// indexed as silent.
func (s *Server) track(c *conn, on bool) {
	s.reg.mu.Lock()
	if on {
		s.reg.conns[c] = struct{}{}
		if c.flow.fromClient.Load() == 0 {
			s.reg.addSilentLocked(c)
		}
	} else {
		delete(s.reg.conns, c)
		s.reg.dropSilentLocked(c)
	}
	s.reg.mu.Unlock()
}

func addrPort(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort()
	}
	return netip.AddrPort{}
}

// takeStoreSlot takes the connection's store slot if one is free at once and a dial token is
// there for it (event loops never wait).
func (c *conn) takeStoreSlot() bool {
	if c.storeSlot != nil {
		return true
	}
	slot, reason := c.s.slots.TryTake(c.src.Addr())
	if reason != "" {
		c.s.storeCaps.HeldBack(reason)
		return false
	}
	c.tookSlot(slot)
	return true
}

// awaitStoreSlot takes the connection's store slot, waiting up to timeouts.upstream-dial (or until
// drain ends) in StoreSlots' queue for a slot to free and a dial token to come due; the queue
// serves sources that serve a job first. It reports false, having counted and recorded the
// refusal, when none came: the client is then closed, which is not its violation (a job larger
// than the caps, or another source's flood, may be why). deferred: a freeze began first, and the
// connection asks again after it (or in the next process).
func (c *conn) awaitStoreSlot() (ok, deferred bool) {
	if c.storeSlot != nil {
		return true, false
	}
	src := c.src.Addr()
	slot, reason := c.s.slots.TryTake(src)
	if reason == "" {
		c.tookSlot(slot)
		return true, false
	}
	c.s.storeCaps.HeldBack(reason)
	c.s.m.storeQueued.WithLabelValues(string(reason)).Inc()
	ctx, cancel := c.s.waitFor(c.st.cfg.Timeouts.UpstreamDial)
	defer cancel()
	slot, reason = c.s.slots.Take(ctx, src, c.s.servingJob(src, c))
	switch {
	case reason == "":
		c.tookSlot(slot)
		return true, false
	case c.isClosed():
		return false, false // drain closed it
	case frozeFirst(ctx):
		return false, true
	}
	c.s.refuseStore(c, reason)
	return false, false
}

// tookSlot keeps the store slot the connection was granted, and has it paced by the store's
// answers to the connection.
func (c *conn) tookSlot(slot *admission.Slot) {
	c.storeSlot = slot
	c.rep.paceWith(slot)
}
