package keeper

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/internal/fdpass/fdtest"
)

// link starts k serving a worker whose end of the keeper link the test plays (no process is
// started: the worker's is this one). The keeper closes everything it holds when the test ends.
func link(t *testing.T, k *Keeper) (w *worker, wc *fdpass.Conn) {
	t.Helper()
	mine, theirs, err := fdpass.Pair()
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := fdpass.New(mine) // as spawn makes the keeper's end
	mine.Close()
	if err != nil {
		theirs.Close()
		t.Fatal(err)
	}
	wc, err = fdpass.New(theirs)
	theirs.Close()
	if err != nil {
		ctl.Close()
		t.Fatal(err)
	}
	w = &worker{cmd: &exec.Cmd{Process: &os.Process{Pid: os.Getpid()}}, ctl: ctl, start: time.Now(),
		exited: make(chan struct{}), read: make(chan struct{})}
	go k.serveWorker(w)
	t.Cleanup(func() {
		wc.Close()
		<-w.read
		k.closeAll()
	})
	return w, wc
}

func quietKeeper() *Keeper { return New("", nil, slog.New(slog.DiscardHandler)) }

// flush returns once the keeper has read every packet sent before (F, answered by f).
func flush(t *testing.T, wc *fdpass.Conn) {
	t.Helper()
	if err := wc.Send('F', nil); err != nil {
		t.Fatal(err)
	}
	if _, err := wc.Expect('f', 0, nil); err != nil {
		t.Fatal(err)
	}
}

// sent is one packet a worker sends, with the test's sockets (indexes) as its descriptors.
type sent struct {
	kind  byte
	v     any
	socks []int
}

// send sends p, its descriptors those of pass it names.
func (p sent) send(t *testing.T, wc *fdpass.Conn, pass []*os.File) {
	t.Helper()
	var fds []int
	for _, i := range p.socks {
		fds = append(fds, int(pass[i].Fd()))
	}
	if err := wc.Send(p.kind, p.v, fds...); err != nil {
		t.Fatal(err)
	}
}

func change(kind byte, id uint64) Change { return Change{Kind: kind, Conn: Conn{ID: id}} }

// kept is what the keeper holds of a connection: the indexes of the sockets sent as its client's
// and its store's (-1: none).
type kept struct{ client, store int }

// storm is an M packet of n connections accepted at once, IDs 1 to n, socket i-1 for ID i.
func storm(n int) sent {
	p := sent{kind: 'M'}
	var batch []Change
	for i := range n {
		batch = append(batch, change('O', uint64(i+1)))
		p.socks = append(p.socks, i)
	}
	p.v = batch
	return p
}

