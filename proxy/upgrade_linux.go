package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/guard"
	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/internal/version"
	"github.com/storeguard/storeguard/keeper"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/storeinfo"
)

// Upgrade in place. The serving process (old) and the one taking over (new) talk over a
// SOCK_SEQPACKET socket pair; descriptors go with SCM_RIGHTS. In order:
//
//	new → old  R  ready: the new process loaded its configuration
//	old        freezes every connection (freeze.go); on failure it thaws and says X
//	old → new  S  the server's state, with the listening sockets
//	old → new  C  one connection's state, with its client's and (if connected) store's socket,
//	           then B packets carrying its bytes: the message in progress and what was not judged
//	           yet (refed to the new guard), for the store, for the client
//	old → new  E  the end, with the count
//	new → old  A  acknowledged: everything was taken
//	old → new  G  go: the old process forwards nothing more and exits
//
// The new process forwards nothing before G: until then the old one may still thaw. If the new
// process fails before A (or the old one waits for A in vain: it then kills the new one first),
// the old one thaws and goes on serving. Once it has sent G it exits.

const (
	readyTimeout = 60 * time.Second // for the new process to load its configuration and say R
	ackTimeout   = 60 * time.Second
)

// ready is the new process's R.
type ready struct {
	PID     int
	Version string
}

// serverState is the S packet: what the whole server carries over.
type serverState struct {
	PID           int
	Version       string
	Listen        string // the listening socket's address (the first descriptor)
	MetricsListen string // the metrics listener's, if any (the second)
	NextID        uint64
	StoreKnown    bool
	Store         storeinfo.Info
	Sources       []admission.SourceState
	Handovers     uint64 // hand-overs before this one
	Conns         int
	Frozen        time.Time // when the old process stopped forwarding (handover_frozen_seconds)
}

// connState is a C packet: one connection, its descriptors (client, then store if connected) and
// the lengths of the blobs that follow.
type connState struct {
	ID         uint64
	Src, Dst   netip.AddrPort
	Start      time.Time
	Guard      guard.StreamState
	Replies    protocol.RepliesState
	HasUp      bool
	ReadEnded  bool // the client's end of stream was passed on; the store's last replies are awaited
	UpDeadline time.Time
	Refeed     int // the message in progress and unjudged bytes: fed to the guard again
	// Held is the budget the message in progress held (its carry's capacity), taken again at
	// once by the new process: a connection that had its budget keeps it, and one that waited
	// for budget waits again, behind it.
	Held     int64
	ToStore  int // judged, for the store
	ToClient int // the store's replies the client has not taken
	Flow     flowCarry
}

