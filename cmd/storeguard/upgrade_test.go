//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/killload"
	"github.com/storeguard/storeguard/internal/pidfile"
	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
)

// buildBinary builds storeguard into dir: upgrades start the binary at the running one's path.
func buildBinary(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "storeguard")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestUpgradesAndCrashesLoseNothing runs the real binary under its keeper in front of a recording
// store while a client adds in a loop on one connection, each ADD in two writes 1 ms apart as
// torch 1.13's client sends its fields: four upgrades (storeguard upgrade) and four kill -9 of the
// forwarding process find some ADDs half received. No request failed and the store got every ADD
// exactly once. Then a client that sends half an ADD and ends its stream is closed, and the store
// gets none of it. On the event loops and on goroutines alone.
func TestUpgradesAndCrashesLoseNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t, t.TempDir())
	onBothTransports(t, func(t *testing.T, extra []string) { upgradesAndCrashes(t, bin, extra...) })
}

// waitWorker waits up to 20 s for the pid file to name a forwarding process other than old.
func waitWorker(t *testing.T, pidFile string, old int) int {
	t.Helper()
	pid, err := killload.WaitPid(pidFile, old, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// onBothTransports runs f as subtests: on the event loops, and on goroutines alone (extra: the
// serve flags that say which).
func onBothTransports(t *testing.T, f func(t *testing.T, extra []string)) {
	for _, tc := range []struct {
		name  string
		extra []string
	}{{"event loops", nil}, {"goroutines", []string{"--event-loops", "-1"}}} {
		t.Run(tc.name, func(t *testing.T) { f(t, tc.extra) })
	}
}

func upgradesAndCrashes(t *testing.T, bin string, extra ...string) {
	dir := t.TempDir()
	store, addr, pidFile, logs := startKeeper(t, bin, dir, extra...)
	c := dialEventually(t, addr)
	defer c.Close()
	add, err := protocol.Append(nil, protocol.G0, protocol.Request{Op: protocol.OpAdd, Key: []byte("/ctr"), Int: 1})
	if err != nil {
		t.Fatal(err)
	}
	var adds, failed atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		reply := make([]byte, 8)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			const cut = 5 // the opcode and the start of the key's length
			if _, err := c.Write(add[:cut]); err != nil {
				failed.Add(1)
				return
			}
			time.Sleep(time.Millisecond)
			if _, err := c.Write(add[cut:]); err != nil {
				failed.Add(1)
				return
			}
			if _, err := io.ReadFull(c, reply); err != nil {
				failed.Add(1)
				return
			}
			adds.Add(1)
		}
	}()
	waitPid := func(old int) int { return waitWorker(t, pidFile, old) }
	pid := waitPid(0)
	for i := range 8 {
		time.Sleep(300 * time.Millisecond)
		if i%2 == 0 { // an upgrade, as an operator runs it
			out, err := exec.Command(bin, "upgrade", "--pid-file", pidFile, "--timeout", "20s").CombinedOutput()
			if err != nil {
				t.Fatalf("upgrade %d: %v\n%s", i, err, out)
			}
		} else {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		pid = waitPid(pid)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	<-done
	if failed.Load() != 0 {
		t.Fatalf("a request failed after %d adds", adds.Load())
	}
	got := countOps(t, store.Received(0), protocol.OpAdd)
	if got != adds.Load() || adds.Load() < 50 {
		t.Fatalf("the store got %d ADDs; the client completed %d", got, adds.Load())
	}
	half := dialEventually(t, addr)
	defer half.Close()
	half.Write(add[:5])
	time.Sleep(50 * time.Millisecond) // judged, and held
	half.(*net.TCPConn).CloseWrite()
	half.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := half.Read(make([]byte, 8)); err != io.EOF {
		t.Fatalf("half an ADD, then the end of the stream: read %d, %v; want the guard to close it", n, err)
	}
	for i := 1; i < store.NumConns(); i++ {
		if b := store.Received(i); len(b) > 0 {
			t.Fatalf("the store got %q of half an ADD", b)
		}
	}
	if !strings.Contains(logs.String(), "handover complete") || !strings.Contains(logs.String(), "took every connection back from the keeper") {
		t.Errorf("log lacks the hand-overs:\n%s", logs.String())
	}
}

// TestAHalfMessageOutlivesAnUpgradeAndACrash: a client sends the start of an ADD, the guard is
// upgraded in place, its new forwarding process is killed (-9) before the rest comes, then the
// rest comes: the keeper's restart must go on with the message, not close the connection as
// restart_lost_request. Before the upgrade handed its hold on (upgrade.Conn.InSocket), the start
// lived in the new process's memory only and died with it. On the event loops and on goroutines.
func TestAHalfMessageOutlivesAnUpgradeAndACrash(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t, t.TempDir())
	onBothTransports(t, func(t *testing.T, extra []string) {
		store, addr, pidFile, logs := startKeeper(t, bin, t.TempDir(), extra...)
		c := dialEventually(t, addr)
		defer c.Close()
		add, err := protocol.Append(nil, protocol.G0, protocol.Request{Op: protocol.OpAdd, Key: []byte("/ctr"), Int: 1})
		if err != nil {
			t.Fatal(err)
		}
		reply := make([]byte, 8)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write(add); err != nil { // connects the store: the half below is not the first message
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, reply); err != nil {
			t.Fatal(err)
		}
		waitPid := func(old int) int { return waitWorker(t, pidFile, old) }
		pid := waitPid(0)
		c.Write(add[:5])
		time.Sleep(100 * time.Millisecond) // read, judged and held by the worker
		if out, err := exec.Command(bin, "upgrade", "--pid-file", pidFile, "--timeout", "20s").CombinedOutput(); err != nil {
			t.Fatalf("upgrade: %v\n%s", err, out)
		}
		pid = waitPid(pid)
		syscall.Kill(pid, syscall.SIGKILL)
		waitPid(pid)
		c.Write(add[5:])
		if _, err := io.ReadFull(c, reply); err != nil {
			t.Fatalf("the ADD begun before the upgrade and the crash: %v\n%s", err, logs.String())
		}
		if got := countOps(t, store.Received(0), protocol.OpAdd); got != 2 {
			t.Fatalf("the store got %d ADDs, want 2", got)
		}
		if strings.Contains(logs.String(), "restart_lost_request") {
			t.Fatalf("a restored connection was closed as restart_lost_request:\n%s", logs.String())
		}
	})
}

// TestKillsUnderLoadLoseNothing kills the forwarding process 6 times while 8 clients send ADDs as
// fast as the store answers: most kills find the worker between reading a message and writing it
// on, or between reading a reply and passing it back. Its keeper's new worker must go on from the
// kernel's byte counts: no request fails or hangs, and the store gets every ADD exactly once.
func TestKillsUnderLoadLoseNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	store, addr, pidFile, logs := startKeeper(t, bin, dir)
	add, err := protocol.Append(nil, protocol.G0, protocol.Request{Op: protocol.OpAdd, Key: []byte("/ctr"), Int: 1})
	if err != nil {
		t.Fatal(err)
	}
	adds, err := killload.Run(addr, pidFile, 8, 6, add, 8)
	if err != nil {
		t.Fatal(err)
	}
	var got int64
	for i := range store.NumConns() {
		got += countOps(t, store.Received(i), protocol.OpAdd)
	}
	if got != adds || adds < 500 {
		t.Fatalf("the store got %d ADDs; the clients completed %d", got, adds)
	}
	if n := strings.Count(logs.String(), "took every connection back from the keeper\" connections=8"); n != 6 {
		t.Errorf("%d restarts with the 8 connections in the log, not 6", n)
	}
	t.Logf("%d ADDs through 6 kills", got)
}

