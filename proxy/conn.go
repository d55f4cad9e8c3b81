package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

// readSize is the size of the pooled read buffers. Buffers are taken only once a socket is
// readable and given back after each read, so an idle connection holds none.
const readSize = 16 << 10

var readBufs = sync.Pool{New: func() any { b := make([]byte, readSize); return &b }}

// replyGrace is how long the store's last replies may take after the client's end of stream.
const replyGrace = 30 * time.Second

// keepCarry is the largest partial-message buffer a connection keeps between messages; a larger
// one goes back to the runtime (and its bytes to the budget) once its message is forwarded.
const keepCarry = 4 << 10

// conn is one proxied client connection.
type conn struct {
	s        *Server
	st       *settings
	id       uint64
	client   *net.TCPConn
	up       *net.TCPConn
	src, dst netip.AddrPort
	start    time.Time

	dec      protocol.Decoder
	carry    []byte      // bytes of the message in progress that arrived in earlier reads
	held     int64       // budget held for carry's capacity
	vec      net.Buffers // reused for writev of carry + the rest of a message
	vecArr   [2][]byte
	msgStart time.Time // when the message in progress began
	deadline time.Time // the read deadline set on client
	bytesIn  uint64
	raw      bool // monitor mode after a violation: pass everything through
	spared   bool // a silent G0 callback connection, let past the first-message deadline
	// awaitStore: auto mode, and the store's generation was not known at accept; serve waits for
	// it before a byte moves (awaitGeneration).
	awaitStore bool
	untalk     func()
	release    func() // gives back the admission (Gate.Admit)

	mu         sync.Mutex // guards up, closed, lp, kick, s2cStarted and (while in a loop) client
	closed     bool
	upReady    chan struct{} // closed once dialStore is done; up is then set, or the dial failed
	s2cStarted bool          // the reply direction's goroutine runs (or ran)
	s2cDone    chan struct{}

	// Event-loop forwarding (loop.go). kick: the store is connected and the reading goroutine is
	// to offer the connection to a loop. While lp is set, the loop owns cfd and ufd (client and up
	// are closed, or nil for a connection the loop took from its first byte) and no goroutine
	// serves the connection. What the loop could not finish is left in pendUp (bytes for the
	// store), pendClient (bytes for the client) and resumeTail (the start of a message it could
	// not keep), for the goroutines it hands the connection to to finish first.
	kick        bool
	lp          *loop
	inLoop      bool
	clientEnded bool        // the client's end of stream reached the loop, which passed it on
	registered  bool        // in its loop's epoll set; only the loop reads and writes it
	timer       *time.Timer // the loop's message deadline timer, firing at timerAt
	timerAt     time.Time
	cfd, ufd    int32
	pendUp      []byte
	pendClient  []byte
	resumeTail  []byte
}

// handle admits a connection Serve accepted, on a goroutine of its own, and serves it.
func (s *Server) handle(tc *net.TCPConn) {
	remote := addrPort(tc.RemoteAddr())
	src := netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	dst := originalDst(tc)
	release, reason := s.admit(src.Addr())
	if reason != "" {
		s.refuse(src, dst, reason)
		tc.Close()
		s.handlers.Done()
		return
	}
	c := s.newConn(tc, src, dst, release)
	s.track(c, true)
	c.serve(false)
}

// admit decides on a new connection from src: a release func, or why it is refused.
func (s *Server) admit(src netip.Addr) (release func(), reason admission.Reason) {
	if s.draining.Load() {
		return nil, refuseDraining
	}
	release, reason = s.gate.Admit(src)
	if reason == "" {
		s.m.accepted.Inc()
		s.m.active.Inc()
	}
	return release, reason
}

// newConn is an admitted connection, not tracked yet; client is nil for one a loop accepted.
func (s *Server) newConn(client *net.TCPConn, src, dst netip.AddrPort, release func()) *conn {
	st := s.set.Load()
	c := &conn{s: s, st: st, id: s.nextID.Add(1), client: client, src: src, dst: dst, start: s.now(),
		upReady: make(chan struct{}), s2cDone: make(chan struct{}), cfd: -1, ufd: -1, release: release}
	if !st.dec.Gen.Auto {
		c.dec.Reset(st.dec)
	} else if info, known, _ := s.store.Load().get(); known {
		c.dec.Reset(st.decoderFor(info))
	} else {
		c.awaitStore = true
	}
	return c
}

