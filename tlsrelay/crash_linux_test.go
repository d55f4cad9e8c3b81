package tlsrelay

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The crash test's relay runs in a child process (this test binary again), which the test kills
// with SIGKILL at random instants and starts again from the sockets and the shared ledger it
// holds, as a keeper does.
const (
	childEnv = "TLSRELAY_TEST_CHILD"
	dieEnv   = "TLSRELAY_TEST_DIE" // point:n, a child's own death
)

// points are the instants between a direction's steps (crashPoint).
var points = []string{"in-read", "in-wrote-part", "in-saved", "out-intent", "out-wrote-part",
	"out-saved", "out-consumed"}

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	os.Exit(m.Run())
}

// child restores the relay of slot 0 (connection 7) from descriptors 3 (TLS), 4 (plaintext) and
// 5 (the ledger), and runs it until it ends.
func child() int {
	writeCap = 3000
	if at, n, ok := strings.Cut(os.Getenv(dieEnv), ":"); ok { // die at the n-th passing of point at
		left, _ := strconv.Atoi(n)
		var mu sync.Mutex
		crashPoint = func(p string) {
			mu.Lock()
			defer mu.Unlock()
			if p == at {
				if left--; left == 0 {
					syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {}
				}
			}
		}
	}
	tlsSock, err1 := FromFd(3)
	plain, err2 := FromFd(4)
	l, err3 := OpenLedger(5)
	if err1 != nil || err2 != nil || err3 != nil {
		fmt.Fprintln(os.Stderr, "child:", err1, err2, err3)
		return 2
	}
	r, err := Restore(tlsSock, plain, l, 0, 7)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: restore:", err)
		return 2
	}
	done := make(chan error, 1)
	r.OnEnd = func(err error) { done <- err }
	r.Run()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "child: relay:", err)
		return 1
	}
	return 0
}

// TestRelaySurvivesKills: a crypto/tls client streams 8 MiB through a relay to an echo and
// reads it back, while the relay's process is killed (SIGKILL) at random instants and started
// again from its sockets and its slot of the shared ledger: every byte arrives once and in
// order, both ways, and the TLS session ends with close_notify both ways. Without the peeked
// records, the counters or the saved state, a kill loses or repeats bytes and the session breaks.
func TestRelaySurvivesKills(t *testing.T) {
	srvCfg, cliCfg := configs(t)
	killLoop(t, srvCfg, cliCfg)
}

