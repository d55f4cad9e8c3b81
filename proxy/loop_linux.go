package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/internal/origdst"
	"github.com/storeguard/storeguard/internal/tcpcount"
	"github.com/storeguard/storeguard/tlsrelay"
	"golang.org/x/sys/unix"
)

// Event loops accept connections and forward them. When the store is on this host, the accepting
// loop connects to it at once and hands both sockets to a loop (in turn) before the client's first
// byte: the connection never has a goroutine of its own. Otherwise the connection starts with
// goroutines (serve reads and decodes the client while the store is dialled), and once the store
// is connected and the connection is between messages its sockets leave Go's poller for a loop.
// A loop waits on many connections with one epoll_wait, reads, decodes and writes without waking
// a goroutine per direction. Profiles showed those wake-ups (futex, scheduler, netpoll) cost more
// than the forwarding itself on a small host.
//
// A loop never blocks on one connection. Whatever would make it wait hands the connection back to
// goroutines, which then handle it as before for the rest of its life: a write the peer cannot
// take yet (the rest is kept and written first), or a partial message that needs budget the loop
// cannot get at once. Message deadlines (a timer per connection with a message in progress), ends
// of stream, errors and violations the loop handles itself, as the goroutines would.
type loop struct {
	s      *Server
	epfd   int
	wakeR  int // the loop's side of its wake-up pipe
	wakeW  int
	buf    []byte
	events []unix.EpollEvent
	conns  []*conn // indexed by file descriptor: each connection under both of its own
	done   chan struct{}

	lfd    int  // the listening socket it accepts from (a duplicate of its own), or -1
	paused bool // accepting paused after an error such as EMFILE: lfd is out of the epoll set

	mu       sync.Mutex // guards the requests below
	adopts   []*conn
	closes   []*conn
	due      []*conn // connections whose deadline timer fired
	listen   int     // a listening socket to accept from, or -1
	unlisten chan struct{}
	unpause  bool
	stop     bool
	woken    bool
	ended    bool // run returned and closed the descriptors: requests are dropped
}

// loopTransport writes to the store without waiting: what the store cannot take yet is kept in
// left for the goroutines the loop then hands the connection to (settle), as is the start of a
// message the budget cannot hold at once.
type loopTransport struct {
	lp          *loop       // the loop that owns the sockets while c.own is ownLoop; under c.mu
	clientEnded bool        // the client's end of stream reached the loop, which passed it on
	clientOut   bool        // the client's socket is out of the epoll set (clientDone), until registered again
	registered  bool        // in its loop's epoll set; only the loop reads and writes it
	timer       *time.Timer // the loop's message deadline timer, firing at timerAt
	timerAt     time.Time
	grace       *time.Timer // closes both sockets replyGrace after the client's end of stream
	cfd, ufd    int32       // the client's and the store's sockets while a loop has them, or detached
	// left: what the loop could not finish, for the goroutines it hands the connection to.
	left leftover
}

func (l *loopTransport) leftover() *leftover { return &l.left }

// send writes a, carry (the held start of a message) or empty, and b, the loop's read buffer. What the store does
// not take is left for the goroutines: the rest of a as it is, in the carry's own buffer and
// budget (pendCarry; never a copy, which would hold a large message twice outside the budget), and
// a copy of the rest of b, at most a read.
func (*loopTransport) send(c *conn, a, b []byte) bool {
	if len(a)+len(b) == 0 {
		return true
	}
	if c.lt.left.pendingUp() { // one judgement sends once: not expected, but bytes must keep their order
		c.lt.left.upTail = append(append(c.lt.left.upTail, a...), b...)
		return true
	}
	n := 0
	if c.lt.ufd >= 0 || c.connectStore(c.lt.lp) {
		var errno unix.Errno
		if len(a) == 0 {
			n, errno = writeFd(c.lt.ufd, b, nil)
		} else {
			n, errno = writeFd(c.lt.ufd, a, b)
		}
		c.wroteStore(n)
		if errno != 0 && errno != unix.EAGAIN {
			c.closeBoth()
			return false
		}
	} // else for goroutines to dial and write (handbackDial)
	if n < len(a) {
		c.lt.left.up, c.lt.left.upCarry = a[n:], len(a) > 0
		n = 0
	} else {
		n -= len(a)
	}
	if n < len(b) {
		c.lt.left.upTail = append([]byte(nil), b[n:]...)
	}
	return true
}

