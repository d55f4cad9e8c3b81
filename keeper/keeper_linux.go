// Package keeper is storeguard's crash guard: a minimal parent process that holds a copy of every
// socket the forwarding process (its worker, `storeguard serve` as its child) has, and starts a
// new worker with them all when the worker dies. A `kill -9` of the process that forwards, or a
// crash, then costs no connection: the clients and the store never see a close.
//
// The keeper reads nothing from the network and decodes nothing: it keeps descriptors, which the
// worker sends it as it accepts, connects and closes, and starts workers. Link is the worker's end
// of that link (link_linux.go).
// It also runs upgrades in place (SIGUSR2, to it or to the worker): it starts the new worker with
// a hand-over socket to the old one, which hands everything over with its full state, as without a
// keeper.
//
// What a crash loses and what it keeps is in docs/design.md ("Zero downtime").
package keeper

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/internal/fdpass"
)

// Packets between a worker and its keeper (fdpass, a kind byte and a JSON body):
//
//	worker → keeper  L  the listening sockets (Listeners), with their descriptors (and the ledger's)
//	                 O  a connection accepted (Conn), with the client's socket (and Conn.Extra more)
//	                 U  its store connection (Conn.ID), with the store's socket
//	                 D  it ended (Conn.ID): the keeper closes its copies
//	                 M  many of O, U and D at once ([]Change), with their descriptors in order
//	                 Q  a restarted worker asks for everything: S, then a C per connection, then E
//	                 T  a worker started for an upgrade took over: it is the worker now
//	                 G  the worker handed everything over to the one started for an upgrade (it
//	                    says go next): that one is the worker now, even if it dies before its T
//	                 P  please upgrade (the worker got SIGUSR2)
//	                 F  flush: the keeper answers f once it has read every packet before
//	                 K  kill the worker started for an upgrade: the hand-over failed after it may
//	                    have taken connections; the keeper answers k once it is gone
//	keeper → worker  H  hand over to the worker started for an upgrade, through this socket
//	                 N  the upgrade asked for could not start (why): the worker records it
//	                 S, C, E  the answer to Q

type held struct {
	meta     Conn
	cfd, ufd int
	xfds     []int // meta.Extra more
}

type worker struct {
	cmd    *exec.Cmd
	ctl    *fdpass.Conn
	sendMu sync.Mutex
	start  time.Time
	exited chan struct{}
	read   chan struct{} // closed once every packet it sent was read
}

func (w *worker) send(kind byte, v any, fds ...int) error {
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	return w.ctl.Send(kind, v, fds...)
}

// Keeper holds the descriptors and runs the workers.
type Keeper struct {
	exe  string
	args []string
	log  *slog.Logger

	mu        sync.Mutex
	lnFds     []int
	ln        Listeners
	listened  bool // a worker gave its listeners: from then on one serves, or is to
	conns     map[uint64]*held
	nextID    uint64
	current   *worker
	upgrading *worker // started for an upgrade, not taken over yet
	stopping  bool

	exits    chan *worker
	upgrades chan struct{}
	took     chan struct{} // T: the worker started for an upgrade took over
}

// New is a keeper that runs exe with args (a serve command line) as its worker.
func New(exe string, args []string, log *slog.Logger) *Keeper {
	return &Keeper{exe: exe, args: args, log: log, conns: map[uint64]*held{}, exits: make(chan *worker, 4),
		upgrades: make(chan struct{}, 1), took: make(chan struct{}, 1)}
}

