package keeper

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/internal/fdpass"
)

// Link is a worker's end of its link to the keeper: every socket it accepts or connects to the
// store goes to the keeper as a duplicate, and every end is said, so that the keeper holds what a
// crash would otherwise close. The link never makes forwarding wait: packets queue here and one
// goroutine sends them. A keeper that stops reading costs memory for the queue, not forwarding.
// Opened, Connected and Ended do nothing on a nil Link (no keeper): the data path calls them as is.
type Link struct {
	log     *slog.Logger
	c       *fdpass.Conn
	mu      sync.Mutex
	cond    *sync.Cond
	q       []packet
	busy    bool
	failed  atomic.Int64  // the second a failure was last logged
	flushed chan struct{} // f: the keeper read everything sent before F
	killed  chan struct{} // k: the worker started for an upgrade is gone
}

type packet struct {
	kind byte
	v    any
	fds  []int // duplicates, closed once sent
}

// replyTimeout bounds each of the keeper's answers to a restarted worker.
const replyTimeout = 60 * time.Second

// Dial links a worker to the keeper at the other end of f (Env).
func Dial(f *os.File, log *slog.Logger) (*Link, error) {
	c, err := fdpass.New(f)
	if err != nil {
		return nil, err
	}
	l := &Link{log: log, c: c, flushed: make(chan struct{}, 1), killed: make(chan struct{}, 1)}
	l.cond = sync.NewCond(&l.mu)
	go l.sendLoop()
	return l, nil
}

func (l *Link) post(kind byte, v any, fds ...int) {
	l.mu.Lock()
	l.q = append(l.q, packet{kind: kind, v: v, fds: fds})
	l.cond.Signal()
	l.mu.Unlock()
}

func (l *Link) sendLoop() {
	for {
		l.mu.Lock()
		for len(l.q) == 0 {
			l.busy = false
			l.cond.Wait()
		}
		batch := l.q
		l.q, l.busy = nil, true
		l.mu.Unlock()
		for len(batch) > 0 {
			n := l.sendSome(batch)
			batch = batch[n:]
		}
	}
}

// maxBatch bounds an M packet: its descriptors within SCM_MAX_FD (253), its body within a packet.
const maxBatch = 200

// sendSome sends the first packets of batch, as one M packet when they are connection changes
// (O, U, D), and returns how many it sent.
func (l *Link) sendSome(batch []packet) int {
	n := 0
	for n < len(batch) && n < maxBatch && isChange(batch[n].kind) {
		n++
	}
	if n <= 1 {
		p := batch[0]
		l.sendOne(p.kind, p.v, p.fds)
		return 1
	}
	changes := make([]Change, n)
	var fds []int
	for i, p := range batch[:n] {
		changes[i] = Change{Kind: p.kind, Conn: p.v.(Conn)}
		fds = append(fds, p.fds...)
	}
	l.sendOne('M', changes, fds)
	return n
}

func isChange(kind byte) bool { return kind == 'O' || kind == 'U' || kind == 'D' }

func (l *Link) sendOne(kind byte, v any, fds []int) {
	err := l.c.Send(kind, v, fds...)
	fdpass.CloseFds(fds)
	if err != nil && l.allowLog() {
		l.log.Error("keeper link: a packet was lost; a crash now may cost its connections (logged at most once a second)",
			"err", err)
	}
}

// allowLog reports whether a failure may be logged: at most once a second.
func (l *Link) allowLog() bool {
	t, prev := time.Now().Unix(), l.failed.Load()
	return t != prev && l.failed.CompareAndSwap(prev, t)
}