func (*loopTransport) reserve(c *conn, n int64, tail []byte) (ok, alive bool) {
	if c.s.buf.tryAcquire(c.src.Addr(), n, c.held) {
		return true, true
	}
	c.lt.left.tail = append([]byte(nil), tail...)
	return false, true
}

// stalled keeps rest for the goroutines the loop hands the connection to (settle): they wait.
func (*loopTransport) stalled(c *conn, rest []byte) (judge, alive bool) {
	c.lt.left.rest = append([]byte(nil), rest...)
	return false, true
}

// loops are a server's event loops; connections are spread over them in turn.
type loops struct {
	all     []*loop
	next    uint32
	mu      sync.Mutex
	inherit atomic.Int32 // whether accepted sockets inherit clientOptions: inheritUnknown, inherits, inheritsNot
}

func startLoops(s *Server, n int) (*loops, error) {
	ls := &loops{}
	for range n {
		l, err := newLoop(s)
		if err != nil {
			ls.stop()
			return nil, err
		}
		ls.all = append(ls.all, l)
		go l.run()
	}
	return ls, nil
}

// restart replaces the loops that ended (stop) with new ones; a loop that cannot start stays ended
// (its connections stay with goroutines).
func (ls *loops) restart(s *Server) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for i, l := range ls.all {
		select {
		case <-l.done:
		default:
			continue // still runs
		}
		nl, err := newLoop(s)
		if err != nil {
			s.log.Error("event loop cannot start again; its connections stay with goroutines", "err", err)
			continue
		}
		ls.all[i] = nl
		go nl.run()
	}
}

// each is the loops now (restart replaces ended ones).
func (ls *loops) each() []*loop {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return append([]*loop(nil), ls.all...)
}

// pick is the loop the next connection goes to.
func (ls *loops) pick() *loop {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.next++
	return ls.all[int(ls.next)%len(ls.all)]
}

// stop ends the loops, handing any connection they still forward back to its goroutines.
func (ls *loops) stop() {
	for _, l := range ls.each() {
		l.request(func() { l.stop = true }) // false: it ended already
		<-l.done
	}
}

func newLoop(s *Server) (*loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("event loop: epoll_create1: %w", err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("event loop: pipe2: %w", err)
	}
	l := &loop{s: s, epfd: epfd, wakeR: p[0], wakeW: p[1], buf: make([]byte, readSize),
		events: make([]unix.EpollEvent, 256), done: make(chan struct{}),
		lfd: -1, listen: -1}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(l.wakeR)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, l.wakeR, &ev); err != nil {
		l.closeFds()
		return nil, fmt.Errorf("event loop: epoll_ctl: %w", err)
	}
	return l, nil
}

func (l *loop) closeFds() {
	unix.Close(l.epfd)
	unix.Close(l.wakeR)
	unix.Close(l.wakeW)
	if l.lfd >= 0 {
		unix.Close(l.lfd)
		l.lfd = -1
	}
	if l.listen >= 0 { // asked for, never taken
		unix.Close(l.listen)
		l.listen = -1
	}
	if l.unlisten != nil {
		close(l.unlisten)
		l.unlisten = nil
	}
}

// request runs change under the loop's lock and wakes the loop to act on it. It reports false,
// and does nothing, once the loop has ended.
func (l *loop) request(change func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended { // a timer firing late, or a loop that failed
		return false
	}
	change()
	if !l.woken {
		l.woken = true
		unix.Write(l.wakeW, []byte{1}) // a full pipe already wakes the loop
	}
	return true
}

func (l *loop) adopt(c *conn) bool   { return l.request(func() { l.adopts = append(l.adopts, c) }) }
func (l *loop) requestClose(c *conn) { l.request(func() { l.closes = append(l.closes, c) }) }