// decoderFor is the decoder configuration of a connection to a store that speaks info (auto
// mode): the store's own generation, fixed, and its backend unless one is configured. Every byte
// forwarded is then framed as that store frames it. With a generation configured, info is unused.
func (st *settings) decoderFor(info StoreInfo) protocol.Config {
	dc := st.dec
	if dc.Gen.Auto {
		dc.Gen = protocol.GenSetting{Gen: info.Gen}
		if dc.Backend == protocol.BackendAny {
			dc.Backend = info.Backend
		}
	}
	return dc
}

// awaitGeneration holds a connection that arrived before the store's generation was known (auto
// mode) until it is: nothing is read from the client or sent to the store meanwhile. It reports
// false, having counted it, when timeouts.upstream-dial passed first (or drain ended).
func (c *conn) awaitGeneration() bool {
	info, ok := c.s.store.Load().await(c.st.cfg.Timeouts.UpstreamDial, c.s.drainEnd)
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
	c.awaitStore = false
	c.dec.Reset(c.st.decoderFor(info))
	return true
}

// serve forwards the connection with goroutines until it ends, then ends it, unless a loop takes
// it (the loop then ends it). A new connection goes straight to a loop when connectNow can
// connect it; fromLoop: a loop handed the connection back.
func (c *conn) serve(fromLoop bool) {
	took := false
	defer func() {
		if !took {
			c.end()
		}
	}()
	defer c.s.recoverConn(c) // first: a panic closes the sockets, so finish does not wait forever
	if c.awaitStore && !c.awaitGeneration() {
		close(c.upReady) // no store connection: there is nothing to wait for
		c.closeBoth()
		return
	}
	switch {
	case fromLoop:
		if !c.fromLoop() {
			return
		}
	case c.connectNow():
		var live bool
		if took, live = c.toLoop(); took || !live {
			return
		}
	}
	select {
	case <-c.upReady:
	default:
		// The store is dialled while the client's first bytes are already being decoded: a
		// hostile message is refused at once even while the store is still starting.
		go c.dialStore()
	}
	took = c.pipeClientToStore()
}

// end gives back what the connection held, once both directions are done.
func (c *conn) end() {
	c.finish()
	c.s.track(c, false)
	c.s.m.active.Dec()
	c.release()
	c.s.handlers.Done()
}

// connectNow connects to a store on this host outside Go's poller, for a loop to forward the
// connection from its first byte: no dialling goroutine, no poller registration, no kick. The
// store socket is then ufd. It reports false, leaving the dial to dialStore, when loops do not
// take this connection or the store did not take it at once (it is not listening yet, or its
// accept queue is full).
func (c *conn) connectNow() bool {
	if c.s.loops == nil || c.awaitStore || !c.st.local.IsValid() || c.st.cfg.Timeouts.Idle != 0 || c.needsDeadline() {
		return false
	}
	fd, err := connectLocal(c.st.local)
	if err != nil {
		return false
	}
	c.ufd = fd
	close(c.upReady)
	return true
}

// connectLocal connects a non-blocking socket to ap and returns it once established. A connect
// to this host runs the whole handshake within the call, so the socket is established when it
// returns EINPROGRESS, unless the listener dropped the SYN: then, as for a refusal, it fails.
func connectLocal(ap netip.AddrPort) (int32, error) {
	family, sa := syscall.AF_INET6, syscall.Sockaddr(&syscall.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()})
	if ap.Addr().Is4() {
		family, sa = syscall.AF_INET, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	if err = syscall.Connect(fd, sa); err == syscall.EINPROGRESS {
		_, err = syscall.Getpeername(fd) // ENOTCONN until established
	}
	if err == nil {
		err = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1) // as net.Dial
	}
	if err != nil {
		syscall.Close(fd)
		return -1, err
	}
	return int32(fd), nil
}

// finish waits for the reply direction to end and gives back what the connection held.
func (c *conn) finish() {
	if c.awaitUp() && c.replying() {
		<-c.s2cDone
	}
	c.releaseCarry()
	if c.untalk != nil {
		c.untalk()
	}
}

// recoverConn turns a panic in a connection's goroutine into a closed connection and a count:
// hostile input must never stop the proxy.
func (s *Server) recoverConn(c *conn) {
	if r := recover(); r != nil {
		s.m.panics.Inc()
		s.log.Error("connection handler panicked", "conn", c.id, "panic", r, "stack", string(debug.Stack()))
		c.closeBoth()
	}
}