// startKeeper runs `storeguard serve --keeper` (G0), with extra flags, in front of a recording
// store, until the test ends; its log is in logs.
func startKeeper(t *testing.T, bin, dir string, extra ...string) (store *storesim.Store, addr, pidFile string, logs *killload.Log) {
	t.Helper()
	store, err := storesim.StartRecorder("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	store.Answer(protocol.GenSetting{Gen: protocol.G0})
	addr = freeAddr(t)
	pidFile = filepath.Join(dir, "worker.pid")
	args := []string{"serve", "--keeper", "--listen", addr, "--upstream", store.Addr(), "--generation", "1.13",
		"--metrics-listen", "", "--log-format", "text", "--pid-file", pidFile}
	logs = killload.Process(t, exec.Command(bin, append(args, extra...)...))
	return store, addr, pidFile, logs
}

// countOps decodes a G0 stream and counts its messages of op.
func countOps(t *testing.T, b []byte, op protocol.Op) int64 {
	t.Helper()
	lim := protocol.Limits{MaxKeyBytes: 1 << 20, MaxValueBytes: 1 << 20, MaxKeys: 1 << 10, MaxMessageBytes: 1 << 22}
	d := protocol.NewDecoder(protocol.Config{Gen: protocol.GenSetting{Gen: protocol.G0}, Limits: lim})
	var n int64
	for len(b) > 0 {
		k, msg, err := d.Scan(b)
		if err != nil {
			t.Fatalf("the store got a stream that does not decode: %v", err)
		}
		b = b[k:]
		if msg != nil && msg.Op == op {
			n++
		}
	}
	if d.InMessage() {
		t.Fatal("the store got half a message")
	}
	return n
}

// TestUpgradeCommandSaysWhyItFailed: the binary at the running storeguard's path is replaced by
// one that fails, and `storeguard upgrade --pid-file` exits non-zero with the reason the old
// process recorded beside its pid file, at once rather than after its --timeout (it used to wait
// 90 s and say nothing of why); the old process serves on. Without a keeper the new binary
// starts and exits 3; under a keeper it cannot be started at all (the keeper tells the worker).
func TestUpgradeCommandSaysWhyItFailed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t, t.TempDir())
	for _, c := range []struct {
		name   string
		keeper bool
		binary string // what replaces the running binary
		why    string
	}{
		{"serve", false, "#!/bin/sh\nexit 3\n", "exit status 3"},
		{"keeper", true, "not a program\n", "exec format error"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			installed := filepath.Join(dir, "storeguard")
			copyFile(t, bin, installed)
			store, err := storesim.StartRecorder("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			store.Answer(protocol.GenSetting{Gen: protocol.G0})
			addr := freeAddr(t)
			pidFile := filepath.Join(dir, "storeguard.pid")
			args := []string{"serve", "--listen", addr, "--upstream", store.Addr(), "--generation", "1.13",
				"--metrics-listen", "", "--log-format", "text", "--pid-file", pidFile}
			if c.keeper {
				args = append(args, "--keeper")
			}
			killload.Process(t, exec.Command(installed, args...))
			client := dialEventually(t, addr)
			defer client.Close()
			numKeys(t, client)
			old := readPidEventually(t, pidFile)

			replacePath(t, installed, c.binary)
			began := time.Now()
			out, err := exec.Command(bin, "upgrade", "--pid-file", pidFile, "--timeout", "60s").CombinedOutput()
			took := time.Since(began)
			if err == nil || !strings.Contains(string(out), c.why) {
				t.Fatalf("upgrade: %v, output %q; want a failure naming %q", err, out, c.why)
			}
			t.Logf("upgrade failed in %v: %s", took.Round(time.Millisecond), out)
			if took > 30*time.Second { // the point: at once, not after --timeout (a loaded CI machine is slow)
				t.Errorf("upgrade took %v to report the failure", took)
			}
			if p := readPidEventually(t, pidFile); p != old {
				t.Errorf("the pid file names %d, not the old process %d", p, old)
			}
			numKeys(t, client) // the old process serves on
		})
	}
}