// Run starts the worker and keeps it running until SIGTERM or SIGINT, which it passes on; it
// returns the exit status to exit with.
func (k *Keeper) Run() int {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR2)
	w, err := k.spawn(false, nil)
	if err != nil {
		k.log.Error("keeper: cannot start the worker", "err", err)
		return 2
	}
	k.setCurrent(w)
	crashes := 0
	for {
		select {
		case sig := <-sigs:
			switch sig {
			case syscall.SIGUSR2:
				k.upgrade()
			case syscall.SIGHUP:
				k.signalCurrent(sig)
			default:
				k.mu.Lock()
				k.stopping = true
				idle := k.current == nil // between a death and a restart: nothing to wait for
				k.mu.Unlock()
				if idle {
					k.closeAll()
					return 0
				}
				k.signalCurrent(sig)
			}
		case <-k.upgrades:
			k.upgrade()
		case w := <-k.exits:
			// Every packet it sent is read first: its last closes are done (none of those comes back
			// to life), and a T it sent before it died (a worker started for an upgrade, killed as
			// it took over) makes it the worker, and its end a crash.
			<-w.read
			k.awaitSuccessor(w)
			code, again := k.exited(w)
			if !again {
				if code >= 0 {
					k.mu.Lock()
					if u := k.upgrading; u != nil { // it would outlive the keeper with copies of every socket
						u.cmd.Process.Kill()
					}
					k.mu.Unlock()
					k.closeAll()
					return code
				}
				continue
			}
			if time.Since(w.start) < time.Second { // died at once: a bad binary or configuration
				crashes++
			} else {
				crashes = 0
			}
			k.mu.Lock()
			stopping := k.stopping
			k.mu.Unlock()
			if stopping {
				k.closeAll()
				return 0
			}
			if crashes > 0 { // a worker that dies at once is not restarted in a tight loop
				time.Sleep(min(time.Duration(1<<min(crashes, 6))*100*time.Millisecond, 5*time.Second))
			}
			nw, err := k.spawn(true, nil)
			if err != nil {
				k.log.Error("keeper: cannot restart the worker; retrying", "err", err)
				k.exits <- w // try again after the pause
				crashes++
				continue
			}
			k.setCurrent(nw)
		}
	}
}

// awaitSuccessor waits, when the worker w that ended was handing over to a worker started for an
// upgrade, until that one took over (T) or ended: the old worker exits right after the hand-over,
// possibly before the keeper read the new one's T, and must not be taken for a crash then.
func (k *Keeper) awaitSuccessor(w *worker) {
	k.mu.Lock()
	next := k.upgrading
	pending := w == k.current && next != nil
	k.mu.Unlock()
	if !pending {
		return
	}
	select {
	case <-k.took:
	case <-next.exited:
		<-next.read // a T it sent before it died is read: then it is the worker, and w is not
	case <-time.After(ackWait):
	}
}

// ackWait bounds how long the keeper waits for an upgrade's new worker to say it took over.
const ackWait = 70 * time.Second

// exited handles a worker's end: again, when it was the worker and must be replaced; code >= 0,
// when the keeper is to exit with it.
func (k *Keeper) exited(w *worker) (code int, again bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	status := w.cmd.ProcessState
	if w == k.upgrading {
		k.upgrading = nil
		k.log.Warn("keeper: the worker started for an upgrade exited; the worker goes on", "status", status.String())
		return -1, false
	}
	if w != k.current {
		k.log.Info("keeper: the previous worker exited after handing over", "pid", w.cmd.Process.Pid)
		return -1, false
	}
	if k.stopping || status.Success() { // asked to stop, or it stopped by itself (SIGTERM to it): so does the keeper
		if code := status.ExitCode(); code >= 0 {
			return code, false
		}
		return 0, false // the signal passed on ended it before it had a handler: stopped as asked
	}
	if !k.listened && len(k.conns) == 0 && status.ExitCode() > 0 {
		// it failed before it listened (its configuration, its certificates, its peer set): a
		// new one would fail the same way, and there is nothing to keep
		k.log.Error("keeper: the worker failed before it listened; not restarting it", "pid", w.cmd.Process.Pid,
			"status", status.String())
		return status.ExitCode(), false
	}
	k.log.Error("keeper: the worker died; restarting it with every connection", "pid", w.cmd.Process.Pid,
		"status", status.String(), "connections", len(k.conns))
	k.current = nil
	return -1, true
}

func (k *Keeper) setCurrent(w *worker) {
	k.mu.Lock()
	k.current = w
	k.mu.Unlock()
}

func (k *Keeper) signalCurrent(sig os.Signal) {
	k.mu.Lock()
	w := k.current
	k.mu.Unlock()
	if w != nil {
		w.cmd.Process.Signal(sig)
	}
}