// everySecond lets one event through per second, for logs a flood could otherwise fill.
type everySecond struct{ last atomic.Int64 }

func (e *everySecond) allow(now time.Time) bool {
	t, prev := now.Unix(), e.last.Load()
	return t != prev && e.last.CompareAndSwap(prev, t)
}

// dialUpstream connects to the store, retrying refused connections until timeout: workers often
// start before the master's store listens, and torch retries a refused connect but not a
// connection that is accepted and then closed, which is what the guard would otherwise do to
// them. It gives up early once stop reports true (the client left or was refused).
func dialUpstream(addr string, timeout time.Duration, stop func() bool) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	for backoff := 20 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		d := net.Dialer{Timeout: time.Until(deadline), KeepAlive: -1} // no keep-alive probes to the local store
		up, err := d.Dial("tcp", addr)
		if err == nil {
			return up, nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Until(deadline) < backoff || stop() {
			return nil, err
		}
		time.Sleep(backoff)
	}
}

// originalDst is the address the client dialled: after an nftables/iptables REDIRECT (the
// transparent sidecar of configs/) the socket's local address is the proxy port, and the
// kernel keeps the original in SO_ORIGINAL_DST.
func originalDst(c *net.TCPConn) netip.AddrPort {
	local := addrPort(c.LocalAddr())
	rc, err := c.SyscallConn()
	if err != nil {
		return local
	}
	orig := local
	rc.Control(func(fd uintptr) { orig = originalDstFd(int(fd), local) })
	return orig
}

// originalDstFd is originalDst for a socket whose local address is local.
func originalDstFd(fd int, local netip.AddrPort) netip.AddrPort {
	const soOriginalDst = 80 // SO_ORIGINAL_DST and IP6T_SO_ORIGINAL_DST
	var sa [28]byte          // sockaddr_in or sockaddr_in6
	n := uint32(len(sa))
	level := syscall.SOL_IP
	if local.Addr().Is6() && !local.Addr().Is4In6() {
		level = syscall.SOL_IPV6
	}
	_, _, e := syscall.RawSyscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), soOriginalDst,
		uintptr(unsafe.Pointer(&sa[0])), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return local
	}
	port := uint16(sa[2])<<8 | uint16(sa[3])
	switch {
	case sa[0] == syscall.AF_INET && n >= 8:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), port)
	case sa[0] == syscall.AF_INET6 && n >= 24:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(sa[8:24])), port)
	}
	return local
}

func (s *Server) track(c *conn, on bool) {
	s.mu.Lock()
	if on {
		s.conns[c] = struct{}{}
	} else {
		delete(s.conns, c)
	}
	s.mu.Unlock()
}

func addrPort(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort()
	}
	return netip.AddrPort{}
}

func (c *conn) closeBoth() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	if c.lp != nil {
		c.lp.requestClose(c) // the loop owns the sockets: it closes them
		return
	}
	c.client.Close()
	if c.up != nil {
		c.up.Close()
	}
}

func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// dialStore connects to the store and starts the reply direction; on failure it closes the client.
func (c *conn) dialStore() {
	defer close(c.upReady)
	s, st := c.s, c.st
	up, err := dialUpstream(st.cfg.Upstream, st.cfg.Timeouts.UpstreamDial, c.isClosed)
	if err != nil {
		if c.isClosed() {
			return // the client left or was refused: not the store's failure
		}
		s.m.dialFailures.Inc()
		if s.dialLog.allow(s.now()) {
			s.log.Warn("upstream dial failed; closing client (logged at most once a second)", "conn", c.id,
				"upstream", st.cfg.Upstream, "err", err)
		}
		c.closeBoth()
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		up.Close()
		return
	}
	c.up = up.(*net.TCPConn)
	if s.loops != nil && st.cfg.Timeouts.Idle == 0 {
		// Ask the handler, wherever it is, to offer the connection to a loop: wake it from a read.
		c.kick = true
		c.client.SetReadDeadline(time.Unix(1, 0))
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.startReplies()
}

// startReplies starts the reply direction's goroutine, once.
func (c *conn) startReplies() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.s2cStarted || c.up == nil || c.closed {
		return
	}
	c.s2cStarted = true
	go c.pipeStoreToClient()
}