// TestUpgradeCommandRefusesAStalePidFile: a pid file whose PID another process has (here a
// sleep, and the record of a storeguard that is gone) is refused: nothing is signalled, and the
// process lives (a SIGUSR2 used to kill it).
func TestUpgradeCommandRefusesAStalePidFile(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "storeguard.pid")
	if err := pidfile.NewWriter(pidFile).Write(0); err != nil { // as a storeguard wrote it, then died
		t.Fatal(err)
	}
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	rec, _ := pidfile.ReadRecord(pidFile)
	rec.PID = sleep.Process.Pid // the kernel gave the PID to sleep
	b, _ := json.Marshal(rec)
	os.WriteFile(pidfile.RecordPath(pidFile), b, 0o644)
	os.WriteFile(pidFile, []byte(strconv.Itoa(sleep.Process.Pid)+"\n"), 0o644)

	var out, errOut bytes.Buffer
	status := run([]string{"upgrade", "--pid-file", pidFile, "--timeout", "2s"}, &out, &errOut)
	if status == 0 || !strings.Contains(errOut.String(), "stale pid file") {
		t.Fatalf("upgrade exited %d: %q %q; want a refusal naming the stale pid file", status, out.String(), errOut.String())
	}
	time.Sleep(100 * time.Millisecond)
	if err := sleep.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the process the stale pid file names is gone: %v", err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// replacePath puts content at path as an install does: a new file renamed over it.
func replacePath(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func dialEventually(t *testing.T, addr string) net.Conn {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			return c
		}
		if time.Now().After(end) {
			t.Fatal(err)
		}
	}
}

func readPidEventually(t *testing.T, path string) int {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if p, err := pidfile.ReadPID(path); err == nil {
			return p
		}
		if time.Now().After(end) {
			t.Fatalf("no pid file at %s", path)
		}
	}
}

// numKeys runs a G0 GETNUMKEYS on c and reads its reply.
func numKeys(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	get, err := protocol.Append(nil, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(get); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 8)); err != nil {
		t.Fatalf("no reply: %v", err)
	}
}
