//go:build linux

package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"time"

	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/keeper"
	"github.com/storeguard/storeguard/upgrade"
)

// An upgrade in place (SIGUSR2): the binary at the path storeguard was started from is started
// with the same arguments and a hand-over socket, takes the listening sockets and every
// connection over (proxy.HandOver, package upgrade), and this process then exits. A failure at any step leaves
// this process serving, and says why.

// upgrader starts the next process.
type upgrader struct {
	exe  string   // the binary's path, as the process started
	args []string // the command line, without the program name
	log  *slog.Logger
}

func newUpgrader(log *slog.Logger) *upgrader {
	exe, err := os.Executable() // on Linux /proc/self/exe, with a " (deleted)" suffix removed: the path, replaced or not
	if err != nil {
		exe = os.Args[0]
	}
	return &upgrader{exe: exe, args: os.Args[1:], log: log}
}

// handOverer is what an upgrade hands over: a serving guard (proxy.Server) or a client guard
// (connect.Client).
type handOverer interface {
	HandOver(peer *os.File, exited <-chan struct{}) (int, error)
}

// upgrade hands everything over to a new process; nil once it has it all (Serve then returns).
func (u *upgrader) upgrade(srv handOverer) error {
	mine, theirs, err := fdpass.Pair()
	if err != nil {
		return err
	}
	defer mine.Close()
	cmd := exec.Command(u.exe, u.args...)
	cmd.Env = append(keeper.ChildEnv(), keeper.HandoverEnv+"=3")
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	u.log.Info("upgrade: starting the new process", "path", u.exe)
	if err := cmd.Start(); err != nil {
		theirs.Close()
		return fmt.Errorf("starting %s: %w", u.exe, err)
	}
	theirs.Close()
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	n, err := srv.HandOver(mine, exited)
	if err == nil {
		u.log.Info("upgrade: the new process serves; exiting", "pid", cmd.Process.Pid, "connections", n)
		return nil
	}
	select {
	case <-exited: // it failed by itself (most often): say how
		err = fmt.Errorf("%w (the new process: %v)", err, waitErr)
	case <-time.After(exitGrace):
		cmd.Process.Kill() // it may hold connections: gone before this process goes on with them
		<-exited
	}
	upgrade.Thaw(err)
	return err
}

// exitGrace is how long a new process that failed has to exit by itself, which says how it
// failed, before it is killed: traffic may be frozen meanwhile (upgrade.Thaw waits for its end).
const exitGrace = 250 * time.Millisecond
