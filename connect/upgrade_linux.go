package connect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/tlsrelay"
	"github.com/storeguard/storeguard/upgrade"
)

// An upgrade in place of a client guard, with package upgrade's protocol as serve's: each relay
// goes as an upgrade.Conn whose client socket is the rank's, whose store socket is the master's,
// and whose TLS is the relay's state.

// freezeTimeout bounds how long connections still starting and relays take to stop.
const freezeTimeout = 5 * time.Second

// HandOver gives the listening socket and every relay to the process at the other end of peer.
func (c *Client) HandOver(peer *os.File, exited <-chan struct{}) (int, error) {
	select {
	case <-c.handedOver:
		return 0, errors.New("handed over already")
	default:
	}
	o, err := upgrade.WaitReady(peer, exited)
	if err != nil {
		return 0, err
	}
	defer o.Close()
	start := time.Now()
	relays, err := c.freeze()
	if err != nil {
		o.Refuse(err)
		c.thaw(relays)
		return 0, err
	}
	lnFd, err := fdOf(c.ln)
	if err != nil {
		o.Refuse(err)
		c.thaw(relays)
		return 0, err
	}
	st := upgrade.ServerState{Listen: c.ln.Addr().String(), NextID: c.nextID.Load() + 1, Conns: len(relays), Frozen: start,
		Fds: []int{lnFd}}
	if c.ledger != nil {
		o.AddLedger(&st, c.ledger.Fd())
	}
	err = o.Send(st, func(i int) (upgrade.Conn, error) { return c.frozenConn(relays[i]) }, func() { c.thaw(relays) })
	if err != nil {
		return 0, err
	}
	if c.opt.Keeper != nil && !c.opt.Keeper.HandedOver(2*time.Second) { // the new process is the worker before it goes on
		c.opt.Log.Warn("upgrade: the keeper did not confirm it read the hand-over in time")
	}
	o.Go()
	c.handOnce.Do(func() { close(c.handedOver) }) // before the relays end here: their keeper keeps them
	for _, r := range relays {
		r.Abandon()
	}
	c.opt.Log.Info("upgrade: handed over", "relays", len(relays), "to_pid", o.Peer.PID, "frozen", time.Since(start).String())
	return len(relays), nil
}