func (c *conn) replying() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s2cStarted
}

// awaitUp waits for dialStore and reports whether the store is connected.
func (c *conn) awaitUp() bool {
	<-c.upReady
	return c.up != nil
}

// pipeClientToStore reads the client, decodes, and forwards complete valid messages, until the
// connection ends or a loop takes it (took: the loop owns it now).
func (c *conn) pipeClientToStore() (took bool) {
	rc, err := c.client.SyscallConn()
	if err != nil {
		c.closeBoth()
		return false
	}
	for {
		if c.takeKick() {
			c.deadline = time.Unix(1, 0) // the kick moved the read deadline: setDeadline re-arms it
			if c.adoptable() {
				took, live := c.toLoop()
				if took || !live {
					return took
				}
				if rc, err = c.client.SyscallConn(); err != nil {
					c.closeBoth()
					return false
				}
			} else {
				c.startReplies()
			}
		}
		c.setDeadline()
		bp, n, err := readPooled(rc)
		if n > 0 {
			ok := c.process((*bp)[:n])
			readBufs.Put(bp)
			if !ok {
				return false
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && c.kicked() {
				continue
			}
			if !c.endRead(err) {
				return false
			}
		}
	}
}

func (c *conn) kicked() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kick
}

func (c *conn) takeKick() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.kick
	c.kick = false
	return k
}

// adoptable reports whether a loop may take the connection now: the store is connected and the
// client is between messages, with no deadline to watch.
func (c *conn) adoptable() bool {
	return c.up != nil && !c.raw && !c.dec.InMessage() && len(c.carry) == 0 && !c.needsDeadline() && !c.isClosed()
}

func (c *conn) needsDeadline() bool {
	return !c.nextDeadline().IsZero()
}

// nextDeadline is when the connection's next message or first-message deadline falls, zero for
// none (protocol.Deadlines.Next) and for a connection passed through undecoded after a monitor-mode
// violation.
func (c *conn) nextDeadline() time.Time {
	if c.raw {
		return time.Time{}
	}
	return c.st.deadlines.Next(&c.dec, c.start, c.msgStart, c.spared)
}

// toLoop hands the connection to an event loop. took: the loop owns it now, and the caller must
// not touch it again (the loop ends it, or hands it back to a new serve goroutine). Otherwise live
// reports whether it goes on with goroutines.
func (c *conn) toLoop() (took, live bool) {
	cfd, ufd, err := c.loopFds()
	if err != nil {
		// Out of descriptors, most likely: the connection stays on its goroutines, unharmed.
		c.s.log.Debug("could not hand a connection to an event loop", "conn", c.id, "err", err)
		if c.up == nil && !c.attachUp() {
			return false, false
		}
		c.startReplies()
		return false, true
	}
	l := c.s.loops.pick()
	c.mu.Lock()
	c.cfd, c.ufd = cfd, ufd
	if c.closed {
		c.closeDetached()
		c.mu.Unlock()
		return false, false
	}
	c.lp, c.inLoop = l, true
	c.mu.Unlock()
	if l.adopt(c) {
		return true, true
	}
	c.mu.Lock() // the loop failed (logged): stay on goroutines
	c.lp = nil
	c.mu.Unlock()
	return false, c.fromLoop()
}

// fromLoop gives the connection's sockets back to Go's poller after a loop and writes what the
// loop left unwritten; it reports whether the connection lives on.
func (c *conn) fromLoop() bool {
	c.inLoop = false
	if !c.reattach() {
		return false
	}
	if len(c.pendUp) > 0 {
		n, err := c.up.Write(c.pendUp)
		c.s.m.bytesC2S.Add(float64(n))
		c.pendUp = nil
		if err != nil {
			c.closeBoth()
			return false
		}
	}
	if t := c.resumeTail; t != nil {
		c.resumeTail = nil
		if !c.keep(t) {
			return false
		}
	}
	c.startReplies()
	return true
}

// loopFds takes the connection's sockets away from Go's poller for a loop: the client's, and the
// store's unless connectNow made it outside the poller (then it is ufd already).
func (c *conn) loopFds() (cfd, ufd int32, err error) {
	if c.up != nil {
		return detach(c.client, c.up)
	}
	if cfd, err = dupFd(c.client); err != nil {
		return -1, -1, err
	}
	c.client.Close()
	return cfd, c.ufd, nil
}

