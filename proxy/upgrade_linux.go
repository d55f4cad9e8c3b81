package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/keeper"
	"github.com/storeguard/storeguard/tlsrelay"
	"github.com/storeguard/storeguard/upgrade"
	"golang.org/x/sys/unix"
)

// Upgrade in place: package upgrade carries everything to the process taking over; this file
// freezes the connections (freeze.go), turns each into an upgrade.Conn and back, and starts them.

// HandOver hands everything to the process at the other end of peer, which was started to take
// over (keeper.HandoverEnv), and returns nil once that process has it all: Serve then returns and
// the caller exits. exited, if not nil, reports the new process's end. On an error nothing was
// handed over and the server goes on serving; the caller must make sure the new process is gone
// (upgrade.MayHaveTaken says it may have taken connections), then call upgrade.Thaw.
func (s *Server) HandOver(peer *os.File, exited <-chan struct{}) (n int, err error) {
	select {
	case <-s.serving:
	default:
		return 0, errors.New("not serving yet")
	}
	if !s.cont.upgradeMu.TryLock() {
		return 0, upgrade.ErrUnderWay
	}
	defer s.cont.upgradeMu.Unlock()
	o, err := upgrade.WaitReady(peer, exited)
	if err != nil {
		return 0, err
	}
	defer o.Close()
	s.log.Info("upgrade: the new process is ready; freezing connections", "pid", o.Peer.PID, "version", o.Peer.Version)
	start := time.Now()
	conns, err := s.freeze(s.cont.freezeTimeout, o.Gone)
	if err != nil {
		o.Refuse(err)
		s.thaw(conns)
		s.m.handovers.WithLabelValues("failed").Inc()
		s.log.Warn("upgrade: thawed", "held", time.Since(start).String())
		return 0, err
	}
	st := s.serverState(len(conns), start)
	if s.cont.ledger != nil {
		o.AddLedger(&st, s.cont.ledger.Fd())
	}
	s.cont.keptEnds = st.Ledger && o.Peer.KeptEnds
	s.cont.socketHolds = o.Peer.SocketHolds
	err = o.Send(st, func(i int) (upgrade.Conn, error) { return conns[i].frozenState() }, func() { s.thaw(conns) })
	if err != nil {
		s.m.handovers.WithLabelValues("failed").Inc()
		return 0, err
	}
	// The keeper knows every connection, and that the new worker is the worker, before it goes on.
	if s.cont.kp != nil && !s.cont.kp.HandedOver(2*time.Second) {
		s.log.Warn("upgrade: the keeper did not confirm it read every connection and the hand-over in time")
	}
	if err := o.Go(); err != nil {
		s.log.Warn("upgrade: could not say go; the new process goes on when this one exits", "err", err)
	}
	s.log.Info("upgrade: handed over", "connections", len(conns), "to_pid", o.Peer.PID,
		"frozen", time.Since(start).String())
	s.cont.closeListenerFds() // the new process has its own (the keeper too)
	s.cont.handOnce.Do(func() { close(s.cont.handedOver) })
	return len(conns), nil
}

// serverState is what the whole server carries over, with conns connections frozen since frozen.
func (s *Server) serverState(conns int, frozen time.Time) upgrade.ServerState {
	st := upgrade.ServerState{Listen: s.listeners.clients.Addr().String(), NextID: s.nextID.Load(), Sources: s.gate.State(),
		Proven: s.gate.ProvenStates(), Handovers: s.cont.handovers.Load(), Conns: conns, Frozen: frozen, Fds: []int{s.cont.lnFd}}
	info, known := s.store.Get()
	st.Store, st.StoreKnown = info, known
	if s.cont.metricsFd >= 0 {
		st.MetricsListen = s.listeners.metrics.Addr().String()
		st.Fds = append(st.Fds, s.cont.metricsFd)
	}
	return st
}

