package proxy

import (
	"errors"
	"net"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// Every change of a connection's owner (c.own) is in this file, under c.mu:
//
//	accept ──► goroutines ──toLoop──► loop ──leaveLoop──► detached ──fromLoop──► goroutines
//	  │                                ▲                        ▲
//	  └──loopable (take)───────────────┤                        │
//	upgrade, keeper restore ──startAdopted (nothing left)───────┴── (else)
//
// What the owner leaves the next (leftover) is handed over by the call: leaveLoop and startAdopted
// give it to serve, which gives it to fromLoop.
// closeBoth can come at any point: it sets closed and the owner at that moment closes the sockets
// (goroutines: at once; a loop: when it serves the request; detached: fromLoop, or leaveLoop). A
// connection goes to a loop only between messages, with the store connected and no deadline to
// watch; a loop gives it back when it would have to wait (see loop_linux.go).

// loopable reports whether a new connection may go to a loop from its first byte: there are loops,
// the store is on this host (a loop connects to it without waiting, at the first valid message),
// and there is no deadline to watch. (A TLS End goes too: the loop opens and seals its records.)
func (c *conn) loopable() bool {
	return c.s.loops != nil && !c.dial.awaitStore && c.s.route.Route().Local.IsValid() && c.st.cfg.Timeouts.Idle == 0 &&
		c.g.Deadline().IsZero()
}

// connectStore connects a connection a loop forwards to the store, for its first message to send:
// on this host, so the handshake completes within the call. It reports false when no store slot and
// dial token are there at once, or the store did not take the connection at once (not listening
// yet, or its accept queue full): goroutines then wait for them and dial, with retries.
func (c *conn) connectStore(l *loop) bool {
	if !c.takeStoreSlot() {
		return false
	}
	fd, err := connectLocal(c.s.route.Route().Local)
	if err != nil {
		return false
	}
	if !l.watch(fd, c) {
		unix.Close(int(fd))
		return false
	}
	c.cl.storeConnected(c.id, int(fd))
	c.mu.Lock()
	c.lt.ufd, c.dial.done = fd, true
	c.mu.Unlock()
	close(c.dial.ready)
	return true
}

// connectLocal connects a non-blocking socket to ap and returns it once established. A connect
// to this host runs the whole handshake within the call, so the socket is established when it
// returns EINPROGRESS, unless the listener dropped the SYN: then, as for a refusal, it fails.
func connectLocal(ap netip.AddrPort) (int32, error) {
	family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()})
	if ap.Addr().Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	if err = unix.Connect(fd, sa); err == unix.EINPROGRESS {
		err = nil
		if _, _, e := addrCall(unix.SYS_GETPEERNAME, fd, 0); e != 0 {
			err = e // ENOTCONN until established
		}
	}
	if err == nil {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1) // as net.Dial
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return int32(fd), nil
}

// takenFromAccept is a connection a loop accepted (loopable): it belongs to the loop l from its
// first byte, with its client socket fd.
func (c *conn) takenFromAccept(l *loop, fd int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lt.cfd, c.own, c.lt.lp, c.out = int32(fd), ownLoop, l, &c.lt
}

// retarget gives a connection that takenFromAccept meant for a loop that has ended to the loop l
// instead; it reports false, having ended the connection, when it was closed meanwhile (the close
// was asked of the ended loop).
func (c *conn) retarget(l *loop) bool {
	c.mu.Lock()
	c.lt.lp = l
	closed := c.closed
	c.mu.Unlock()
	if closed {
		c.leaveLoop()
	}
	return !closed
}

// toLoop hands the connection to an event loop. took: the loop owns it now, and the caller must
// not touch it again (the loop ends it, or hands it back to a new serve goroutine). Otherwise live
// reports whether it goes on with goroutines.
func (c *conn) toLoop() (took, live bool) {
	cfd, ufd, err := c.cl.detach(c.gr.client, c.gr.up)
	if err != nil {
		// Out of descriptors, most likely: the connection stays on its goroutines, unharmed.
		c.s.log.Debug("could not hand a connection to an event loop", "conn", c.id, "err", err)
		c.startReplies()
		return false, true
	}
	l := c.s.loops.pick()
	c.mu.Lock()
	c.lt.cfd, c.lt.ufd = cfd, ufd
	if c.closed {
		c.closeDetached()
		c.mu.Unlock()
		return false, false
	}
	c.own, c.lt.lp, c.out = ownLoop, l, &c.lt
	c.mu.Unlock()
	if l.adopt(c) {
		return true, true
	}
	c.mu.Lock() // the loop ended: stay on goroutines
	c.own, c.lt.lp = ownDetached, nil
	c.mu.Unlock()
	return false, c.fromLoop(leftover{}) // the loop never had it: nothing is left
}