func TestKeeperHoldsWhatTheWorkerSends(t *testing.T) {
	stormKept := map[uint64]kept{}
	for i := range 200 {
		stormKept[uint64(i+1)] = kept{i, -1}
	}
	for _, tc := range []struct {
		name    string
		packets []sent
		want    map[uint64]kept
		wantLn  []int // sockets held as the listeners
	}{
		{"a connection and its store connection", []sent{
			{'O', Conn{ID: 1}, []int{0}}, {'U', Conn{ID: 1}, []int{1}},
		}, map[uint64]kept{1: {0, 1}}, nil},
		{"an end forgets both", []sent{
			{'O', Conn{ID: 1}, []int{0}}, {'U', Conn{ID: 1}, []int{1}}, {'O', Conn{ID: 2}, []int{2}},
			{'D', Conn{ID: 1}, nil},
		}, map[uint64]kept{2: {2, -1}}, nil},
		{"an ID opened again replaces the first", []sent{
			{'O', Conn{ID: 1}, []int{0}}, {'U', Conn{ID: 1}, []int{1}}, {'O', Conn{ID: 1}, []int{2}},
		}, map[uint64]kept{1: {2, -1}}, nil},
		{"a batch, its descriptors in order (D has none)", []sent{
			{'M', []Change{change('O', 1), change('O', 2), change('U', 1), change('D', 2), change('O', 3)}, []int{0, 1, 2, 3}},
		}, map[uint64]kept{1: {0, 2}, 3: {3, -1}}, nil},
		{"a full batch (200)", []sent{storm(200)}, stormKept, nil},
		{"listeners, then new ones in their place", []sent{
			{'L', Listeners{Listen: "127.0.0.1:1", MetricsListen: "127.0.0.1:2"}, []int{0, 1}},
			{'L', Listeners{Listen: "127.0.0.1:3"}, []int{2}},
		}, map[uint64]kept{}, []int{2}},

		// Rejected: the keeper closes the descriptors it does not keep.
		{"a connection without its descriptor", []sent{
			{'O', Conn{ID: 1}, nil},
		}, map[uint64]kept{}, nil},
		{"a connection with two", []sent{
			{'O', Conn{ID: 1}, []int{0, 1}},
		}, map[uint64]kept{}, nil},
		{"a store connection of an unknown connection", []sent{
			{'U', Conn{ID: 9}, []int{0}},
		}, map[uint64]kept{}, nil},
		{"a second store connection", []sent{
			{'O', Conn{ID: 1}, []int{0}}, {'U', Conn{ID: 1}, []int{1}}, {'U', Conn{ID: 1}, []int{2}},
		}, map[uint64]kept{1: {0, 1}}, nil},
		{"an end with a descriptor", []sent{
			{'O', Conn{ID: 1}, []int{0}}, {'D', Conn{ID: 1}, []int{1}},
		}, map[uint64]kept{}, nil},
		{"a batch with more descriptors than its changes", []sent{
			{'M', []Change{change('O', 1)}, []int{0, 1, 2}},
		}, map[uint64]kept{1: {0, -1}}, nil},
		{"a batch with fewer", []sent{
			{'M', []Change{change('O', 1), change('O', 2)}, []int{0}},
		}, map[uint64]kept{1: {0, -1}}, nil},
		{"a batch with an unknown change", []sent{
			{'M', []Change{change('X', 1), change('O', 2)}, []int{0, 1}},
		}, map[uint64]kept{2: {1, -1}}, nil},
		{"a batch that is not JSON", []sent{
			{'M', "not a batch", []int{0}},
		}, map[uint64]kept{}, nil},
		{"a connection that is not JSON", []sent{
			{'O', "not a connection", []int{0}},
		}, map[uint64]kept{}, nil},
		{"listeners that are not JSON", []sent{
			{'L', 7, []int{0}},
		}, map[uint64]kept{}, nil},
		{"an unknown packet", []sent{
			{'Z', nil, []int{0}},
		}, map[uint64]kept{}, nil},
		{"a packet that carries none (T, P)", []sent{
			{'T', nil, []int{0}}, {'P', nil, []int{1}},
		}, map[uint64]kept{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fdtest.NoLeak(t)
			pass, peer := fdtest.Sockets(t, 200)
			k := quietKeeper()
			_, wc := link(t, k)
			before := fdtest.Count(t)
			for _, p := range tc.packets {
				p.send(t, wc, pass)
			}
			flush(t, wc)

			k.mu.Lock()
			defer k.mu.Unlock()
			if len(k.conns) != len(tc.want) {
				t.Fatalf("the keeper holds %d connections, want %d", len(k.conns), len(tc.want))
			}
			held := len(k.lnFds)
			for id, want := range tc.want {
				h := k.conns[id]
				if h == nil {
					t.Fatalf("connection %d not held", id)
				}
				fdtest.Same(t, h.cfd, peer[want.client])
				if want.store < 0 {
					if h.ufd >= 0 {
						t.Fatalf("connection %d has a store descriptor, want none", id)
					}
				} else {
					fdtest.Same(t, h.ufd, peer[want.store])
					held++
				}
				held++
			}
			if len(k.lnFds) != len(tc.wantLn) {
				t.Fatalf("the keeper holds %d listeners, want %d", len(k.lnFds), len(tc.wantLn))
			}
			for i, fd := range k.lnFds {
				fdtest.Same(t, fd, peer[tc.wantLn[i]])
			}
			// Every descriptor sent is either held or closed.
			if opened := fdtest.Count(t) - before; opened != held {
				t.Fatalf("%d descriptors more than before the packets, the keeper holds %d", opened, held)
			}
		})
	}
}