// attachUp gives the store socket connectNow made to Go's poller, for goroutines to forward; it
// reports whether the connection lives on.
func (c *conn) attachUp() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	fd := c.ufd
	c.ufd = -1
	if c.closed {
		syscall.Close(int(fd))
		return false
	}
	up, err := attach(fd)
	if err != nil {
		c.s.log.Warn("could not give a store connection to Go's poller; closing it", "conn", c.id, "err", err)
		c.closed = true
		c.client.Close()
		return false
	}
	c.up = up
	return true
}

// leaveLoop is called by the loop that lets c go, after it stopped watching c's sockets: a closed
// connection ends there, a live one goes on with goroutines.
func (c *conn) leaveLoop() {
	c.mu.Lock()
	c.lp = nil
	closed := c.closed
	if closed {
		c.closeDetached()
	}
	c.mu.Unlock()
	if closed {
		c.end()
		return
	}
	go c.serve(true)
}

// closeDetached closes the descriptors a loop owned; c.mu is held.
func (c *conn) closeDetached() {
	if c.cfd >= 0 {
		syscall.Close(int(c.cfd))
		syscall.Close(int(c.ufd))
	}
	c.cfd, c.ufd = -1, -1
}

// reattach gives the sockets back to Go's poller after a loop; it reports whether the connection
// lives on.
func (c *conn) reattach() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.closeDetached()
		return false
	}
	client, err := attach(c.cfd)
	if err == nil {
		c.cfd = -1
		var up *net.TCPConn
		if up, err = attach(c.ufd); err == nil {
			c.client, c.up, c.ufd = client, up, -1
			return true
		}
		client.Close()
	}
	c.s.log.Warn("could not take a connection back from its event loop; closing it", "conn", c.id, "err", err)
	c.closed = true
	if c.ufd >= 0 { // attach closed what it was given, and cfd is then -1
		syscall.Close(int(c.ufd))
	}
	c.cfd, c.ufd = -1, -1
	return false
}

// readPooled reads what the socket has into a pooled buffer, taking the buffer only once data is
// there: while the socket would block, the buffer goes back to the pool, so an idle connection
// holds none. The caller returns the buffer when n > 0. It costs the same system calls as a
// plain Read (a read that would block, then the read that succeeds).
func readPooled(rc syscall.RawConn) (bp *[]byte, n int, err error) {
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		if bp == nil {
			bp = readBufs.Get().(*[]byte)
		}
		for {
			n, rerr = syscall.Read(int(fd), *bp)
			if rerr != syscall.EINTR {
				break
			}
		}
		if rerr == syscall.EAGAIN {
			readBufs.Put(bp)
			bp = nil
			return false
		}
		return true
	})
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

// setDeadline arms the read deadline the connection's state calls for: the message deadline while
// a message is in progress, else the first-message deadline before any message, else the idle
// timeout; none by default, since a WAIT may last hours.
func (c *conn) setDeadline() {
	dl := c.nextDeadline()
	if idle := c.st.cfg.Timeouts.Idle; dl.IsZero() && idle > 0 && !c.raw {
		dl = c.s.now().Add(idle)
	}
	if !dl.Equal(c.deadline) {
		c.deadline = dl
		c.client.SetReadDeadline(dl)
	}
}

// endRead handles a read error; it reports whether to keep reading.
func (c *conn) endRead(err error) bool {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		if c.nextDeadline().IsZero() {
			c.s.log.Debug("idle timeout", "conn", c.id)
			c.closeBoth()
			return false
		}
		if !c.dec.InMessage() && protocol.MaySpareSilent(c.st.dec.Gen, c.s.isTalker(c.src.Addr())) {
			c.spared = true
			return true
		}
		return c.violation(c.st.deadlines.Expire(&c.dec), nil, 0)
	case errors.Is(err, io.EOF):
		// The client is done sending: pass the half-close on (a partial message is dropped,
		// never forwarded) and let the store's last replies through for a while.
		if !c.awaitUp() {
			c.closeBoth()
			return false
		}
		c.up.CloseWrite()
		c.up.SetReadDeadline(c.s.now().Add(replyGrace))
		return false
	default:
		c.closeBoth()
		return false
	}
}