// Serve serves the keeper's requests until the keeper is gone: H (hand over to a new worker, on
// handOver's own goroutine), N (an upgrade the keeper could not start: failed is told why), f and
// k (answers).
func (l *Link) Serve(handOver func(peer *os.File), failed func(error)) {
	for {
		kind, body, fds, err := l.c.Recv(0)
		if err != nil {
			l.log.Error("keeper link: the keeper is gone; serving on, but a crash now closes every connection", "err", err)
			return
		}
		switch kind {
		case 'H':
			if len(fds) != 1 {
				fdpass.CloseFds(fds)
				continue
			}
			go handOver(os.NewFile(uintptr(fds[0]), "handover"))
			continue
		case 'N': // the keeper could not start the upgrade it was asked for
			var why string
			json.Unmarshal(body, &why)
			l.log.Error("upgrade failed; this process goes on serving", "err", why)
			failed(errors.New(why))
		case 'f':
			notify(l.flushed)
		case 'k':
			notify(l.killed)
		}
		fdpass.CloseFds(fds)
	}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Sync returns once the keeper has read every packet posted before, or false after timeout.
func (l *Link) Sync(timeout time.Duration) bool { return l.ask('F', l.flushed, timeout) }

// StopNext asks the keeper to kill the worker it started for an upgrade (the hand-over failed
// after that worker may have taken connections) and waits until it is gone, or false after
// timeout.
func (l *Link) StopNext(timeout time.Duration) bool { return l.ask('K', l.killed, timeout) }

// ask posts kind and waits for its answer, or false after timeout.
func (l *Link) ask(kind byte, answer chan struct{}, timeout time.Duration) bool {
	select { // a stale answer
	case <-answer:
	default:
	}
	l.post(kind, nil)
	select {
	case <-answer:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Opened gives the keeper a new connection's client socket, fd (a duplicate: the caller keeps fd).
func (l *Link) Opened(id uint64, src, dst netip.AddrPort, fd int) {
	if l == nil {
		return
	}
	l.give('O', Conn{ID: id, Src: src, Dst: dst}, fd)
}

// OpenedWith is Opened for a connection with sockets of its own besides its client's, extra (a
// TLS relay's), and the worker's record of it, data: Restore gives them back together.
func (l *Link) OpenedWith(id uint64, src, dst netip.AddrPort, fd int, data json.RawMessage, extra ...int) {
	if l == nil {
		return
	}
	l.give('O', Conn{ID: id, Src: src, Dst: dst, Data: data, Extra: len(extra)}, append([]int{fd}, extra...)...)
}

// Connected gives the keeper a connection's store socket, fd (a duplicate: the caller keeps fd).
func (l *Link) Connected(id uint64, fd int) {
	if l == nil {
		return
	}
	l.give('U', Conn{ID: id}, fd)
}

func (l *Link) give(kind byte, v Conn, fds ...int) {
	dups := make([]int, 0, len(fds))
	for _, fd := range fds {
		d := fdpass.Dup(fd)
		if d < 0 {
			fdpass.CloseFds(dups)
			if l.allowLog() {
				l.log.Error("keeper link: cannot duplicate a socket (out of descriptors?); a crash now closes that connection")
			}
			return
		}
		dups = append(dups, d)
	}
	l.post(kind, v, dups...)
}

// Ended tells the keeper a connection ended: it closes its copies.
func (l *Link) Ended(id uint64) {
	if l == nil {
		return
	}
	l.post('D', Conn{ID: id})
}

// Listen gives the keeper the listening sockets, fds (duplicates: the caller keeps them), or none:
// the keeper closes its copies.
func (l *Link) Listen(ln Listeners, fds ...int) {
	dups := make([]int, len(fds))
	for i, fd := range fds {
		dups[i] = fdpass.Dup(fd)
	}
	l.post('L', ln, dups...)
}

// TookOver says the worker, started for an upgrade, took over.
func (l *Link) TookOver() { l.post('T', nil) }

// HandedOver tells the keeper that this worker handed everything over to the worker the keeper
// started for an upgrade, and waits up to timeout until the keeper has read it (false: it did not
// in time). Call it before saying go: from then on that worker is the worker, before its own T
// (TookOver) as after, so that its death is a crash the keeper restarts from, not a failed
// upgrade with nobody left serving. Nothing on a nil Link.
func (l *Link) HandedOver(timeout time.Duration) bool {
	if l == nil {
		return false
	}
	l.post('G', nil)
	return l.Sync(timeout)
}

// AskUpgrade asks the keeper for an upgrade in place: it starts the new worker.
func (l *Link) AskUpgrade() { l.post('P', nil) }

// Restore takes everything the keeper holds, for a worker started after the previous one died:
// the listening sockets (listen takes them, or fails Restore), then each connection, given to take
// with its client's socket, its store's (-1: not connected) and its own (OpenedWith). The
// descriptors are the caller's.
func (l *Link) Restore(listen func(Listeners, []int) error, take func(c Conn, cfd, ufd int, extra []int)) error {
	l.post('Q', nil)
	var ln Listeners
	fds, err := l.c.Expect('S', replyTimeout, &ln)
	if err != nil {
		return err
	}
	if err := listen(ln, fds); err != nil {
		return err
	}
	for {
		kind, body, fds, err := l.c.Recv(replyTimeout)
		if err != nil {
			return err
		}
		if kind == 'E' {
			return nil
		}
		var c Conn
		bad := kind != 'C' || json.Unmarshal(body, &c) != nil
		up := 0
		if c.HasUp {
			up = 1
		}
		if bad || c.Extra < 0 || len(fds) != 1+up+c.Extra {
			fdpass.CloseFds(fds)
			l.log.Warn("keeper: a connection could not be restored", "packet", string(kind))
			continue
		}
		ufd := -1
		if c.HasUp {
			ufd = fds[1]
		}
		take(c, fds[0], ufd, fds[1+up:])
	}
}