// HandOver hands everything to the process at the other end of peer, which was started to take
// over (HandoverEnv), and returns nil once that process has it all: Serve then returns and the
// caller exits. exited, if not nil, reports the new process's end. On an error nothing was
// handed over and the server goes on serving; the caller must make sure the new process is gone
// (errKillPeer says it may have taken connections).
func (s *Server) HandOver(peer *os.File, exited <-chan struct{}) (n int, err error) {
	select {
	case <-s.serving:
	default:
		return 0, errors.New("not serving yet")
	}
	if !s.upgradeMu.TryLock() {
		return 0, ErrUpgrading
	}
	defer s.upgradeMu.Unlock()
	h, err := fdpass.New(peer)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	if err := h.SetSendTimeout(ackTimeout); err != nil { // a new process that stops reading fails the hand-over
		return 0, err
	}
	var r ready
	if err := s.await(exited, func() error { _, err := h.Expect('R', readyTimeout, &r); return err }); err != nil {
		return 0, fmt.Errorf("the new process did not get ready: %w", err)
	}
	s.log.Info("upgrade: the new process is ready; freezing connections", "pid", r.PID, "version", r.Version)
	start := time.Now()
	conns, err := s.freeze(s.freezeTimeout, func() bool { return peerGone(exited, h) })
	if err != nil {
		h.Send('X', err.Error())
		s.thaw(conns)
		s.m.handovers.WithLabelValues("failed").Inc()
		s.log.Warn("upgrade: thawed", "held", time.Since(start).String())
		return 0, err
	}
	if err = s.sendAll(h, conns, start); err == nil {
		err = s.await(exited, func() error {
			var taken int
			if _, err := h.Expect('A', ackTimeout, &taken); err != nil {
				return err
			}
			if taken != len(conns) {
				return fmt.Errorf("the new process took %d of %d connections", taken, len(conns))
			}
			return nil
		})
	}
	if err != nil {
		s.m.handovers.WithLabelValues("failed").Inc()
		return 0, &peerError{err: err, thaw: func() { s.thaw(conns) }}
	}
	if s.kp != nil && !s.kp.sync(2*time.Second) { // the keeper knows every connection before the new worker goes on
		s.log.Warn("upgrade: the keeper did not confirm it read every connection in time")
	}
	if err := h.Send('G', nil); err != nil {
		s.log.Warn("upgrade: could not say go; the new process goes on when this one exits", "err", err)
	}
	s.log.Info("upgrade: handed over", "connections", len(conns), "to_pid", r.PID,
		"frozen", time.Since(start).String())
	for _, fd := range []*int{&s.lnFd, &s.metricsFd} { // the new process has its own (the keeper too)
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	s.handOnce.Do(func() { close(s.handedOver) })
	return len(conns), nil
}

// ErrUpgrading: an upgrade was asked for while one is under way; that one's outcome stands.
var ErrUpgrading = errors.New("an upgrade is under way already")

// peerGone reports whether the new process has ended, or closed its end of the hand-over socket:
// a freeze for it is over at once.
func peerGone(exited <-chan struct{}, h *fdpass.Conn) bool {
	select {
	case <-exited: // nil: not known here (a keeper's worker)
		return true
	default:
	}
	return h.Hungup()
}

// peerError is a hand-over that failed after the new process may have taken connections: the
// caller stops that process (Stop) before the server thaws (Thaw), so that no connection is
// forwarded by both.
type peerError struct {
	err  error
	thaw func()
}

func (e *peerError) Error() string { return e.err.Error() }
func (e *peerError) Unwrap() error { return e.err }

// Thaw goes on serving after a failed hand-over, once the new process is gone. Errors that are not
// a peerError were thawed already.
func Thaw(err error) {
	var pe *peerError
	if errors.As(err, &pe) {
		pe.thaw()
	}
}

// await runs f, giving up when the new process exits first.
func (s *Server) await(exited <-chan struct{}, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-exited:
		return errors.New("the new process exited")
	}
}

// sendAll sends the server's state and every connection, frozen since frozen.
func (s *Server) sendAll(h *fdpass.Conn, conns []*conn, frozen time.Time) error {
	st := serverState{PID: os.Getpid(), Version: version.String(), Listen: s.ln.Addr().String(),
		NextID: s.nextID.Load(), Sources: s.gate.State(), Handovers: s.handovers.Load(), Conns: len(conns),
		Frozen: frozen}
	st.Store, st.StoreKnown = s.store.Get()
	fds := []int{s.lnFd}
	if s.metricsFd >= 0 {
		st.MetricsListen = s.metricsLn.Addr().String()
		fds = append(fds, s.metricsFd)
	}
	if err := h.Send('S', st, fds...); err != nil {
		return err
	}
	for _, c := range conns {
		if err := c.sendState(h); err != nil {
			return fmt.Errorf("connection %d: %w", c.id, err)
		}
	}
	return h.Send('E', len(conns))
}