// A worker that takes over from one that died (Q) gets the listeners, the next ID and every
// connection, each with its store connection when it has one, its own sockets (a TLS relay's) and
// the worker's record of it, as the keeper holds them.
func TestKeeperRestoresEverythingToTheNextWorker(t *testing.T) {
	fdtest.NoLeak(t)
	pass, peer := fdtest.Sockets(t, 7)
	k := quietKeeper()
	_, wc := link(t, k)
	ln := Listeners{Listen: "127.0.0.1:29500", MetricsListen: "127.0.0.1:9100"}
	src, dst := netip.MustParseAddrPort("10.0.0.7:40001"), netip.MustParseAddrPort("127.0.0.1:29500")
	for _, p := range []sent{
		{'L', ln, []int{0, 1}},
		{'M', []Change{
			{Kind: 'O', Conn: Conn{ID: 4, Src: src, Dst: dst, Data: json.RawMessage(`{"Slot":3,"Peer":"spiffe://sg.test/master"}`)}},
			change('U', 4), {Kind: 'O', Conn: Conn{ID: 9, Extra: 2}},
		}, []int{2, 3, 4, 5, 6}},
		{'Q', nil, nil},
	} {
		p.send(t, wc, pass)
	}

	var got Listeners
	fds, err := wc.Expect('S', 0, &got)
	defer fdpass.CloseFds(fds)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Listeners{Listen: ln.Listen, MetricsListen: ln.MetricsListen, NextID: 10}); got != want || len(fds) != 2 {
		t.Fatalf("S: %+v with %d descriptors, want %+v with 2", got, len(fds), want)
	}
	fdtest.Same(t, fds[0], peer[0])
	fdtest.Same(t, fds[1], peer[1])

	want := map[uint64]struct {
		meta  Conn
		socks []int
	}{
		4: {Conn{ID: 4, Src: src, Dst: dst, HasUp: true, Data: json.RawMessage(`{"Slot":3,"Peer":"spiffe://sg.test/master"}`)}, []int{2, 3}},
		9: {Conn{ID: 9, Extra: 2}, []int{4, 5, 6}},
	}
	for range len(want) { // not over want: it shrinks
		var c Conn
		fds, err := wc.Expect('C', 0, &c)
		defer fdpass.CloseFds(fds)
		if err != nil {
			t.Fatal(err)
		}
		w, ok := want[c.ID]
		if !ok || !reflect.DeepEqual(c, w.meta) || len(fds) != len(w.socks) {
			t.Fatalf("C: %+v with %d descriptors, want one of %+v", c, len(fds), want)
		}
		for i, fd := range fds {
			fdtest.Same(t, fd, peer[w.socks[i]])
		}
		delete(want, c.ID)
	}
	var n int
	if _, err := wc.Expect('E', 0, &n); err != nil || n != 2 {
		t.Fatalf("E: %d, %v; want 2 connections", n, err)
	}
}

// The keeper's own workers: the test binary run again, in the role workerRole names.
const (
	workerRole = "KEEPER_TEST_WORKER"
	workerLog  = "KEEPER_TEST_LOG"  // a file each worker adds a line to when it starts
	clientAddr = "KEEPER_TEST_ADDR" // the test's listener: a client connection for the keeper to hold
)

func TestMain(m *testing.M) {
	if role := os.Getenv(workerRole); role != "" {
		os.Exit(runWorker(role))
	}
	os.Exit(m.Run())
}

