package upgrade

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/internal/version"
)

// Old is the serving process's end of an upgrade: WaitReady, then (once the caller froze its
// connections) Send, or Refuse; Go once the new process has it all.
type Old struct {
	Peer   Ready // the new process, as it said ready
	h      *fdpass.Conn
	exited <-chan struct{}
}

// WaitReady waits for the process at the other end of peer, started to take over, to say it is
// ready. exited, if not nil, reports that process's end: every wait gives up at once then.
func WaitReady(peer *os.File, exited <-chan struct{}) (*Old, error) {
	h, err := fdpass.New(peer)
	if err != nil {
		return nil, err
	}
	if err := h.SetSendTimeout(ackTimeout); err != nil { // a new process that stops reading fails the hand-over
		h.Close()
		return nil, err
	}
	o := &Old{h: h, exited: exited}
	if err := o.await(func() error { _, err := h.Expect('R', readyTimeout, &o.Peer); return err }); err != nil {
		h.Close()
		return nil, fmt.Errorf("the new process did not get ready: %w", err)
	}
	return o, nil
}

// Close closes the old process's end.
func (o *Old) Close() { o.h.Close() }

// Gone reports whether the new process has ended, or closed its end of the hand-over socket: a
// freeze for it is over at once.
func (o *Old) Gone() bool {
	select {
	case <-o.exited: // nil: not known here (a keeper's worker)
		return true
	default:
	}
	return o.h.Hungup()
}

// Refuse tells the new process that nothing will be handed over (X), and why.
func (o *Old) Refuse(why error) { o.h.Send('X', why.Error()) }

// Send sends the server's state and st.Conns connections, conn(i) for each, and waits until the
// new process has taken them all. Its errors come after the new process may have taken
// connections: the caller stops it, then calls Thaw, which calls thaw.
func (o *Old) Send(st ServerState, conn func(i int) (Conn, error), thaw func()) error {
	err := o.sendAll(st, conn)
	if err == nil {
		err = o.await(func() error {
			var taken int
			if _, err := o.h.Expect('A', ackTimeout, &taken); err != nil {
				return err
			}
			if taken != st.Conns {
				return fmt.Errorf("the new process took %d of %d connections", taken, st.Conns)
			}
			return nil
		})
	}
	if err != nil {
		return &peerError{err: err, thaw: thaw}
	}
	return nil
}

func (o *Old) sendAll(st ServerState, conn func(i int) (Conn, error)) error {
	st.PID, st.Version = os.Getpid(), version.String()
	if err := o.h.Send('S', st, st.Fds...); err != nil {
		return err
	}
	for i := range st.Conns {
		c, err := conn(i)
		if err == nil {
			err = o.sendConn(c)
		}
		if err != nil {
			return fmt.Errorf("connection %d: %w", c.ID, err)
		}
	}
	return o.h.Send('E', st.Conns)
}

// sendConn sends a frozen connection: its state, sockets and bytes.
func (o *Old) sendConn(c Conn) error {
	var fds []int
	for _, fd := range []int{c.ClientFd, c.StoreFd} {
		if fd >= 0 {
			fds = append(fds, fd)
		}
	}
	if len(fds) == 0 {
		return errors.New("no socket")
	}
	p := connPacket{Conn: c, HasUp: c.StoreFd >= 0, Refeed: len(c.Refeed), ToStore: len(c.ToStore),
		ToClient: len(c.ToClient)}
	blobs := [][]byte{c.Refeed, c.ToStore, c.ToClient}
	if t := c.TLS; t != nil {
		if t.Fd >= 0 {
			fds = append(fds, t.Fd, t.PlainFd)
			p.TLSFds = true
		}
		p.TLSRx = len(t.Relay.Rx)
		blobs = append(blobs, t.Relay.Rx)
	}
	if err := o.h.Send('C', p, fds...); err != nil {
		return err
	}
	for _, b := range blobs {
		if err := o.h.SendBlob(b); err != nil {
			return err
		}
	}
	return nil
}