// yieldEvery is how often a loop yields to Go's scheduler, busy or idle (epoll_wait wakes up that
// often). A goroutine that stays on its P for 10 ms, even in and out of system calls, is
// preempted with a signal and its P retaken, and each retake puts sysmon back to waking every 20 µs:
// measured under load without yields, 5,500 sysmon sleeps and 84 preemption signals a second.
const yieldEvery = 5 * time.Millisecond

func (l *loop) run() {
	defer close(l.done)
	defer func() {
		l.mu.Lock()
		l.ended = true
		l.closeFds()
		adopts := l.adopts // asked for after epoll_wait failed: never registered
		l.adopts = nil
		l.mu.Unlock()
		for _, c := range adopts {
			l.s.m.handbacks[handbackStop].Inc()
			c.leaveLoop()
		}
	}()
	lastYield := time.Now()
	for {
		n, err := epollWait(l.epfd, l.events, 0)
		if n == 0 && err == 0 {
			n, err = epollWait(l.epfd, l.events, int(yieldEvery/time.Millisecond))
		}
		if now := time.Now(); now.Sub(lastYield) >= yieldEvery {
			runtime.Gosched()
			lastYield = now
		}
		if err != 0 {
			if err == unix.EINTR {
				continue
			}
			l.s.log.Error("event loop: epoll_wait failed; handing its connections back", "err", err)
			l.releaseAll()
			return
		}
		for _, ev := range l.events[:n] {
			if ev.Fd == int32(l.wakeR) {
				if l.serveRequests() {
					return
				}
				continue
			}
			if ev.Fd == int32(l.lfd) && l.lfd >= 0 {
				l.acceptSome()
				continue
			}
			if c := l.conn(ev.Fd); c != nil {
				l.serveEvent(c, ev)
			}
		}
	}
}

// serveRequests adopts and closes what was asked; it reports whether the loop is to stop.
func (l *loop) serveRequests() (stop bool) {
	var b [64]byte
	for {
		if n, _ := unix.Read(l.wakeR, b[:]); n <= 0 {
			break
		}
	}
	l.mu.Lock()
	adopts, closes, due, stop := l.adopts, l.closes, l.due, l.stop
	listen, unlisten, unpause := l.listen, l.unlisten, l.unpause
	l.adopts, l.closes, l.due, l.woken = nil, nil, nil, false
	l.listen, l.unlisten, l.unpause = -1, nil, false
	l.mu.Unlock()
	if listen >= 0 {
		l.lfd = listen
		l.watchListener()
	}
	if unpause && l.paused && l.lfd >= 0 {
		l.paused = false
		l.watchListener()
	}
	if unlisten != nil {
		if l.lfd >= 0 {
			// Out of the epoll set first: closing is not enough, the socket lives on in lnFd
			// (and in a keeper) for an upgrade to hand over.
			unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, l.lfd, nil)
			unix.Close(l.lfd)
			l.lfd = -1
		}
		close(unlisten)
	}
	for _, c := range adopts {
		l.register(c)
	}
	for _, c := range due {
		if c.lt.registered {
			l.deadlineDue(c)
		}
	}
	for _, c := range closes {
		if c.lt.registered { // else the loop already let it go
			l.release(c, handbackNone)
		}
	}
	if stop {
		l.releaseAll()
	}
	return stop
}

// acceptFrom makes the loops accept from ln themselves, in place of Serve's accept loop. Each
// watches a duplicate of the listening socket (EPOLLEXCLUSIVE: one loop wakes per connection), and
// ln leaves Go's poller; the socket lives on through the duplicates until stopAccepting.
func (ls *loops) acceptFrom(ln *net.TCPListener) error {
	all := ls.each()
	fds := make([]int, 0, len(all))
	for range all {
		fd, err := dupFd(ln)
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			return err
		}
		fds = append(fds, int(fd))
	}
	if len(fds) > 0 {
		setClientOptions(fds[0]) // on the listening socket, which its duplicates share
	}
	for i, l := range all {
		fd := fds[i]
		if !l.request(func() { l.listen = fd }) {
			unix.Close(fd) // that loop ended; the others accept
		}
	}
	ln.Close()
	return nil
}

