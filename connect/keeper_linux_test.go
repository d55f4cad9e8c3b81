package connect

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/proxy"
)

// TestKilledClientGuardLosesNothing runs the real binary as `storeguard connect --keeper` between
// 4 ranks that add as fast as the store answers and a serving guard (mutual TLS) in front of a
// recording store, and kills its forwarding process 4 times: each time the keeper starts another,
// which takes every relay back from its slot in the shared ledger and its sockets' byte counts.
// The ranks' connections and their TLS sessions stay open: no request fails, and the store gets
// every ADD exactly once.
func TestKilledClientGuardLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := pki(t, map[string]string{"master": "spiffe://sg.test/master", "worker": "spiffe://sg.test/worker/w1"})
	bin := filepath.Join(t.TempDir(), "storeguard")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/storeguard").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	store, err := storesim.StartRecorder("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	store.Answer(protocol.GenSetting{Gen: protocol.G0})
	cfg := config.Default()
	cfg.Listen, cfg.Upstream, cfg.MetricsListen, cfg.Generation = "127.0.0.1:0", store.Addr(), "", "1.13"
	cfg.TLS = config.TLS{Mode: "on", CertFile: "x", KeyFile: "x", CAFile: "x", Allow: []string{"spiffe://sg.test/worker/*"},
		PlaintextSources: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, HandshakeTimeout: 2 * time.Second}
	srv, err := proxy.New(cfg, proxy.Options{Identity: files(t, dir, "master")})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx)

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	pidFile := filepath.Join(t.TempDir(), "connect.pid")
	var logs bytes.Buffer
	var logMu sync.Mutex
	cmd := exec.Command(bin, "connect", "--keeper", "--listen", addr, "--server", srv.Addr().String(),
		"--tls-cert", filepath.Join(dir, "worker.pem"), "--tls-key", filepath.Join(dir, "worker.key"),
		"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-allow", "spiffe://sg.test/master",
		"--pid-file", pidFile, "--log-format", "text")
	w := writerFunc(func(p []byte) (int, error) { logMu.Lock(); defer logMu.Unlock(); return logs.Write(p) })
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			logMu.Lock()
			t.Logf("storeguard connect's log:\n%s", logs.String())
			logMu.Unlock()
		}
	}()
	waitPid := func(old string) string {
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if b, err := os.ReadFile(pidFile); err == nil && strings.TrimSpace(string(b)) != old && len(b) > 1 {
				return strings.TrimSpace(string(b))
			}
		}
		t.Fatalf("no new forwarding process after pid %s", old)
		return ""
	}
	pid := waitPid("")

	add := enc(t, protocol.Request{Op: protocol.OpAdd, Key: []byte("/ctr"), Int: 1})
	const ranks = 4
	var adds atomic.Int64
	failures := make(chan error, ranks)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range ranks {
		rank, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer rank.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			reply := make([]byte, 8)
			for {
				select {
				case <-stop:
					return
				default:
				}
				rank.SetDeadline(time.Now().Add(10 * time.Second))
				_, err := rank.Write(add)
				if err == nil {
					_, err = io.ReadFull(rank, reply)
				}
				if err != nil {
					failures <- fmt.Errorf("rank %d after %d adds in all: %w", i, adds.Load(), err)
					return
				}
				adds.Add(1)
			}
		}()
	}
	for range 4 {
		time.Sleep(1100 * time.Millisecond) // a process that lives under 1 s is restarted after a pause
		p, _ := strconv.Atoi(pid)
		syscall.Kill(p, syscall.SIGKILL)
		pid = waitPid(pid)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	var got int64
	for i := range store.NumConns() {
		b := store.Received(i)
		got += int64(bytes.Count(b, add)) // ADDs of one key and value: no other message contains one
	}
	if got != adds.Load() || adds.Load() < 200 {
		t.Fatalf("the store got %d ADDs; the ranks completed %d", got, adds.Load())
	}
	logMu.Lock()
	restarts := strings.Count(logs.String(), "took every relay back from the keeper\" relays=4")
	logMu.Unlock()
	if restarts != 4 {
		t.Errorf("%d restarts with the 4 relays in the log, not 4", restarts)
	}
	t.Logf("%d ADDs through 4 kills of the client guard", got)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