// sendState sends a frozen connection: its state, sockets and bytes.
func (c *conn) sendState(h *fdpass.Conn) error {
	gs, err := c.g.State()
	if err != nil {
		return err
	}
	c.rep.mu.Lock()
	rs := c.rep.track.State()
	var toClient []byte
	if p := c.left.client; p.buf != nil {
		toClient = append(toClient, (*p.buf)[p.from:p.to]...)
	}
	for _, ch := range c.rep.queue {
		toClient = append(toClient, (*ch.buf)[ch.from:ch.to]...)
	}
	c.rep.mu.Unlock()
	refeed := append(append([]byte(nil), c.carry...), c.left.tail...)
	refeed = append(refeed, c.left.rest...)
	toStore := append(append([]byte(nil), c.left.up...), c.left.upTail...)
	c.mu.Lock()
	cs := connState{ID: c.id, Src: c.src, Dst: c.dst, Start: c.start, Guard: gs, Replies: rs, HasUp: c.gr.up != nil,
		ReadEnded: c.gr.readEnded, UpDeadline: c.gr.upDeadline, Refeed: len(refeed), Held: c.held, ToStore: len(toStore),
		ToClient: len(toClient), Flow: c.flowCarry()}
	client, up := c.gr.client, c.gr.up
	c.mu.Unlock()
	var fds []int
	for _, tc := range []*net.TCPConn{client, up} {
		if tc == nil {
			continue
		}
		rc, err := tc.SyscallConn()
		if err != nil {
			return err
		}
		rc.Control(func(fd uintptr) { fds = append(fds, int(fd)) })
	}
	if len(fds) == 0 {
		return errors.New("no socket")
	}
	if err := h.Send('C', cs, fds...); err != nil {
		return err
	}
	for _, b := range [][]byte{refeed, toStore, toClient} {
		if err := h.SendBlob(b); err != nil {
			return err
		}
	}
	return nil
}

// adoption is what a previous process handed over, taken before Serve and started by it.
type adoption struct {
	reason string // upgrade, or restart (a keeper's, after the forwarding process died)
	from   serverState
	conns  []*adoptedConn
	ln     net.Listener // the old listening socket when the new configuration listens elsewhere
}

type adoptedConn struct {
	rebuild                   bool // restored by a keeper after a crash: no state but the sockets
	c                         *conn
	cfd, ufd                  int
	refeed, toStore, toClient []byte
	held                      int64 // connState.Held
}

// TakeOver takes everything over from the serving process at the other end of peer, in place of
// Listen: the listening sockets, the server's state and every connection. Serve then starts them.
// It returns once the old process said go (or is gone); on an error the old process goes on
// serving, and this one must exit.
func (s *Server) TakeOver(peer *os.File) error {
	h, err := fdpass.New(peer)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.Send('R', ready{PID: os.Getpid(), Version: version.String()}); err != nil {
		return err
	}
	var st serverState
	fds, err := h.Expect('S', ackTimeout, &st)
	if err != nil {
		return err
	}
	a := &adoption{reason: "upgrade", from: st}
	if err := s.takeListeners(st, fds, a); err != nil {
		h.Send('X', err.Error())
		return err
	}
	s.nextID.Store(st.NextID)
	s.gate.Restore(st.Sources)
	if st.StoreKnown {
		s.store.Adopt(st.Store)
	}
	s.handovers.Store(st.Handovers)
	for {
		kind, body, fds, err := h.Recv(ackTimeout)
		if err != nil {
			a.abandon()
			return err
		}
		if kind == 'E' {
			break
		}
		ac, err := s.takeConn(h, kind, body, fds)
		if err != nil {
			a.abandon()
			h.Send('X', err.Error())
			return err
		}
		a.conns = append(a.conns, ac)
	}
	if err := h.Send('A', len(a.conns)); err != nil {
		a.abandon()
		return err
	}
	// G, or the old process's end: either way it forwards nothing more.
	h.Recv(ackTimeout)
	s.adopted = a
	return nil
}

// takeListeners adopts the listening sockets, or listens anew where the configuration says
// otherwise (a restart for a new listen address): the old socket then keeps accepting until its
// backlog is empty (startAdopted) and closes.
func (s *Server) takeListeners(st serverState, fds []int, a *adoption) error {
	if len(fds) == 0 {
		return errors.New("handover: no listening socket")
	}
	c := s.set.Load().cfg
	old, err := listenerFromFd(fds[0])
	unix.Close(fds[0])
	if err != nil {
		fdpass.CloseFds(fds[1:])
		return fmt.Errorf("handover: listening socket: %w", err)
	}
	if listensAt(c.Listen, old) {
		s.ln = old
	} else {
		if s.ln, err = net.Listen("tcp", c.Listen); err != nil {
			old.Close()
			fdpass.CloseFds(fds[1:])
			return fmt.Errorf("listen: %w", err)
		}
		a.ln = old
	}
	if len(fds) > 1 {
		mln, err := listenerFromFd(fds[1])
		unix.Close(fds[1])
		switch {
		case err != nil:
			return fmt.Errorf("handover: metrics listener: %w", err)
		case c.MetricsListen == "":
			mln.Close()
		case listensAt(c.MetricsListen, mln):
			s.metricsLn = mln
		default:
			mln.Close()
		}
	}
	if s.metricsLn == nil && c.MetricsListen != "" {
		if s.metricsLn, err = net.Listen("tcp", c.MetricsListen); err != nil {
			return fmt.Errorf("metrics-listen: %w", err)
		}
	}
	return s.keepListenerFds()
}