// stopAccepting has every loop close its listening socket, and returns once they all have.
func (ls *loops) stopAccepting() {
	for _, l := range ls.each() {
		done := make(chan struct{})
		if l.request(func() { l.unlisten = done }) {
			<-done
		}
	}
}

// watchListener adds the listening socket to the loop's epoll set.
func (l *loop) watchListener() {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(l.lfd)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, l.lfd, &ev); err != nil {
		l.s.log.Error("event loop: cannot watch the listening socket; this loop stops accepting", "err", err)
		unix.Close(l.lfd)
		l.lfd = -1
	}
}

// acceptBatch is the most connections a loop accepts before it serves its other events.
const acceptBatch = 16

// acceptSome accepts what the listening socket has, up to acceptBatch connections. An error such
// as EMFILE pauses accepting on this loop for acceptPause.
func (l *loop) acceptSome() {
	for range acceptBatch {
		fd, src, err := addrCall(unix.SYS_ACCEPT4, l.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		switch err {
		case 0:
			l.take(fd, src)
			continue
		case unix.EAGAIN:
			return
		case unix.EINTR, unix.ECONNABORTED:
			continue
		}
		l.s.acceptFailed(err)
		unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, l.lfd, nil)
		l.paused = true
		time.AfterFunc(acceptPause, func() { l.request(func() { l.unpause = true }) })
		return
	}
}

// take admits a connection the loop accepted. One it can connect to the store at once it forwards
// itself from the first byte; any other goes to goroutines, as from Serve's accept loop.
func (l *loop) take(fd int, src netip.AddrPort) {
	s := l.s
	s.handlers.Add(1)
	defer func() {
		if r := recover(); r != nil {
			s.panicked(r, nil)
		}
	}()
	local := src
	if _, lap, err := addrCall(unix.SYS_GETSOCKNAME, fd, 0); err == 0 {
		local = lap
	}
	dst := origdst.Fd(fd, local)
	release, reason := s.admit(src.Addr(), s.set.Load())
	if reason != "" {
		s.refuseFd(fd, src, dst, reason) // closes fd; the audit sink never waits (AuditSink)
		s.handlers.Done()
		return
	}
	s.loops.clientOptionsOf(fd)
	c := s.accepted(nil, src, dst, release)
	s.cont.kp.Opened(c.id, c.src, c.dst, fd)
	if c.loopable() {
		// Connections are spread over the loops in turn: EPOLLEXCLUSIVE wakes the same loop for
		// every connection while it waits.
		to := s.loops.pick()
		c.takenFromAccept(to, fd)
		s.track(c, true)
		if to == l {
			l.register(c)
			return
		}
		if to.adopt(c) {
			return
		}
		if c.retarget(l) { // that loop ended: this one takes the connection, unless it closed meanwhile
			l.register(c)
		}
		return
	}
	tc, err := attach(int32(fd))
	if err != nil {
		s.log.Warn("could not give an accepted connection to Go's poller; closing it", "err", err)
		c.gives.admission()
		s.cont.kp.Ended(c.id)
		s.m.active.Dec()
		s.handlers.Done()
		return
	}
	c.gr.client = tc
	s.track(c, true)
	go c.serve(nil)
}

func (l *loop) releaseAll() {
	for _, c := range l.conns {
		if c != nil && c.lt.registered { // each connection is there twice
			l.release(c, handbackStop)
		}
	}
}

func (l *loop) register(c *conn) {
	for _, fd := range [2]int32{c.lt.cfd, c.lt.ufd} {
		if fd >= 0 && !l.watch(fd, c) {
			l.s.log.Warn("event loop: epoll_ctl failed; the connection stays with its goroutines", "conn", c.id)
			unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, int(c.lt.cfd), nil)
			l.conns[c.lt.cfd] = nil
			c.leaveLoop()
			return
		}
	}
	c.lt.registered, c.lt.clientOut = true, false
	l.s.m.loopConns.Inc()
}

// watch adds fd, one of c's sockets, to the loop's epoll set.
func (l *loop) watch(fd int32, c *conn) bool {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: fd}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev); err != nil {
		return false
	}
	l.setConn(fd, c)
	return true
}

