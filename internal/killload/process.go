package killload

import (
	"bytes"
	"os/exec"
	"sync"
	"syscall"
	"testing"
)

// Log is a process's output, which a test may read while the process writes it.
type Log struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Process starts cmd, in a process group of its own (a keeper's worker goes with it), with its
// output in the returned Log, until the test ends: it then gets SIGTERM and is waited for, and
// its log is shown if the test failed.
func Process(t testing.TB, cmd *exec.Cmd) *Log {
	t.Helper()
	l := &Log{}
	cmd.Stdout, cmd.Stderr = l, l
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("%s's log:\n%s", cmd.Path, l.String())
		}
	})
	return l
}