// frozenState is a frozen connection as plain data: its state, sockets and bytes.
func (c *conn) frozenState() (upgrade.Conn, error) {
	gs, err := c.g.State()
	if err != nil {
		return upgrade.Conn{ID: c.id}, err
	}
	c.rep.mu.Lock()
	rs := c.rep.track.State()
	var toClient []byte
	if p := c.gr.left.client; p.buf != nil {
		toClient = append(toClient, (*p.buf)[p.from:p.to]...)
	}
	for _, ch := range c.rep.queue {
		toClient = append(toClient, (*ch.buf)[ch.from:ch.to]...)
	}
	c.rep.mu.Unlock()
	refeed := append(append([]byte(nil), c.carry...), c.gr.left.tail...)
	refeed = append(refeed, c.gr.left.rest...)
	toStore := append(append([]byte(nil), c.gr.left.up...), c.gr.left.upTail...)
	c.mu.Lock()
	cs := upgrade.Conn{ID: c.id, Src: c.src, Dst: c.dst, Start: c.start, Guard: gs, Replies: rs,
		ReadEnded: c.gr.readEnded, UpDeadline: c.gr.upDeadline, Held: c.held, Flow: c.flow.carry(&c.rep),
		ClientFd: -1, StoreFd: -1, Refeed: refeed, ToStore: toStore, ToClient: toClient}
	sk := c.gr.client
	var up syscall.Conn
	if c.gr.up != nil {
		up = c.gr.up
	}
	c.mu.Unlock()
	if cs.TLS, err = c.cl.state(c.id, c.s.cont.keptEnds); err != nil {
		return cs, err
	}
	client := c.cl.handoverSock(&cs, sk, len(c.carry), c.s.cont.socketHolds)
	for _, sock := range []struct {
		tc syscall.Conn
		fd *int
	}{{client, &cs.ClientFd}, {up, &cs.StoreFd}} {
		if sock.tc == nil {
			continue
		}
		if sockFd(sock.tc, func(fd int) { *sock.fd = fd }); *sock.fd < 0 {
			return cs, errors.New("no descriptor for a socket to hand over")
		}
	}
	return cs, nil
}

// adoption is what a previous process handed over, taken before Serve and started by it.
type adoption struct {
	reason string // upgrade, or restart (a keeper's, after the forwarding process died)
	from   upgrade.ServerState
	conns  []adoptedConn
	ln     net.Listener // the old listening socket when the new configuration listens elsewhere
}

// adoptedConn is a connection taken, not started: its sockets and bytes are in st.
type adoptedConn struct {
	rebuild bool // restored by a keeper after a crash: no state but the sockets
	c       *conn
	st      upgrade.Conn
	// tls: the TLS relay from its slot in the shared ledger: restored by a keeper, or handed over
	// in an upgrade with the keeper's ledger (takeSlots)
	tls  *tlsConn
	lost error // its relay could not be had from its slot: it is closed
	// kend: a kept TLS End the keeper gave back, made from its slot once the connection is
	// reconciled (restoreEnd)
	kend *keptTLS
}

// TakeOver takes everything over from the serving process at the other end of peer, in place of
// Listen: the listening sockets, the server's state and every connection. Serve then starts them.
// It returns once the old process said go (or is gone); on an error the old process goes on
// serving, and this one must exit.
func (s *Server) TakeOver(peer *os.File) error {
	n, err := upgrade.Join(peer)
	if err != nil {
		return err
	}
	defer n.Close()
	slots := s.takeLedger(n.TakeLedger())
	st := n.From
	a := &adoption{reason: "upgrade", from: st}
	if err := s.takeListeners(st, st.Fds, a); err != nil {
		n.Refuse(err)
		return err
	}
	s.nextID.Store(st.NextID)
	s.gate.Restore(st.Sources)
	s.gate.RestoreProven(st.Proven)
	if st.StoreKnown {
		s.store.Adopt(st.Store)
	}
	s.cont.handovers.Store(st.Handovers)
	if err := n.Receive(func(cs upgrade.Conn) { a.conns = append(a.conns, s.takeConn(cs)) }); err != nil {
		a.abandon()
		return err
	}
	if slots {
		s.takeSlots(a)
	}
	s.cont.adopted = a
	return nil
}

// takeLedger maps the keeper's ledger the old process handed over (fd; -1: none), in which its TLS
// connections' relays go on; it reports whether they do. Without it each relay takes a slot of
// a ledger of this process's (KeeperListeners), and the keeper learns it (keepTLS).
func (s *Server) takeLedger(fd int) bool {
	if fd < 0 {
		return false
	}
	l, err := tlsrelay.OpenLedger(fd)
	if err != nil {
		s.log.Warn("upgrade: the TLS relays' ledger handed over cannot be mapped; they take slots of a new one", "err", err)
		return false
	}
	s.cont.ledger = l
	return true
}