// conn is the connection fd belongs to, if the loop forwards it. (A slice: descriptors are small
// and dense, and a map's lookup was 1 % of the loop's time under load.)
func (l *loop) conn(fd int32) *conn {
	if uint32(fd) < uint32(len(l.conns)) {
		return l.conns[fd]
	}
	return nil
}

func (l *loop) setConn(fd int32, c *conn) {
	if int(fd) >= len(l.conns) {
		l.conns = append(l.conns, make([]*conn, max(int(fd)+1, 2*len(l.conns), 64)-len(l.conns))...)
	}
	l.conns[fd] = c
}

// release takes c out of the loop: to goroutines for the rest of its life (why says why), or, once
// closed (why is handbackNone), to end (leaveLoop).
func (l *loop) release(c *conn, why handback) {
	if c.lt.timer != nil {
		c.lt.timer.Stop()
		c.lt.timer, c.lt.timerAt = nil, time.Time{}
	}
	l.s.m.loopConns.Dec()
	if why != handbackNone {
		l.s.m.handbacks[why].Inc()
	} else if c.lt.grace != nil { // closed: the timer would hold the connection for replyGrace
		c.lt.grace.Stop()
		c.lt.grace = nil
	}
	for i, fd := range [2]int32{c.lt.cfd, c.lt.ufd} {
		if fd < 0 {
			continue
		}
		// Out of the epoll set even when closed next: a keeper may hold the socket too, and epoll
		// forgets a socket only once its last descriptor closes. (The client's may be out already:
		// clientDone.)
		if i == 1 || !c.lt.clientOut {
			unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, int(fd), nil)
		}
		l.conns[fd] = nil
	}
	c.lt.registered = false
	c.leaveLoop()
}

// serveEvent reads what one of c's sockets has and passes it on; anything but a plain read and
// complete writes hands c back to its goroutines.
func (l *loop) serveEvent(c *conn, ev unix.EpollEvent) {
	defer func() {
		if r := recover(); r != nil {
			l.s.panicked(r, c)
			if c.lt.registered { // else release itself panicked after letting c go
				l.release(c, handbackNone)
			}
		}
	}()
	if c.isClosed() {
		l.release(c, handbackNone)
		return
	}
	if ev.Fd == c.lt.cfd {
		l.serveClient(c)
		return
	}
	if n, peeked, ok := l.readStore(c); ok {
		l.replyEvent(c, n, peeked)
	}
}

// serveClient judges what the client has, one read of it (all of an End's records already
// read, which epoll will not announce again), as serveEvent does for the store's side; it stops
// when the client would block, or c leaves the loop.
func (l *loop) serveClient(c *conn) {
	for c.lt.registered {
		p, n, more, err := c.cl.loopRead(c.lt.cfd, l.buf)
		switch {
		case err == nil:
		case errors.Is(err, tlsrelay.ErrWouldBlock):
			return
		case errors.Is(err, io.EOF):
			c.flow.ended(endedByClient)
			l.clientDone(c)
			return
		default:
			c.flow.ended(endedByClient)
			l.s.log.Debug("connection ended by an error", "conn", c.id, "side", "client", "err", err.Error(),
				"bytes_in", c.g.Bytes())
			c.closeBoth()
			l.release(c, handbackNone)
			return
		}
		if len(p) > 0 || more { // an End's record may open to nothing
			c.readClient(p)
			alive := c.process(p)
			c.cl.loopPassed(c.lt.cfd, n, len(c.carry), c.lt.left.unfinished()) // before settle, which may hand c to goroutines
			l.settle(c, alive)
		}
		if !more {
			return
		}
	}
}