// runWorker is a worker process: "exit" exits 0 at once; "crash" gives the keeper a connection to
// the test and is killed, and the worker restarted after it (RestoreEnv) writes through that
// connection and exits 0.
func runWorker(role string) int {
	restored := os.Getenv(RestoreEnv) != ""
	f, err := os.OpenFile(os.Getenv(workerLog), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return 10
	}
	f.WriteString(role + " restored=" + strconv.FormatBool(restored) + "\n")
	f.Close()
	switch role {
	case "exit":
		return 0
	case "fail": // a configuration it cannot start with
		return 2
	case "term": // SIGTERM's default action ends it: killed by the signal, no exit status
		select {}
	}
	fd, err := strconv.Atoi(os.Getenv(Env))
	if err != nil {
		return 11
	}
	k, err := fdpass.New(os.NewFile(uintptr(fd), "keeper"))
	if err != nil {
		return 12
	}
	if !restored {
		c, err := net.Dial("tcp", os.Getenv(clientAddr))
		if err != nil {
			return 13
		}
		cf, err := c.(*net.TCPConn).File()
		if err != nil {
			return 14
		}
		if err := k.Send('O', Conn{ID: 1}, int(cf.Fd())); err != nil {
			return 15
		}
		syscall.Kill(os.Getpid(), syscall.SIGKILL) // no hand-over, no goodbye
		select {}
	}
	if err := k.Send('Q', nil); err != nil {
		return 16
	}
	if _, err := k.Expect('S', 10*time.Second, nil); err != nil {
		return 17
	}
	for {
		kind, _, fds, err := k.Recv(10 * time.Second)
		if err != nil {
			return 18
		}
		if kind == 'E' {
			return 0
		}
		if kind != 'C' || len(fds) != 1 {
			return 19
		}
		if _, err := syscall.Write(fds[0], []byte("from the restarted worker")); err != nil {
			return 20
		}
	}
}

// workers sets the environment for the keeper's workers to run in role, and returns what they
// logged, in order, once they are done.
func workers(t *testing.T, role string) (logged func() []string) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "workers")
	if err := os.WriteFile(log, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(workerRole, role)
	t.Setenv(workerLog, log)
	t.Setenv("GORACE", os.Getenv("GORACE")+" atexit_sleep_ms=0") // -race: a worker's exit waits 1 s otherwise
	return func() []string {
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
}

func runKeeper() int {
	return New(os.Args[0], []string{"-test.run=^$"}, slog.New(slog.DiscardHandler)).Run()
}

func TestKeeperEndsWhenItsWorkerExitsZero(t *testing.T) {
	logged := workers(t, "exit")
	code := runKeeper()
	if got := logged(); code != 0 || !slices.Equal(got, []string{"exit restored=false"}) {
		t.Fatalf("keeper exited %d after workers %q; want 0 after one, not restarted", code, got)
	}
}

// A worker that fails before it gave the keeper its listeners or a connection (a configuration it
// cannot start with) is not restarted again and again: the keeper exits with its status.
func TestKeeperEndsWhenItsFirstWorkerFailsToStart(t *testing.T) {
	logged := workers(t, "fail")
	exited := make(chan int, 1)
	go func() { exited <- runKeeper() }()
	select {
	case code := <-exited:
		if got := logged(); code != 2 || !slices.Equal(got, []string{"fail restored=false"}) {
			t.Fatalf("keeper exited %d after workers %q; want 2 after one, not restarted", code, got)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the keeper still runs 20 s after its worker failed to start; workers: %q", logged())
	}
}

// SIGTERM, passed on to a worker that has no handler for it yet (one starting, restored), kills
// it: the keeper ends too (0: it stopped as asked), rather than wait on with no worker.
func TestKeeperEndsOnSIGTERMThatKillsItsWorker(t *testing.T) {
	logged := workers(t, "term")
	exited := make(chan int, 1)
	go func() { exited <- runKeeper() }()
	for end := time.Now().Add(20 * time.Second); logged()[0] == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no worker started in 20 s")
		}
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM) // the keeper's (it catches SIGTERM while it runs)
	select {
	case code := <-exited:
		if code != 0 {
			t.Fatalf("keeper exited %d; want 0", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the keeper still runs 20 s after SIGTERM killed its worker")
	}
}

// A worker killed without a hand-over is restarted with the connection it gave the keeper: the
// client sees the new worker's bytes, no close in between.
func TestKeeperRestartsAWorkerThatDied(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv(clientAddr, ln.Addr().String())
	logged := workers(t, "crash")
	exited := make(chan int, 1)
	go func() { exited <- runKeeper() }()
	// The deadlines are for a keeper that fails: no worker dials, or nothing ends the connection.
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(c) // until the last copy closes: the keeper's, as it ends
	if err != nil || string(got) != "from the restarted worker" {
		t.Fatalf("the client read %q, %v; want the restarted worker's bytes, then the end", got, err)
	}
	code := <-exited
	if want := []string{"crash restored=false", "crash restored=true"}; code != 0 || !slices.Equal(logged(), want) {
		t.Fatalf("keeper exited %d after workers %q; want 0 after %q", code, logged(), want)
	}
}
