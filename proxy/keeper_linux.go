package proxy

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/storeguard/storeguard/guard"
	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/keeper"
	"github.com/storeguard/storeguard/protocol"
)

// A worker's link to its keeper (package keeper): every socket it accepts or connects to the store
// goes to the keeper as a duplicate, and every end is said, so that the keeper holds what a crash
// would otherwise close. The link never makes forwarding wait: packets queue here and one goroutine
// sends them. A keeper that stops reading costs memory for the queue, not forwarding.

type keeperLink struct {
	s       *Server
	c       *fdpass.Conn
	mu      sync.Mutex
	cond    *sync.Cond
	q       []kpacket
	busy    bool
	failed  everySecond
	flushed chan struct{} // f: the keeper read everything sent before F
	killed  chan struct{} // k: the worker started for an upgrade is gone
}

type kpacket struct {
	kind byte
	v    any
	fds  []int // duplicates, closed once sent
}

// UseKeeper links the server to the keeper at the other end of f (keeper.Env).
func (s *Server) UseKeeper(f *os.File) error {
	c, err := fdpass.New(f)
	if err != nil {
		return err
	}
	k := &keeperLink{s: s, c: c, flushed: make(chan struct{}, 1), killed: make(chan struct{}, 1)}
	k.cond = sync.NewCond(&k.mu)
	s.kp = k
	go k.sendLoop()
	return nil
}

func (k *keeperLink) post(kind byte, v any, fds ...int) {
	k.mu.Lock()
	k.q = append(k.q, kpacket{kind: kind, v: v, fds: fds})
	k.cond.Signal()
	k.mu.Unlock()
}

func (k *keeperLink) sendLoop() {
	for {
		k.mu.Lock()
		for len(k.q) == 0 {
			k.busy = false
			k.cond.Wait()
		}
		batch := k.q
		k.q, k.busy = nil, true
		k.mu.Unlock()
		for len(batch) > 0 {
			n := k.sendSome(batch)
			batch = batch[n:]
		}
	}
}

// maxBatch bounds an M packet: its descriptors within SCM_MAX_FD (253), its body within a packet.
const maxBatch = 200

// sendSome sends the first packets of batch, as one M packet when they are connection changes
// (O, U, D), and returns how many it sent.
func (k *keeperLink) sendSome(batch []kpacket) int {
	n := 0
	for n < len(batch) && n < maxBatch && isChange(batch[n].kind) {
		n++
	}
	if n <= 1 {
		p := batch[0]
		k.sendOne(p.kind, p.v, p.fds)
		return 1
	}
	changes := make([]keeper.Change, n)
	var fds []int
	for i, p := range batch[:n] {
		changes[i] = keeper.Change{Kind: p.kind, Conn: p.v.(keeper.Conn)}
		fds = append(fds, p.fds...)
	}
	k.sendOne('M', changes, fds)
	return n
}

func isChange(kind byte) bool { return kind == 'O' || kind == 'U' || kind == 'D' }

func (k *keeperLink) sendOne(kind byte, v any, fds []int) {
	err := k.c.Send(kind, v, fds...)
	fdpass.CloseFds(fds)
	if err != nil && k.failed.allow(time.Now()) {
		k.s.log.Error("keeper link: a packet was lost; a crash now may cost its connections (logged at most once a second)",
			"err", err)
	}
}

// readLoop serves the keeper's requests: H (hand over to a new worker), N (an upgrade the keeper
// could not start), f and k (answers).
func (k *keeperLink) readLoop() {
	for {
		kind, body, fds, err := k.c.Recv(0)
		if err != nil {
			k.s.log.Error("keeper link: the keeper is gone; serving on, but a crash now closes every connection", "err", err)
			return
		}
		switch kind {
		case 'H':
			if len(fds) != 1 {
				fdpass.CloseFds(fds)
				continue
			}
			go k.s.handOverForKeeper(os.NewFile(uintptr(fds[0]), "handover"))
			continue
		case 'N': // the keeper could not start the upgrade it was asked for
			var why string
			json.Unmarshal(body, &why)
			k.s.log.Error("upgrade failed; this process goes on serving", "err", why)
			k.s.failed(errors.New(why))
		case 'f':
			signal(k.flushed)
		case 'k':
			signal(k.killed)
		}
		fdpass.CloseFds(fds)
	}
}

// sync returns once the keeper has read every packet posted before, or after timeout.
func (k *keeperLink) sync(timeout time.Duration) bool {
	select { // a stale answer
	case <-k.flushed:
	default:
	}
	k.post('F', nil)
	select {
	case <-k.flushed:
		return true
	case <-time.After(timeout):
		return false
	}
}

// dupOf duplicates a socket's descriptor for the keeper; -1 when it cannot.
func dupOf(fd int) int {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return nfd
}

// opened gives the keeper a new connection's client socket (fd, or tc's).
func (k *keeperLink) opened(c *conn, fd int, tc *net.TCPConn) {
	if k == nil {
		return
	}
	k.give('O', keeper.Conn{ID: c.id, Src: c.src, Dst: c.dst}, fd, tc)
}