// readStore reads what the store's socket has into l.buf (client.loopReadReply): n bytes, peeked
// or not, and true; or false when there is nothing yet, or an end of stream or an error, which it
// handles.
func (l *loop) readStore(c *conn) (n int, peeked, ok bool) {
	n, peeked, errno := c.cl.loopReadReply(c.lt.ufd, l.buf)
	switch {
	case n > 0:
		return n, peeked, true
	case errno == unix.EAGAIN:
		return 0, false, false
	}
	c.flow.ended(endedByStore)
	if errno != 0 || !c.lt.clientEnded {
		l.s.log.Debug("connection ended by an error or by the store", "conn", c.id, "side", "store",
			"errno", int(errno), "bytes_in", c.g.Bytes())
	}
	c.closeBoth()
	l.release(c, handbackNone)
	return 0, false, false
}

// replyEvent passes the store's n bytes in l.buf on to the client: what the client cannot take
// yet (a TLS End's, what it could not seal into records written whole) waits in leftover, and the
// connection goes to its goroutines (backpressure). Bytes peeked from the store's socket are
// consumed once passed on or kept.
func (l *loop) replyEvent(c *conn, n int, peeked bool) {
	c.rep.follow(l.buf[:n])
	w, errno := c.cl.loopWrite(c.lt.cfd, l.buf[:n])
	c.s.m.bytesS2C.Add(float64(w))
	if peeked { // what the client did not take is kept below, or the connection closes
		tcpcount.Discard(int(c.lt.ufd), uint64(n))
	}
	switch {
	case w == n:
	case errno == 0 || errno == unix.EAGAIN:
		bp := readBufs.Get().(*[]byte)
		c.lt.left.client = chunk{buf: bp, to: copy(*bp, l.buf[w:n])}
		l.release(c, handbackBackpressure)
	default:
		c.closeBoth()
		l.release(c, handbackNone)
	}
}

// settle keeps c in the loop after the guard's decision was carried out, or lets it go: closed
// (alive false), or to goroutines when the store could not take all of it or the budget could
// not hold the start of a message at once. Otherwise it arms c's deadline timer.
func (l *loop) settle(c *conn, alive bool) {
	switch {
	case !alive:
		l.release(c, handbackNone)
	case c.lt.left.pendingUp() && c.lt.ufd < 0:
		l.release(c, handbackDial)
	case c.lt.left.pendingUp():
		l.release(c, handbackBackpressure)
	case c.lt.left.tail != nil:
		l.release(c, handbackPartial)
	case c.lt.left.rest != nil:
		l.release(c, handbackAwaiting)
	default:
		l.watchDeadline(c)
	}
}

// watchDeadline arms c's timer when a message in progress has a deadline (timeouts.message). The
// timer only asks the loop to look: deadlineDue decides on the connection's state then.
func (l *loop) watchDeadline(c *conn) {
	dl := c.g.Deadline()
	if dl.IsZero() || (!c.lt.timerAt.IsZero() && !c.lt.timerAt.After(dl)) {
		return // none, or the timer fires by then already
	}
	c.lt.timerAt = dl
	d := dl.Sub(c.s.now())
	if c.lt.timer == nil {
		c.lt.timer = time.AfterFunc(d, func() { l.request(func() { l.due = append(l.due, c) }) })
		return
	}
	c.lt.timer.Reset(d)
}

// deadlineDue is c's timer firing: the guard judges a deadline that has passed; one still ahead
// (the message in progress began later) re-arms the timer.
func (l *loop) deadlineDue(c *conn) {
	c.lt.timerAt = time.Time{}
	if next := c.g.Deadline(); next.IsZero() || c.s.now().Before(next) {
		l.watchDeadline(c)
		return
	}
	l.settle(c, c.expired())
}

// clientDone handles the client's end of stream as the goroutines would: the half-close goes on
// to the store (a partial message is dropped, never forwarded) and the store's last replies still
// reach the client, for at most replyGrace; the store's own close then ends the connection.
func (l *loop) clientDone(c *conn) {
	if c.lt.ufd < 0 { // the store was never connected: nothing to pass on
		c.closeBoth()
		l.release(c, handbackNone)
		return
	}
	c.lt.clientEnded, c.lt.clientOut = true, true
	unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, int(c.lt.cfd), nil)
	unix.Shutdown(int(c.lt.ufd), unix.SHUT_WR)
	c.lt.grace = time.AfterFunc(c.s.replyGrace, c.closeBoth)
}