// listensAt reports whether a listen address from the configuration names the socket ln: the
// same port, and the same address or an unspecified one on either side (":29499" is "[::]:29499").
// A name is resolved.
func listensAt(addr string, ln net.Listener) bool {
	if addr == "" || addr == ln.Addr().String() {
		return true
	}
	want, err := net.ResolveTCPAddr("tcp", addr)
	have, ok := ln.Addr().(*net.TCPAddr)
	if err != nil || !ok || want.Port != have.Port {
		return false
	}
	anyIP := func(ip net.IP) bool { return ip == nil || ip.IsUnspecified() }
	return (anyIP(want.IP) && anyIP(have.IP)) || want.IP.Equal(have.IP)
}

// takeConn reads one connection (a C packet and its bytes) and readies it, not started.
func (s *Server) takeConn(h *fdpass.Conn, kind byte, body []byte, fds []int) (*adoptedConn, error) {
	var cs connState
	if kind != 'C' {
		fdpass.CloseFds(fds)
		return nil, fmt.Errorf("handover: expected a connection, got a %c packet", kind)
	}
	if err := json.Unmarshal(body, &cs); err != nil {
		fdpass.CloseFds(fds)
		return nil, fmt.Errorf("handover: connection: %w", err)
	}
	want := 1
	if cs.HasUp {
		want = 2
	}
	if len(fds) != want {
		fdpass.CloseFds(fds)
		return nil, fmt.Errorf("handover: connection %d came with %d sockets, not %d", cs.ID, len(fds), want)
	}
	ac := &adoptedConn{cfd: fds[0], ufd: -1, held: cs.Held}
	if cs.HasUp {
		ac.ufd = fds[1]
	}
	var err error
	if ac.refeed, err = h.ReadBlob(cs.Refeed, ackTimeout); err == nil {
		if ac.toStore, err = h.ReadBlob(cs.ToStore, ackTimeout); err == nil {
			ac.toClient, err = h.ReadBlob(cs.ToClient, ackTimeout)
		}
	}
	if err != nil {
		fdpass.CloseFds(fds)
		return nil, err
	}
	st := s.set.Load()
	c := s.newConn(cs.ID, cs.Src, cs.Dst, cs.Start)
	c.gr.readEnded, c.gr.upDeadline = cs.ReadEnded, cs.UpDeadline
	if err := c.rep.track.Restore(cs.Replies); err != nil {
		s.log.Warn("handover: a connection's replies could not be followed on; counting afresh", "conn", c.id, "err", err)
	}
	c.g.Restore(cs.Guard, &st.pol)
	c.attachGuard()
	c.restoreFlow(&cs.Flow)
	ac.c = c
	return ac, nil
}

// abandon closes what was taken before a failed hand-over (the old process still has it all).
func (a *adoption) abandon() {
	for _, ac := range a.conns {
		unix.Close(ac.cfd)
		if ac.ufd >= 0 {
			unix.Close(ac.ufd)
		}
	}
}