// process decodes one read and forwards the complete messages in it; it reports whether the
// connection lives on.
func (c *conn) process(p []byte) bool {
	c.bytesIn += uint64(len(p))
	if c.raw {
		return c.forward(p)
	}
	fwd := 0 // p[:fwd] completes carry's message and holds whole messages after it
	for i := 0; i < len(p); {
		n, msg, err := c.dec.Scan(p[i:])
		i += n
		if err != nil {
			return c.violation(err.(*protocol.Violation), p, fwd)
		}
		if msg != nil {
			fwd = i
			c.s.m.byOp[msg.Generation][msg.Op].Inc()
			if c.untalk == nil {
				c.untalk = c.s.markTalker(c.src.Addr())
			}
		}
	}
	if fwd > 0 {
		start := c.s.now()
		if !c.forwardCarry(p[:fwd]) {
			return false
		}
		c.s.m.latency.Observe(c.s.now().Sub(start).Seconds())
	}
	tail := p[fwd:]
	if len(tail) == 0 {
		return true
	}
	if c.dec.PartialBytes() == uint64(len(tail)) {
		c.msgStart = c.s.now() // the message in progress began in this read
	}
	return c.keep(tail)
}

// forwardCarry writes carry (the start of a message) and then p, in one writev.
func (c *conn) forwardCarry(p []byte) bool {
	if len(c.carry) == 0 {
		return c.forward(p)
	}
	if c.inLoop {
		ok := c.loopWrite(c.carry, p)
		c.carry = c.carry[:0]
		if cap(c.carry) > keepCarry {
			c.releaseCarry()
		}
		return ok
	}
	if !c.awaitUp() {
		return false
	}
	c.vecArr = [2][]byte{c.carry, p}
	c.vec = c.vecArr[:]
	n, err := c.vec.WriteTo(c.up)
	c.s.m.bytesC2S.Add(float64(n))
	c.carry = c.carry[:0]
	if cap(c.carry) > keepCarry {
		c.releaseCarry()
	}
	if err != nil {
		c.closeBoth()
		return false
	}
	return true
}

func (c *conn) forward(p []byte) bool {
	if c.inLoop {
		return c.loopWrite(p, nil)
	}
	if !c.awaitUp() {
		return false
	}
	n, err := c.up.Write(p)
	c.s.m.bytesC2S.Add(float64(n))
	if err != nil {
		c.closeBoth()
		return false
	}
	return true
}

// loopWrite writes a and then b to the store without waiting; what the store cannot take yet is
// kept in pendUp, and everything after it too, for the goroutines to write.
func (c *conn) loopWrite(a, b []byte) bool {
	if len(a) == 0 {
		a, b = b, nil
	}
	if len(a) == 0 {
		return true
	}
	if len(c.pendUp) > 0 {
		c.pendUp = append(append(c.pendUp, a...), b...)
		return true
	}
	n, errno := writeFd(c.ufd, a, b)
	c.s.m.bytesC2S.Add(float64(n))
	if errno != 0 && errno != syscall.EAGAIN {
		c.closeBoth()
		return false
	}
	if n < len(a) {
		c.pendUp = append(append([]byte(nil), a[n:]...), b...)
	} else if n -= len(a); n < len(b) {
		c.pendUp = append([]byte(nil), b[n:]...)
	}
	return true
}