// upgrade starts a worker that takes over from the current one. When it cannot, the worker is
// told why (N), to record it for storeguard upgrade.
func (k *Keeper) upgrade() {
	select { // a T from an earlier upgrade, not read
	case <-k.took:
	default:
	}
	k.mu.Lock()
	cur, busy := k.current, k.upgrading != nil
	k.mu.Unlock()
	if cur == nil || busy {
		k.log.Warn("keeper: upgrade asked while no worker runs or an upgrade is under way; ignored")
		return // the one under way says how it ended
	}
	failed := func(why string, err error) {
		k.log.Error("keeper: upgrade failed: "+why+"; the worker goes on", "err", err)
		cur.send('N', fmt.Sprintf("the keeper %s: %v", why, err))
	}
	mine, theirs, err := fdpass.Pair()
	if err != nil {
		failed("could not make the hand-over socket", err)
		return
	}
	defer mine.Close()
	w, err := k.spawn(false, theirs)
	theirs.Close()
	if err != nil {
		failed("could not start the new worker", err)
		return
	}
	k.mu.Lock()
	k.upgrading = w
	k.mu.Unlock()
	if err := cur.send('H', nil, int(mine.Fd())); err != nil {
		k.log.Error("keeper: upgrade failed: cannot reach the worker", "err", err)
		w.cmd.Process.Kill()
	}
}

// spawn starts a worker; restore: it takes over from one that died; handover: the hand-over
// socket to the worker it takes over from.
func (k *Keeper) spawn(restore bool, handover *os.File) (*worker, error) {
	mine, theirs, err := fdpass.Pair()
	if err != nil {
		return nil, err
	}
	defer theirs.Close()
	ctl, err := fdpass.New(mine)
	mine.Close()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(k.exe, k.args...)
	cmd.Env = append(ChildEnv(), Env+"=3")
	cmd.ExtraFiles = []*os.File{theirs}
	if handover != nil {
		cmd.Env = append(cmd.Env, HandoverEnv+"=4")
		cmd.ExtraFiles = append(cmd.ExtraFiles, handover)
	}
	if restore {
		cmd.Env = append(cmd.Env, RestoreEnv+"=1")
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// A keeper that dies (it decodes nothing, so this is a kill) takes its worker with it, drained:
	// an orphan would hold every socket with nobody left to restart it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		ctl.Close()
		return nil, fmt.Errorf("starting %s: %w", k.exe, err)
	}
	w := &worker{cmd: cmd, ctl: ctl, start: time.Now(), exited: make(chan struct{}), read: make(chan struct{})}
	go k.serveWorker(w)
	go func() {
		cmd.Wait()
		close(w.exited)
		k.exits <- w
	}()
	return w, nil
}

// serveWorker reads a worker's packets until its socket closes.
func (k *Keeper) serveWorker(w *worker) {
	defer close(w.read)
	defer w.ctl.Close()
	for {
		kind, body, fds, err := w.ctl.Recv(0)
		if err != nil {
			return
		}
		if err := k.packet(w, kind, body, fds); err != nil {
			k.log.Warn("keeper: bad packet from the worker", "kind", string(kind), "err", err)
		}
	}
}