func killLoop(t *testing.T, srvCfg, cliCfg *tls.Config) {
	remote, tlsSide := tcpPair(t)
	plainRelay, app := tcpPair(t)
	// Small buffers and readers that pause, so that both directions are often backed up (the
	// relay's writes go in parts of at most writeCap bytes in any case).
	for _, c := range []*net.TCPConn{remote, app} {
		c.SetReadBuffer(32 << 10)
	}
	client, s := handshake(t, remote, tlsSide, srvCfg, cliCfg)
	ledger, err := NewSharedLedger(4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(tlsSide, plainRelay, s, ledger, 7); err != nil { // its state, in slot 0: never run here
		t.Fatal(err)
	}
	files := []*os.File{}
	for _, c := range []interface{ File() (*os.File, error) }{tlsSide, plainRelay} {
		f, err := c.File()
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	files = append(files, os.NewFile(uintptr(ledger.Fd()), "ledger"))
	tlsSide.Close()
	plainRelay.Close()
	died := map[string]int{} // deaths at each point
	start := func() (*exec.Cmd, string) {
		die := points[mrand.IntN(len(points))]
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=1", fmt.Sprintf("%s=%s:%d", dieEnv, die, 1+mrand.IntN(16)))
		cmd.ExtraFiles = files
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, die
	}

	const total = 4 << 20
	data := make([]byte, total)
	rand.Read(data)
	want := sha256.Sum256(data)
	go func() { // the app echoes what it reads back, through the relay, to the client
		io.Copy(app, pausing{app, 30 * time.Millisecond})
		app.CloseWrite()
	}()
	go func() {
		for p := data; len(p) > 0; {
			n := min(len(p), 1+mrand.IntN(40000))
			client.Write(p[:n])
			p = p[n:]
			time.Sleep(time.Duration(mrand.IntN(40)) * time.Millisecond) // about 4 s in all

		}
		client.CloseWrite()
	}()
	got := make(chan [32]byte, 1)
	var echoed int64
	go func() {
		h := sha256.New()
		n, _ := io.Copy(h, pausing{client, 150 * time.Millisecond})
		echoed = n
		var sum [32]byte
		copy(sum[:], h.Sum(nil))
		got <- sum
	}()

	waitFor := func(cmd *exec.Cmd) chan error {
		ch := make(chan error, 1)
		go func() { ch <- cmd.Wait() }()
		return ch
	}
	cmd, die := start()
	exited := waitFor(cmd)
	kills := 0
	var last error = errors.New("still running")
	deadline := time.After(90 * time.Second)
	for {
		pause := time.Duration(100+mrand.IntN(300)) * time.Millisecond // a process starts in about 20 ms
		select {
		case sum := <-got:
			if sum != want {
				t.Fatalf("after %d kills and %v deaths the echo came back different (%d of %d bytes)", kills, died, echoed, total)
			}
			for last != nil { // the relay ends after the echo: a death there is restarted too
				select {
				case last = <-exited:
				case <-time.After(40 * time.Second):
					cmd.Process.Kill()
					t.Fatal("the last relay process did not end")
				}
				if last != nil && last.Error() == "signal: killed" {
					died[die]++
					cmd, die = start()
					exited = waitFor(cmd)
					last = errors.New("still running")
					continue
				}
				if last != nil {
					t.Fatalf("the last relay process: %v", last)
				}
			}
			for _, p := range points {
				if died[p] == 0 {
					t.Errorf("no death at %s: the test proves little", p)
				}
			}
			t.Logf("%d kills from outside, deaths at each point %v; %d bytes each way", kills, died, total)
			return
		case <-deadline:
			cmd.Process.Kill()
			t.Fatalf("after %d kills and %v deaths the echo did not finish (%d bytes back)", kills, died, echoed)
		case err := <-exited:
			if err == nil { // the relay ended: the echo is on its way
				last, exited = nil, nil
				continue
			}
			if err.Error() != "signal: killed" {
				t.Fatalf("a relay process failed: %v", err)
			}
			died[die]++
			cmd, die = start()
			exited = waitFor(cmd)
		case <-time.After(pause):
			if exited == nil {
				continue
			}
			cmd.Process.Kill()
			if err := <-exited; err != nil && err.Error() != "signal: killed" {
				t.Fatalf("the relay process failed before kill %d: %v", kills+1, err)
			}
			kills++
			cmd, die = start()
			exited = waitFor(cmd)
		}
	}
}

// pausing is a reader that now and then stops reading for a while.
type pausing struct {
	r   io.Reader
	max time.Duration
}

func (p pausing) Read(b []byte) (int, error) {
	if mrand.IntN(30) == 0 {
		time.Sleep(time.Duration(mrand.Int64N(int64(p.max))))
	}
	return p.r.Read(b[:min(len(b), 8<<10)])
}

// TestRelayBeyondAFullLedgerRuns: a relay that finds its shared ledger full still runs, with its
// state in its own process (Slot -1: a keeper cannot restore it), and carries bytes both ways.
func TestRelayBeyondAFullLedgerRuns(t *testing.T) {
	srvCfg, cliCfg := configs(t)
	ledger, err := NewSharedLedger(1)
	if err != nil {
		t.Fatal(err)
	}
	var clients []*tls.Conn
	var apps []*net.TCPConn
	for i := range 2 {
		remote, tlsSide := tcpPair(t)
		plainRelay, app := tcpPair(t)
		client, s := handshake(t, remote, tlsSide, srvCfg, cliCfg)
		r, err := New(tlsSide, plainRelay, s, ledger, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		if want := []int{0, -1}[i]; r.Slot() != want {
			t.Fatalf("relay %d: slot %d, want %d", i+1, r.Slot(), want)
		}
		r.Run()
		defer r.Close()
		clients, apps = append(clients, client), append(apps, app)
	}
	c, app := clients[1], apps[1]
	c.SetDeadline(time.Now().Add(5 * time.Second))
	app.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(app, got); err != nil || string(got) != "ping" {
		t.Fatalf("the store side got %q, %v", got, err)
	}
	app.Write([]byte("pong"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "pong" {
		t.Fatalf("the client got %q, %v", got, err)
	}
}