// startAdopted starts a connection a previous process or a keeper handed over, with its sockets
// (cfd, and ufd or -1: the store not connected), detached, and what it left to finish: on a loop
// when it stood between messages with nothing left and no deadline to watch, else on goroutines,
// which finish what was left first (resume).
func (c *conn) startAdopted(cfd, ufd int, left leftover) {
	c.lt.cfd, c.lt.ufd = int32(cfd), int32(ufd)
	// An End is detached on cfd (tlsrelay.EndFrom): a loop takes it with no record read and not opened.
	if left.empty() && !c.gr.readEnded && ufd >= 0 && c.s.loops != nil && c.st.cfg.Timeouts.Idle == 0 &&
		c.g.Deadline().IsZero() && !c.g.Passing() && !c.cl.unopened() {
		l := c.s.loops.pick()
		c.mu.Lock()
		c.own, c.lt.lp, c.out = ownLoop, l, &c.lt
		c.mu.Unlock()
		if l.adopt(c) {
			return
		}
		c.mu.Lock()
		c.out = &c.gr
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.own, c.lt.lp = ownDetached, nil
	c.mu.Unlock()
	go func() {
		if c.gr.readEnded {
			c.mu.Lock()
			c.gr.readEnded = false // the reader sees the end of stream again and passes it on
			c.mu.Unlock()
		}
		c.serve(&left)
	}()
}

// leaveLoop is called by the loop that lets c go, after it stopped watching c's sockets: a closed
// connection ends there, a live one goes on with goroutines, with what the loop could not finish.
func (c *conn) leaveLoop() {
	left := c.lt.left
	c.lt.left = leftover{}
	c.mu.Lock()
	c.own, c.lt.lp = ownDetached, nil
	closed := c.closed
	if closed {
		c.closeDetached()
	}
	c.mu.Unlock()
	if closed {
		c.gr.left = left // for end to give back the budget it holds
		c.end()
		return
	}
	go c.serve(&left)
}

// fromLoop gives the connection's sockets back to Go's poller after a loop (or a previous
// process) and finishes what it left; it reports whether the connection lives on.
func (c *conn) fromLoop(left leftover) bool {
	c.gr.left = left
	c.out = &c.gr
	if !c.reattach() {
		return false
	}
	c.startReplies() // if the store is connected; else the dial below offers the connection to a loop again
	return c.resume()
}

// reattach gives detached sockets to Go's poller; it reports whether the connection lives on.
func (c *conn) reattach() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.closeDetached()
		return false
	}
	client, err := c.cl.attach(c.lt.cfd)
	if err == nil {
		c.lt.cfd = -1
		if c.lt.ufd < 0 { // not connected yet: storeUp dials
			c.gr.client, c.own = client, ownGoroutines
			return true
		}
		var up sock
		if up, err = attach(c.lt.ufd); err == nil {
			tc, isTCP := up.(*net.TCPConn)
			if isTCP {
				c.gr.client, c.gr.up, c.lt.ufd, c.own = client, tc, -1, ownGoroutines
				return true
			}
			up.Close()
			err = errors.New("the store's socket is not TCP")
		}
		client.Close()
	}
	c.s.log.Warn("could not take a connection back from its event loop; closing it", "conn", c.id, "err", err)
	c.closed = true
	if c.lt.ufd >= 0 { // attach closed what it was given, and cfd is then -1
		unix.Close(int(c.lt.ufd))
	}
	c.lt.cfd, c.lt.ufd = -1, -1
	return false
}

// closeDetached closes the descriptors a loop owned (a TLS End's after its close_notify); c.mu is
// held.
func (c *conn) closeDetached() {
	c.cl.closing(c.lt.cfd)
	for _, fd := range [2]int32{c.lt.cfd, c.lt.ufd} {
		if fd >= 0 {
			unix.Close(int(fd))
		}
	}
	c.lt.cfd, c.lt.ufd = -1, -1
}