// freeze pauses accepting, waits for connections still starting, and freezes every relay.
func (c *Client) freeze() ([]*tlsrelay.Relay, error) {
	c.mu.Lock()
	c.frozen, c.thawed = true, make(chan struct{})
	c.mu.Unlock()
	c.ln.SetDeadline(time.Unix(1, 0))
	deadline := time.Now().Add(freezeTimeout)
	for {
		c.mu.Lock()
		n := c.starting
		relays := make([]*tlsrelay.Relay, 0, len(c.relays))
		for r := range c.relays {
			relays = append(relays, r)
		}
		c.mu.Unlock()
		if n == 0 {
			for _, r := range relays {
				if !r.Freeze(time.Until(deadline)) {
					return relays, errors.New("upgrade: a relay did not stop in time")
				}
			}
			return relays, nil
		}
		if time.Now().After(deadline) {
			return relays, fmt.Errorf("upgrade: %d connections still reaching the master after %s", n, freezeTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// thaw ends a freeze that handed nothing over.
func (c *Client) thaw(relays []*tlsrelay.Relay) {
	for _, r := range relays {
		r.Thaw()
	}
	c.ln.SetDeadline(time.Time{})
	c.mu.Lock()
	c.frozen = false
	close(c.thawed)
	c.mu.Unlock()
}

// awaitThaw waits for a paused accept to go on: true after a thaw, false once handed over.
func (c *Client) awaitThaw(ctx context.Context) bool {
	c.mu.Lock()
	frozen, th := c.frozen, c.thawed
	c.mu.Unlock()
	if !frozen {
		return true
	}
	select {
	case <-th:
		return true
	case <-c.handedOver:
		return false
	case <-ctx.Done():
		return false
	}
}

// frozenConn is a frozen relay as an upgrade.Conn.
func (c *Client) frozenConn(r *tlsrelay.Relay) (upgrade.Conn, error) {
	c.mu.Lock()
	info := c.relays[r]
	c.mu.Unlock()
	left, err := r.Left()
	if err != nil {
		return upgrade.Conn{}, err
	}
	cs := upgrade.Conn{ID: info.id, Src: info.src, Dst: info.dst,
		TLS: &upgrade.TLSConn{Relay: left, Slot: r.Slot(), Identity: info.peer, Fd: -1, PlainFd: -1}}
	cs.StoreFd, cs.ClientFd, err = r.Fds()
	return cs, err
}

// fdOf is a socket's descriptor, valid while it is open.
func fdOf(s syscall.Conn) (int, error) {
	rc, err := s.SyscallConn()
	if err != nil {
		return -1, err
	}
	n := -1
	if err := rc.Control(func(fd uintptr) { n = int(fd) }); err != nil {
		return -1, err
	}
	return n, nil
}

// TakeOver makes a client guard from what the process at the other end of peer hands over, and
// starts its relays once that process says go.
func TakeOver(opt Options, peer *os.File) (*Client, error) {
	n, err := upgrade.Join(peer)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	if len(n.From.Fds) < 1 {
		return nil, errors.New("upgrade: no listening socket")
	}
	f := os.NewFile(uintptr(n.From.Fds[0]), "listener")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		n.Refuse(err)
		return nil, err
	}
	c := newClient(opt, ln.(*net.TCPListener))
	if n.From.NextID > 0 { // ids stay unique across processes: a keeper knows relays by them
		c.nextID.Store(n.From.NextID - 1)
	}
	// The keeper's ledger, when the old process hands it over: each relay goes on in its slot
	// there, which the keeper already knows, so that no instant finds the keeper with a slot that
	// is not its relay's. Else (or if it cannot be mapped) they take slots of a new one.
	slots := false
	if fd := n.TakeLedger(); fd >= 0 {
		if l, err := tlsrelay.OpenLedger(fd); err != nil {
			opt.Log.Warn("upgrade: the relays' ledger handed over cannot be mapped; they take slots of a new one", "err", err)
		} else {
			c.ledger, slots = l, true
		}
	}
	if err := c.shareLedger(); err != nil {
		n.Refuse(err)
		ln.Close()
		return nil, err
	}
	type taken struct {
		tlsSock, plain tlsrelay.Sock
		cs             upgrade.Conn
		r              *tlsrelay.Relay
	}
	var relays []*taken
	var bad error
	err = n.Receive(func(cs upgrade.Conn) {
		tlsSock, plain, err := tlsrelay.FromFds(cs.StoreFd, cs.ClientFd)
		if err == nil && cs.TLS == nil {
			tlsSock.Close()
			plain.Close()
			err = errors.New("upgrade: a connection without its relay")
		}
		if err != nil {
			bad = errors.Join(bad, err)
			return
		}
		relays = append(relays, &taken{tlsSock: tlsSock, plain: plain, cs: cs})
	})
	if err != nil {
		for _, t := range relays {
			t.tlsSock.Close()
			t.plain.Close()
		}
		ln.Close()
		return nil, err
	}
	// The relays in their slots first (nothing is written there before one runs), then the
	// others in new slots, none of which is then one of theirs.
	for _, inSlots := range []bool{true, false} {
		for _, t := range relays {
			if inSlot := slots && t.cs.TLS.Slot >= 0; inSlot != inSlots {
				continue
			}
			if inSlots {
				t.r, err = tlsrelay.Restore(t.tlsSock, t.plain, c.ledger, t.cs.TLS.Slot, t.cs.TLS.Relay.ID)
			} else {
				t.r, err = tlsrelay.Resume(t.tlsSock, t.plain, t.cs.TLS.Relay, c.ledger)
			}
			if err != nil {
				bad = errors.Join(bad, err)
				opt.Keeper.Ended(t.cs.TLS.Relay.ID)
			}
		}
	}
	if bad != nil {
		c.opt.Log.Warn("upgrade: connections that could not go on were closed", "err", bad)
	}
	c.mu.Lock()
	running := 0
	for _, t := range relays {
		if t.r == nil {
			continue
		}
		info := relayInfo{id: t.cs.TLS.Relay.ID, src: t.cs.Src, dst: t.cs.Dst, peer: t.cs.TLS.Identity}
		c.relays[t.r] = info
		if !slots || t.cs.TLS.Slot < 0 { // in a new slot: the keeper learns it
			c.keep(t.r, info)
		}
		c.run(t.r, info.id)
		running++
	}
	c.mu.Unlock()
	c.opt.Log.Info("upgrade: took over", "relays", running, "from_pid", n.From.PID)
	return c, nil
}