// Go tells the new process to go on: this one forwards nothing more.
func (o *Old) Go() error { return o.h.Send('G', nil) }

// await runs f, giving up when the new process exits first.
func (o *Old) await(f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-o.exited:
		return errors.New("the new process exited")
	}
}

// Next is the end of the process taking over: Join, then (once the caller took the listening
// sockets) Receive, or Refuse.
type Next struct {
	From ServerState // the old process's, with its listening sockets
	h    *fdpass.Conn
}

// Join says this process is ready to the serving process at the other end of peer and receives
// its state.
func Join(peer *os.File) (*Next, error) {
	h, err := fdpass.New(peer)
	if err != nil {
		return nil, err
	}
	if err := h.Send('R', Ready{PID: os.Getpid(), Version: version.String(), Ledger: true, KeptEnds: true, SocketHolds: true}); err != nil {
		h.Close()
		return nil, err
	}
	n := &Next{h: h}
	if n.From.Fds, err = h.Expect('S', ackTimeout, &n.From); err != nil {
		h.Close()
		return nil, err
	}
	return n, nil
}

// Close closes the new process's end.
func (n *Next) Close() { n.h.Close() }

// Refuse tells the old process that this one takes nothing (X), and why: it goes on serving.
func (n *Next) Refuse(why error) { n.h.Send('X', why.Error()) }

// Receive reads every connection, each given to take, acknowledges them and waits for go (or the
// old process's end: either way it forwards nothing more). On an error the old process goes on
// serving, and the caller closes the sockets of what it took.
func (n *Next) Receive(take func(Conn)) error {
	count := 0
	for {
		kind, body, fds, err := n.h.Recv(ackTimeout)
		if err != nil {
			return err
		}
		if kind == 'E' {
			break
		}
		c, err := n.readConn(kind, body, fds)
		if err != nil {
			n.Refuse(err)
			return err
		}
		take(c)
		count++
	}
	if err := n.h.Send('A', count); err != nil {
		return err
	}
	n.h.Recv(ackTimeout)
	return nil
}

// readConn reads one connection: a C packet and its bytes.
func (n *Next) readConn(kind byte, body []byte, fds []int) (Conn, error) {
	var p connPacket
	if kind != 'C' {
		fdpass.CloseFds(fds)
		return Conn{}, fmt.Errorf("handover: expected a connection, got a %c packet", kind)
	}
	if err := json.Unmarshal(body, &p); err != nil {
		fdpass.CloseFds(fds)
		return Conn{}, fmt.Errorf("handover: connection: %w", err)
	}
	want := 1
	if p.HasUp {
		want = 2
	}
	if p.TLSFds {
		want += 2
	}
	if len(fds) != want {
		fdpass.CloseFds(fds)
		return Conn{}, fmt.Errorf("handover: connection %d came with %d sockets, not %d", p.ID, len(fds), want)
	}
	c := p.Conn
	c.ClientFd, c.StoreFd = fds[0], -1
	if p.HasUp {
		c.StoreFd = fds[1]
	}
	if t := p.TLS; t != nil {
		t.Fd, t.PlainFd = -1, -1
		if p.TLSFds {
			t.Fd, t.PlainFd = fds[len(fds)-2], fds[len(fds)-1]
		}
	}
	var err error
	if c.Refeed, err = n.h.ReadBlob(p.Refeed, ackTimeout); err == nil {
		if c.ToStore, err = n.h.ReadBlob(p.ToStore, ackTimeout); err == nil {
			c.ToClient, err = n.h.ReadBlob(p.ToClient, ackTimeout)
		}
	}
	if t := c.TLS; t != nil && err == nil {
		t.Relay.Rx, err = n.h.ReadBlob(p.TLSRx, ackTimeout)
		for _, legacy := range []int{p.TLSToPlain, p.TLSToTLS} {
			if err == nil {
				_, err = n.h.ReadBlob(legacy, ackTimeout)
			}
		}
	}
	if err != nil {
		fdpass.CloseFds(fds)
		return Conn{}, err
	}
	return c, nil
}