// connected gives the keeper a connection's store socket.
func (k *keeperLink) connected(c *conn, fd int, tc *net.TCPConn) {
	if k == nil {
		return
	}
	k.give('U', keeper.Conn{ID: c.id}, fd, tc)
}

func (k *keeperLink) give(kind byte, v keeper.Conn, fd int, tc *net.TCPConn) {
	if tc != nil {
		d, err := dupFd(tc)
		if err != nil {
			d = -1
		}
		fd = int(d)
	} else {
		fd = dupOf(fd)
	}
	if fd < 0 {
		if k.failed.allow(time.Now()) {
			k.s.log.Error("keeper link: cannot duplicate a socket (out of descriptors?); a crash now closes that connection")
		}
		return
	}
	k.post(kind, v, fd)
}

// ended tells the keeper a connection ended: it closes its copies.
func (k *keeperLink) ended(c *conn) {
	if k == nil {
		return
	}
	k.post('D', keeper.Conn{ID: c.id})
}

// KeeperListeners gives the keeper the listening sockets, and says the worker took over when it was
// started for an upgrade (TakeOver): call it once the server has its listeners.
func (s *Server) KeeperListeners(tookOver bool) {
	k := s.kp
	if k == nil {
		return
	}
	if tookOver {
		k.post('T', nil)
	}
	ln := keeper.Listeners{Listen: s.ln.Addr().String()}
	fds := []int{dupOf(s.lnFd)}
	if s.metricsFd >= 0 {
		ln.MetricsListen = s.metricsLn.Addr().String()
		fds = append(fds, dupOf(s.metricsFd))
	}
	k.post('L', ln, fds...)
	go k.readLoop()
}

// AskUpgrade asks the keeper for an upgrade in place; false when there is no keeper.
func (s *Server) AskUpgrade() bool {
	if s.kp == nil {
		return false
	}
	s.kp.post('P', nil)
	return true
}

// handOverForKeeper hands over to the worker the keeper started for an upgrade.
func (s *Server) handOverForKeeper(peer *os.File) {
	defer peer.Close()
	n, err := s.HandOver(peer, nil)
	if err == nil {
		s.log.Info("upgrade: the new worker serves; exiting", "connections", n)
		return
	}
	var pe *peerError
	if errors.As(err, &pe) {
		select {
		case <-s.kp.killed:
		default:
		}
		s.kp.post('K', nil)
		select {
		case <-s.kp.killed:
		case <-time.After(10 * time.Second):
			s.log.Error("upgrade: the keeper did not stop the new worker in time; going on")
		}
	}
	Thaw(err)
	s.log.Error("upgrade failed; this process goes on serving", "err", err)
	if !errors.Is(err, ErrUpgrading) {
		s.failed(err)
	}
}

// RestoreFromKeeper takes everything the keeper holds, in place of Listen, after the previous
// worker died: the listening sockets and every connection, each rebuilt between messages.
func (s *Server) RestoreFromKeeper() error {
	k := s.kp
	k.post('Q', nil)
	var ln keeper.Listeners
	fds, err := k.c.Expect('S', ackTimeout, &ln)
	if err != nil {
		return err
	}
	a := &adoption{reason: "restart"}
	if err := s.takeListeners(serverState{Listen: ln.Listen, MetricsListen: ln.MetricsListen}, fds, a); err != nil {
		return err
	}
	s.nextID.Store(ln.NextID)
	for {
		kind, body, fds, err := k.c.Recv(ackTimeout)
		if err != nil {
			return err
		}
		if kind == 'E' {
			break
		}
		var kc keeper.Conn
		if kind != 'C' || json.Unmarshal(body, &kc) != nil || len(fds) < 1 || (kc.HasUp != (len(fds) == 2)) {
			fdpass.CloseFds(fds)
			s.log.Warn("keeper: a connection could not be restored", "packet", string(kind))
			continue
		}
		ac := &adoptedConn{cfd: fds[0], ufd: -1, rebuild: true}
		if kc.HasUp {
			ac.ufd = fds[1]
		}
		ac.c = s.newConn(kc.ID, kc.Src, kc.Dst, s.now())
		a.conns = append(a.conns, ac)
	}
	s.adopted = a
	return nil
}

// rebuild readies the guard of a connection restored after a crash: between messages, its
// store's generation, and past its first message when its store was connected (the first valid
// message connects it: VALIDATE for 2.2+ stores). A message that was half-received when the
// worker died is lost with it (docs/design.md).
func (s *Server) rebuild(ac *adoptedConn) bool {
	c := ac.c
	dc := c.st.dec
	if dc.Gen.Auto {
		info, ok := s.store.Await(c.st.cfg.Timeouts.UpstreamDial, s.drainEnd)
		if !ok {
			return false
		}
		dc = c.st.decoderFor(info)
	}
	if ac.ufd < 0 {
		c.resetGuard(dc)
		return true
	}
	c.g.Restore(guard.StreamState{Start: c.start, Talked: true,
		Decoder: protocol.DecoderState{Config: dc, Gen: dc.Gen.Gen, Validated: true, Index: 1}}, &c.st.pol)
	c.attachGuard()
	return true
}