// takeListeners adopts the listening sockets, or listens anew where the configuration says
// otherwise (a restart for a new listen address): the old socket then keeps accepting until its
// backlog is empty (startAdopted) and closes.
func (s *Server) takeListeners(st upgrade.ServerState, fds []int, a *adoption) error {
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
		s.listeners.clients = old
	} else {
		if s.listeners.clients, err = net.Listen("tcp", c.Listen); err != nil {
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
			s.listeners.metrics = mln
		default:
			mln.Close()
		}
	}
	if s.listeners.metrics == nil && c.MetricsListen != "" {
		if s.listeners.metrics, err = net.Listen("tcp", c.MetricsListen); err != nil {
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

// takeConn readies a connection handed over, not started.
func (s *Server) takeConn(cs upgrade.Conn) adoptedConn {
	st := s.set.Load()
	c := s.newConn(cs.ID, cs.Src, cs.Dst, cs.Start)
	c.gr.readEnded, c.gr.upDeadline = cs.ReadEnded, cs.UpDeadline
	if err := c.rep.track.Restore(cs.Replies); err != nil {
		s.log.Warn("handover: a connection's replies could not be followed on; counting afresh", "conn", c.id, "err", err)
	}
	c.g.Restore(cs.Guard, &st.pol)
	c.attachGuard()
	c.flow.restore(&cs.Flow, &c.rep)
	return adoptedConn{c: c, st: cs}
}

// abandon closes what was taken before a failed hand-over (the old process still has it all).
func (a *adoption) abandon() {
	for _, ac := range a.conns {
		ac.closeFds()
	}
}

func (ac *adoptedConn) closeFds() {
	unix.Close(ac.st.ClientFd)
	if ac.st.StoreFd >= 0 {
		unix.Close(ac.st.StoreFd)
	}
	ac.closeTLS()
}

// startAdopted starts the connections a previous process handed over (TakeOver), each where it
// stood, and records the hand-over.
func (s *Server) startAdopted() {
	a := s.cont.adopted
	if a == nil {
		return
	}
	s.cont.adopted = nil
	keptEnds := 0 // TLS connections that went on from their slots, as Ends
	for i := range a.conns {
		ac := &a.conns[i]
		if ac.rebuild {
			reconciled := reconcile
			if ac.kend != nil {
				reconciled = func(int, int) (string, error) { return s.restoreEnd(ac) }
			}
			if lost, err := reconciled(ac.st.ClientFd, ac.st.StoreFd); lost != "" {
				s.log.Warn("restart: a restored connection cannot go on exactly; closing it", "conn", ac.c.id,
					"reason", lost, "err", err)
				s.m.restoreLost.WithLabelValues(lost).Inc()
				s.cont.kp.Ended(ac.c.id)
				ac.closeFds()
				continue
			}
		}
		if ac.lost != nil {
			s.log.Warn("upgrade: a TLS connection's relay cannot go on from its slot; closing it", "conn", ac.c.id, "err", ac.lost)
			s.cont.kp.Ended(ac.c.id)
			ac.closeFds()
			continue
		}
		if ac.rebuild && !s.rebuild(ac) {
			s.log.Warn("restart: the store's generation is not known; closing a restored connection", "conn", ac.c.id)
			s.cont.kp.Ended(ac.c.id)
			ac.closeFds()
			continue
		}
		if s.startConn(ac) {
			keptEnds++
		}
	}
	if a.reason != "restart" { // a restart knows nothing of the hand-overs before
		s.cont.handovers.Add(1)
		s.m.handovers.WithLabelValues("ok").Add(float64(s.cont.handovers.Load()))
	}
	s.m.handoverConns.Set(float64(len(a.conns)))
	if !a.from.Frozen.IsZero() {
		s.m.handoverFrozen.Set(time.Since(a.from.Frozen).Seconds())
	}
	moved := uint64(len(a.conns))
	e := audit.Event{Timestamp: s.now(), Action: audit.ActionHandover, Reason: a.reason,
		Connections: &moved, Mode: audit.Mode(s.set.Load().cfg.Mode)}
	if ap, err := netip.ParseAddrPort(s.listeners.clients.Addr().String()); err == nil {
		e.DestIP, e.DestPort = ap.Addr().Unmap(), ap.Port()
	}
	s.ev.write(e)
	if a.reason == "restart" {
		s.log.Info("restart: took every connection back from the keeper", "connections", len(a.conns), "kept_ends", keptEnds)
	} else {
		s.log.Info("upgrade: handover complete", "connections", len(a.conns), "kept_ends", keptEnds, "from_pid", a.from.PID,
			"from_version", a.from.Version, "handovers", s.cont.handovers.Load())
	}
	if a.ln != nil {
		go s.acceptBacklog(a.ln)
	}
}

// startConn starts one adopted connection: on an event loop when it stood between messages with
// nothing left to write, else on goroutines, which first write what was left and judge again the
// bytes that were not judged through.
func (s *Server) startConn(ac *adoptedConn) (keptEnd bool) {
	c := ac.c
	c.gives.admission = s.gate.Adopt(c.src.Addr())
	keptEnd, err := c.cl.adopt(ac, s.cont.ledger, s.log)
	if err != nil {
		s.log.Warn("upgrade: a TLS connection's relay could not go on; closing it", "conn", c.id, "err", err)
		c.gives.admission()
		unix.Close(ac.st.ClientFd)
		if ac.st.StoreFd >= 0 {
			unix.Close(ac.st.StoreFd)
		}
		return false
	}
	c.g.As(c.cl.identity()) // its guard's policy sees the peer's identity (setTLS)
	if c.cl.proved() {
		addr, id := c.gives.admission, s.gate.AdoptIdentity(c.cl.identity())
		c.gives.admission = func() { id(); addr() }
	}
	if c.g.Talked() {
		c.gives.talker = s.markTalker(c.src.Addr())
	}
	if ac.st.StoreFd >= 0 {
		c.storeSlot = s.slots.Adopt(c.src.Addr())
		c.dial.done = true
		close(c.dial.ready)
	}
	s.m.active.Inc()
	s.handlers.Add(1)
	s.track(c, true)
	left := leftover{replies: ac.st.ToClient}
	if len(ac.st.ToStore) > 0 {
		left.up = ac.st.ToStore
	}
	if len(ac.st.Refeed) > 0 {
		left.rest = ac.st.Refeed
		if held := min(ac.st.Held, int64(c.g.Limits().MaxMessageBytes)); held > 0 {
			c.s.buf.adopt(c.src.Addr(), held) // the message in progress keeps its budget, as before
			c.carry, c.held = make([]byte, 0, held), held
		}
	}
	if n := ac.st.InSocket; n > 0 {
		c.cl.takeHold(ac.st.ClientFd, n, len(ac.st.Refeed))
	}
	c.startAdopted(ac.st.ClientFd, ac.st.StoreFd, left)
	return keptEnd
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
		s.cont.accepting.Add(1)
		go s.handle(c.(*net.TCPConn))
	}
}

// keepListenerFds keeps a descriptor of each listening socket for an upgrade to hand over (the
// event loops close the listener they accept from).
func (s *Server) keepListenerFds() error {
	fd, err := dupFd(s.listeners.clients.(*net.TCPListener))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s.cont.lnFd = int(fd)
	if s.listeners.metrics != nil {
		if fd, err = dupFd(s.listeners.metrics.(*net.TCPListener)); err != nil {
			return fmt.Errorf("metrics-listen: %w", err)
		}
		s.cont.metricsFd = int(fd)
	}
	return nil
}

// closeKeptFds closes the listening sockets' descriptors kept for an upgrade (and the keeper's:
// a shutdown closes them for good).
func (s *Server) closeKeptFds() {
	if s.cont.upgradeMu.TryLock() { // else an upgrade is under way: its end decides
		defer s.cont.upgradeMu.Unlock()
	}
	s.cont.closeListenerFds()
	if s.cont.kp != nil {
		s.cont.kp.Listen(keeper.Listeners{}) // no descriptors: the keeper closes its copies
	}
}

// closeListenerFds closes the listening sockets' descriptors kept to hand over.
func (c *continuity) closeListenerFds() {
	for _, fd := range []*int{&c.lnFd, &c.metricsFd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// listenerFromFd is a listener on a duplicate of fd.
func listenerFromFd(fd int) (*net.TCPListener, error) {
	nfd := fdpass.Dup(fd)
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