// keep appends the start of an incomplete message to carry, taking budget for any growth. The
// decoder guarantees the message in progress is within limits.max-message-bytes.
func (c *conn) keep(tail []byte) bool {
	need := len(c.carry) + len(tail)
	if need > cap(c.carry) {
		limit := int(c.st.dec.Limits.MaxMessageBytes)
		newCap := min(max(2*cap(c.carry), need, 512), max(limit, need))
		grow := int64(newCap - cap(c.carry))
		if ok, alive := c.acquire(grow, tail); !ok {
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

// acquire takes n bytes of budget for keeping tail. In a loop, which must not wait, a spent
// budget leaves tail to the handler (ok false, alive true); the handler waits until the message's
// deadline, which is a violation when it passes (ok and alive false).
func (c *conn) acquire(n int64, tail []byte) (ok, alive bool) {
	if c.inLoop {
		if c.s.buf.tryAcquire(n) {
			return true, true
		}
		c.resumeTail = append([]byte(nil), tail...)
		return false, true
	}
	ctx, cancel := context.WithDeadline(context.Background(), c.msgStart.Add(c.st.cfg.Timeouts.Message))
	if c.st.cfg.Timeouts.Message <= 0 {
		ctx, cancel = context.WithCancel(context.Background())
	}
	defer cancel()
	if err := c.s.buf.acquire(ctx, n); err != nil {
		return false, c.violation(c.dec.Expire(protocol.RuleMessageTimeout), tail, 0)
	}
	return true, true
}

func (c *conn) releaseCarry() {
	c.s.buf.release(c.held)
	c.held = 0
	c.carry = nil
}

// violation records v; p[:fwd] holds complete valid messages still to forward and p[fwd:] the
// start of the offending one (after carry). In enforce mode the connection closes without a byte
// of the offending message reaching the store; in monitor mode everything is forwarded and the
// connection goes on undecoded. It reports whether the connection lives on.
func (c *conn) violation(v *protocol.Violation, p []byte, fwd int) bool {
	if fwd > 0 && !c.forwardCarry(p[:fwd]) {
		return false
	}
	var first [audit.MaxFirstBytes]byte
	n := copy(first[:], c.carry)
	n += copy(first[n:], p[fwd:])
	c.s.recordViolation(c, v, first[:n])
	if !c.st.monitor {
		c.closeBoth()
		return false
	}
	c.raw = true
	if len(c.carry) > 0 && !c.forward(c.carry) {
		return false
	}
	c.releaseCarry()
	return c.forward(p[fwd:])
}

// pipeStoreToClient passes the store's bytes to the client untouched.
func (c *conn) pipeStoreToClient() {
	defer close(c.s2cDone)
	defer c.closeBoth()
	defer c.s.recoverConn(c)
	if len(c.pendClient) > 0 {
		w, err := c.client.Write(c.pendClient)
		c.s.m.bytesS2C.Add(float64(w))
		c.pendClient = nil
		if err != nil {
			return
		}
	}
	rc, err := c.up.SyscallConn()
	if err != nil {
		return
	}
	for {
		bp, n, err := readPooled(rc)
		if n > 0 {
			w, werr := c.client.Write((*bp)[:n])
			c.s.m.bytesS2C.Add(float64(w))
			readBufs.Put(bp)
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (s *Server) recordViolation(c *conn, v *protocol.Violation, first []byte) {
	mode, action := "enforce", audit.ActionBlocked
	if c.st.monitor {
		mode, action = "monitor", audit.ActionWouldBlock
	}
	s.m.violations.WithLabelValues(string(v.Rule), mode).Inc()
	_, known := c.dec.Generation()
	e := audit.ViolationEvent(v, known, c.src, c.dst, action, audit.Mode(mode), first, c.bytesIn)
	e.Timestamp, e.ConnID = s.now(), c.id
	s.writeAudit(e)
	s.log.Debug("violation", "conn", c.id, "src", c.src.String(), "err", v.Error(), "mode", mode)
	if !c.st.monitor && s.gate.Violation(c.src.Addr()) {
		s.m.bans.Inc()
		b := s.event(c.src, c.dst, audit.ActionBanned, string(v.Rule))
		b.ConnID, b.Mode = c.id, audit.ModeEnforce
		s.writeAudit(b)
		s.log.Warn("source banned after repeated violations", "src", c.src.Addr().String(),
			"duration", c.st.cfg.Ban.Duration.String(), "last_rule", string(v.Rule))
	}
}

func (s *Server) refuse(src, dst netip.AddrPort, reason admission.Reason) {
	s.m.refused.WithLabelValues(string(reason)).Inc()
	e := s.event(src, dst, audit.ActionDenied, string(reason))
	s.writeAudit(e)
}

func (s *Server) event(src, dst netip.AddrPort, action audit.Action, reason string) audit.Event {
	return audit.Event{
		Timestamp: s.now(), Action: action, Reason: reason,
		SourceIP: src.Addr(), SourcePort: src.Port(), DestIP: dst.Addr(), DestPort: dst.Port(),
		CommunityID: audit.CommunityID(src.Addr(), src.Port(), dst.Addr(), dst.Port()),
	}
}

func (s *Server) writeAudit(e audit.Event) {
	if s.audit == nil {
		return
	}
	if err := s.audit.Write(e); err != nil {
		s.m.auditDropped.Inc()
		s.log.Error("audit write failed", "err", err)
	}
}