func (k *Keeper) packet(w *worker, kind byte, body []byte, fds []int) error {
	var c Conn
	switch kind {
	case 'O', 'U', 'D':
		if err := json.Unmarshal(body, &c); err != nil {
			fdpass.CloseFds(fds)
			return err
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.conn(kind, c, fds)
	case 'M':
		var batch []Change
		if err := json.Unmarshal(body, &batch); err != nil {
			fdpass.CloseFds(fds)
			return err
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		var first error
		for _, ch := range batch {
			n := 0
			switch ch.Kind {
			case 'D':
			case 'O':
				n = min(1+max(ch.Conn.Extra, 0), len(fds))
			default: // U, and one the keeper does not know: its descriptor goes with it
				n = min(1, len(fds))
			}
			if err := k.conn(ch.Kind, ch.Conn, fds[:n]); err != nil && first == nil {
				first = err
			}
			fds = fds[n:]
		}
		fdpass.CloseFds(fds) // more than the changes named: none expected
		return first
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if kind != 'L' { // the only one of these that carries descriptors
		fdpass.CloseFds(fds)
	}
	switch kind {
	case 'L':
		var ln Listeners
		if err := json.Unmarshal(body, &ln); err != nil {
			fdpass.CloseFds(fds)
			return fmt.Errorf("listeners: %v", err)
		}
		// None: the worker shuts down, and the sockets close with its own.
		fdpass.CloseFds(k.lnFds)
		k.lnFds, k.ln, k.listened = fds, ln, true
	case 'T':
		if w == k.upgrading {
			k.tookOver("keeper: the new worker took over")
		}
	case 'G':
		if k.upgrading != nil && w == k.current {
			k.tookOver("keeper: the worker handed over to the new one")
		}
	case 'P':
		select {
		case k.upgrades <- struct{}{}:
		default:
		}
	case 'K':
		if u := k.upgrading; u != nil {
			u.cmd.Process.Kill()
			k.mu.Unlock()
			<-u.exited
			k.mu.Lock()
		}
		go w.send('k', nil)
	case 'Q':
		return k.restore(w)
	case 'F':
		go w.send('f', nil)
	default:
		return fmt.Errorf("unknown packet")
	}
	return nil
}

// tookOver makes the worker started for an upgrade the worker (k.mu held).
func (k *Keeper) tookOver(msg string) {
	u := k.upgrading
	k.upgrading, k.current = nil, u
	k.log.Info(msg, "pid", u.cmd.Process.Pid)
	select {
	case k.took <- struct{}{}:
	default:
	}
}

// conn applies one change to the connections held (k.mu held): O, U or D, with its descriptor.
func (k *Keeper) conn(kind byte, c Conn, fds []int) error {
	switch kind {
	case 'O':
		if c.Extra < 0 || len(fds) != 1+c.Extra {
			fdpass.CloseFds(fds)
			return fmt.Errorf("connection %d: %d descriptors", c.ID, len(fds))
		}
		if old := k.conns[c.ID]; old != nil {
			old.close()
		}
		k.conns[c.ID] = &held{meta: c, cfd: fds[0], ufd: -1, xfds: fds[1:]}
		k.nextID = max(k.nextID, c.ID+1)
	case 'U':
		h := k.conns[c.ID]
		if h == nil || len(fds) != 1 || h.ufd >= 0 {
			fdpass.CloseFds(fds)
			return fmt.Errorf("store connection of %d: unknown, or %d descriptors", c.ID, len(fds))
		}
		h.ufd = fds[0]
	case 'D':
		fdpass.CloseFds(fds)
		if h := k.conns[c.ID]; h != nil {
			h.close()
			delete(k.conns, c.ID)
		}
	default:
		fdpass.CloseFds(fds)
		return fmt.Errorf("unknown change %q", kind)
	}
	return nil
}

// restore sends a restarted worker everything held (k.mu held).
func (k *Keeper) restore(w *worker) error {
	ln := k.ln
	ln.NextID = k.nextID
	if err := w.send('S', ln, k.lnFds...); err != nil {
		return err
	}
	for _, h := range k.conns {
		meta := h.meta
		fds := []int{h.cfd}
		if meta.HasUp = h.ufd >= 0; meta.HasUp {
			fds = append(fds, h.ufd)
		}
		fds = append(fds, h.xfds...)
		if err := w.send('C', meta, fds...); err != nil {
			return err
		}
	}
	k.log.Info("keeper: handed every connection to the restarted worker", "connections", len(k.conns),
		"pid", w.cmd.Process.Pid)
	return w.send('E', len(k.conns))
}

func (h *held) close() {
	fdpass.CloseFds([]int{h.cfd})
	if h.ufd >= 0 {
		fdpass.CloseFds([]int{h.ufd})
	}
	fdpass.CloseFds(h.xfds)
}

// closeAll closes every descriptor held (the keeper exits).
func (k *Keeper) closeAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for id, h := range k.conns {
		h.close()
		delete(k.conns, id)
	}
	fdpass.CloseFds(k.lnFds)
	k.lnFds = nil
}