// startAdopted starts the connections a previous process handed over (TakeOver), each where it
// stood, and records the hand-over.
func (s *Server) startAdopted() {
	a := s.adopted
	if a == nil {
		return
	}
	s.adopted = nil
	for _, ac := range a.conns {
		if ac.rebuild && !s.rebuild(ac) {
			s.log.Warn("restart: the store's generation is not known; closing a restored connection", "conn", ac.c.id)
			s.kp.ended(ac.c)
			unix.Close(ac.cfd)
			if ac.ufd >= 0 {
				unix.Close(ac.ufd)
			}
			continue
		}
		s.startConn(ac)
	}
	if a.reason != "restart" { // a restart knows nothing of the hand-overs before
		s.handovers.Add(1)
		s.m.handovers.WithLabelValues("ok").Add(float64(s.handovers.Load()))
	}
	s.m.handoverConns.Set(float64(len(a.conns)))
	if !a.from.Frozen.IsZero() {
		s.m.handoverFrozen.Set(time.Since(a.from.Frozen).Seconds())
	}
	moved := uint64(len(a.conns))
	e := audit.Event{Timestamp: s.now(), Action: audit.ActionHandover, Reason: a.reason,
		Connections: &moved, Mode: audit.Mode(s.set.Load().cfg.Mode)}
	if ap, err := netip.ParseAddrPort(s.ln.Addr().String()); err == nil {
		e.DestIP, e.DestPort = ap.Addr().Unmap(), ap.Port()
	}
	s.writeAudit(e)
	if a.reason == "restart" {
		s.log.Info("restart: took every connection back from the keeper", "connections", len(a.conns))
	} else {
		s.log.Info("upgrade: handover complete", "connections", len(a.conns), "from_pid", a.from.PID,
			"from_version", a.from.Version, "handovers", s.handovers.Load())
	}
	if a.ln != nil {
		go s.acceptBacklog(a.ln)
	}
}

// startConn starts one adopted connection: on an event loop when it stood between messages with
// nothing left to write, else on goroutines, which first write what was left and judge again the
// bytes that were not judged through.
func (s *Server) startConn(ac *adoptedConn) {
	c := ac.c
	c.release = s.gate.Adopt(c.src.Addr())
	if c.g.Talked() {
		c.untalk = s.markTalker(c.src.Addr())
	}
	if ac.ufd >= 0 {
		c.storeSlot = s.slots.Adopt(c.src.Addr())
		c.dial.done = true
		close(c.dial.ready)
	}
	s.m.active.Inc()
	s.handlers.Add(1)
	s.track(c, true)
	left := leftover{replies: ac.toClient}
	if len(ac.toStore) > 0 {
		left.up = ac.toStore
	}
	if len(ac.refeed) > 0 {
		left.rest = ac.refeed
		if held := min(ac.held, int64(c.g.Limits().MaxMessageBytes)); held > 0 {
			c.s.buf.adopt(c.src.Addr(), held) // the message in progress keeps its budget, as before
			c.carry, c.held = make([]byte, 0, held), held
		}
	}
	c.startAdopted(ac.cfd, ac.ufd, left)
}

// acceptBacklog accepts what waits on the old listening socket after a restart for a new listen
// address, then closes it.
func (s *Server) acceptBacklog(ln net.Listener) {
	tl := ln.(*net.TCPListener)
	defer tl.Close()
	tl.SetDeadline(time.Now().Add(time.Second))
	for {
		c, err := tl.Accept()
		if err != nil {
			return
		}
		s.handlers.Add(1)
		s.accepting.Add(1)
		go s.handle(c.(*net.TCPConn))
	}
}

// keepListenerFds keeps a descriptor of each listening socket for an upgrade to hand over (the
// event loops close the listener they accept from).
func (s *Server) keepListenerFds() error {
	fd, err := dupFd(s.ln.(*net.TCPListener))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s.lnFd = int(fd)
	if s.metricsLn != nil {
		if fd, err = dupFd(s.metricsLn.(*net.TCPListener)); err != nil {
			return fmt.Errorf("metrics-listen: %w", err)
		}
		s.metricsFd = int(fd)
	}
	return nil
}

// closeKeptFds closes the listening sockets' descriptors kept for an upgrade (and the keeper's:
// a shutdown closes them for good).
func (s *Server) closeKeptFds() {
	if s.upgradeMu.TryLock() { // else an upgrade is under way: its end decides
		defer s.upgradeMu.Unlock()
	}
	for _, fd := range []*int{&s.lnFd, &s.metricsFd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	if s.kp != nil {
		s.kp.post('L', keeper.Listeners{}) // no descriptors: the keeper closes its copies
	}
}

// listenerFromFd is a listener on a duplicate of fd.
func listenerFromFd(fd int) (*net.TCPListener, error) {
	nfd := dupOf(fd)
	if nfd < 0 {
		return nil, errors.New("cannot duplicate the listening socket's descriptor")
	}
	f := os.NewFile(uintptr(nfd), "listener")
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		ln.Close()
		return nil, errors.New("not a TCP listener")
	}
	return tl, nil
}
