// Package killload is the load and the kills of the tests that kill a guard's forwarding process
// under its keeper: clients that send a message and read its reply as fast as they come, and a
// kill -9 of the process a pid file names, until its keeper has started the next; and the
// guard process itself, with its log (Process).
package killload

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Load is clients each sending msg through one connection and reading a reply of replyLen
// bytes, again and again, until Stop.
type Load struct {
	done  atomic.Int64
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	errs  []error
	conns []net.Conn
}

// Start connects clients to addr (waiting up to 10 s for it to listen) and starts them.
func Start(addr string, clients int, msg []byte, replyLen int) (*Load, error) {
	l := &Load{stop: make(chan struct{})}
	for i := range clients {
		c, err := dial(addr)
		if err != nil {
			l.Stop()
			return nil, err
		}
		l.conns = append(l.conns, c)
		l.wg.Add(1)
		go l.run(i, c, msg, replyLen)
	}
	return l, nil
}

func dial(addr string) (net.Conn, error) {
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil || time.Now().After(end) {
			return c, err
		}
	}
}

func (l *Load) run(i int, c net.Conn, msg []byte, replyLen int) {
	defer l.wg.Done()
	reply := make([]byte, replyLen)
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		c.SetDeadline(time.Now().Add(10 * time.Second)) // a request lost on the way fails, not hangs
		_, err := c.Write(msg)
		if err == nil {
			_, err = io.ReadFull(c, reply)
		}
		if err != nil {
			l.mu.Lock()
			l.errs = append(l.errs, fmt.Errorf("client %d after %d requests in all: %w", i, l.done.Load(), err))
			l.mu.Unlock()
			return
		}
		l.done.Add(1)
	}
}

// Stop stops the clients, closes their connections and returns the requests answered and the
// clients' failures.
func (l *Load) Stop() (done int64, errs []error) {
	close(l.stop)
	l.wg.Wait()
	for _, c := range l.conns {
		c.Close()
	}
	return l.done.Load(), l.errs
}

// WaitPid waits up to timeout for pidFile to name a process other than old, and returns it.
func WaitPid(pidFile string, old int, timeout time.Duration) (int, error) {
	return waitPid(pidFile, old, timeout, 20*time.Millisecond)
}

// waitPid is WaitPid reading the pid file every poll.
func waitPid(pidFile string, old int, timeout, poll time.Duration) (int, error) {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(poll) {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 && pid != old {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("%s names no process but %d after %s", pidFile, old, timeout)
}

// UpgradeThenKill asks the forwarding process pidFile names for an upgrade in place (SIGUSR2),
// kills the new process with SIGKILL within a millisecond of its writing the pid file, and waits
// for its keeper to start the next; times times, each after the process served for gap.
func UpgradeThenKill(pidFile string, times int, gap time.Duration) error {
	pid, err := WaitPid(pidFile, 0, 20*time.Second)
	if err != nil {
		return err
	}
	for range times {
		time.Sleep(gap)
		if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
			return errors.Join(fmt.Errorf("kill -USR2 %d", pid), err)
		}
		next, err := waitPid(pidFile, pid, 20*time.Second, time.Millisecond) // act on it within a millisecond
		if err != nil {
			return err
		}
		if err := syscall.Kill(next, syscall.SIGKILL); err != nil {
			return errors.Join(fmt.Errorf("kill -9 %d", next), err)
		}
		if pid, err = WaitPid(pidFile, next, 20*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// UpgradeThenKillAfter asks for an upgrade in place as UpgradeThenKill does, and kills the
// worker its keeper (PID keeper) starts for it delay after that process appears, once for each
// of delays: before it said ready (the upgrade fails and the old worker goes on), while it takes
// over, or after. Each round starts, gap after the last, from the worker the pid file then names.
func UpgradeThenKillAfter(pidFile string, keeper int, delays []time.Duration, gap time.Duration) error {
	for _, d := range delays {
		if _, err := waitLive(pidFile, 20*time.Second); err != nil {
			return err
		}
		time.Sleep(gap) // it serves by then (an upgrade asked of a worker still starting is refused)
		pid, err := waitLive(pidFile, 20*time.Second)
		if err != nil {
			return err
		}
		before := childrenOf(keeper)
		if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
			return errors.Join(fmt.Errorf("kill -USR2 %d", pid), err)
		}
		next := 0
		for end := time.Now().Add(20 * time.Second); next == 0; {
			for c := range childrenOf(keeper) {
				if !before[c] {
					next = c
				}
			}
			if next == 0 && time.Now().After(end) {
				return fmt.Errorf("the keeper %d started no worker for an upgrade in 20 s", keeper)
			}
			time.Sleep(200 * time.Microsecond)
		}
		time.Sleep(d)
		// ESRCH: it ended by itself (an upgrade the old worker refused)
		if err := syscall.Kill(next, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
			return errors.Join(fmt.Errorf("kill -9 %d", next), err)
		}
	}
	return nil
}

// waitLive waits up to timeout for pidFile to name a live process (not a zombie), and returns it.
func waitLive(pidFile string, timeout time.Duration) (int, error) {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			if st, ppid := stat(pid); st != "" && st != "Z" && ppid > 0 {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("%s names no live process after %s", pidFile, timeout)
}

// childrenOf is the live processes whose parent is ppid.
func childrenOf(ppid int) map[int]bool {
	m := map[int]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, pp := stat(pid); pp == ppid && st != "Z" && st != "" {
			m[pid] = true
		}
	}
	return m
}

// stat is a process's state letter and parent PID (/proc/PID/stat); "" if there is none.
func stat(pid int) (state string, ppid int) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0
	}
	i := strings.LastIndexByte(string(b), ')') // the command's name may hold spaces and parentheses
	if i < 0 {
		return "", 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return "", 0
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0], ppid
}

// Kill kills the forwarding process pidFile names times times with SIGKILL, each after it has
// served for gap (over 1 s: a keeper restarts at once a process that lived that long), and waits
// each time for its keeper to start the next.
func Kill(pidFile string, times int, gap time.Duration) error {
	pid, err := WaitPid(pidFile, 0, 20*time.Second)
	if err != nil {
		return err
	}
	for range times {
		time.Sleep(gap)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return errors.Join(fmt.Errorf("kill -9 %d", pid), err)
		}
		if pid, err = WaitPid(pidFile, pid, 20*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// Run puts clients' load on addr while the process pidFile names is killed kills times (Kill,
// each after 1.1 s), then for 0.5 s more, and returns the requests answered; err says what failed:
// a kill, or clients (each of their failures).
func Run(addr, pidFile string, clients, kills int, msg []byte, replyLen int) (done int64, err error) {
	return RunWith(addr, clients, msg, replyLen, func() error { return Kill(pidFile, kills, 1100*time.Millisecond) })
}

// RunWith is Run with what happens to the guard under load: act (Kill, UpgradeThenKill).
func RunWith(addr string, clients int, msg []byte, replyLen int, act func() error) (done int64, err error) {
	l, err := Start(addr, clients, msg, replyLen)
	if err != nil {
		return 0, err
	}
	kerr := act()
	time.Sleep(500 * time.Millisecond)
	done, errs := l.Stop()
	return done, errors.Join(append([]error{kerr}, errs...)...)
}
