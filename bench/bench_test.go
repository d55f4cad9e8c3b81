package bench

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

func startFake(t *testing.T, gen protocol.Generation) *FakeStore {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewFakeStore(ln, gen)
	t.Cleanup(func() { s.Close() })
	return s
}

func testConfig(addr string, op Op, gen protocol.Generation) Config {
	return Config{Addr: addr, Conns: 4, Duration: 150 * time.Millisecond, Op: op, Gen: gen,
		ValueSize: 32, Keys: 50, Batch: 4, Timeout: 10 * time.Second, DialTimout: 5 * time.Second}
}

func TestClosedLoopOps(t *testing.T) {
	for _, gen := range []protocol.Generation{protocol.G0, protocol.G1, protocol.G3, protocol.G6} {
		for _, op := range []Op{OpSet, OpGet, OpAdd, OpCheck, OpMultiSet, OpMultiGet, OpMix} {
			t.Run(gen.String()+"/"+string(op), func(t *testing.T) {
				s := startFake(t, gen)
				cfg := testConfig(s.Addr(), op, gen)
				err := cfg.Validate()
				if gen == protocol.G0 && (op == OpMultiGet || op == OpMultiSet) {
					if err == nil || !strings.Contains(err.Error(), "does not have") {
						t.Fatalf("G0 has no multi ops; Validate = %v", err)
					}
					return
				}
				res, err := Run(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				if res.Errors != 0 || len(res.ErrorSamples) != 0 {
					t.Fatalf("errors: %d %v", res.Errors, res.ErrorSamples)
				}
				if res.Ops == 0 || res.Latency.P50 <= 0 || res.Latency.P99 < res.Latency.P50 {
					t.Fatalf("ops %d, latency %+v", res.Ops, res.Latency)
				}
				if res.Connect.OK != cfg.Conns || res.Connect.Failed != 0 {
					t.Fatalf("connect %+v", res.Connect)
				}
				// Every measured op is at least one request the store handled.
				if got := s.Messages(); got < int64(res.Ops) {
					t.Fatalf("store handled %d requests for %d ops", got, res.Ops)
				}
			})
		}
	}
}

func TestSetReachesStore(t *testing.T) {
	s := startFake(t, protocol.G3)
	cfg := testConfig(s.Addr(), OpSet, protocol.G3)
	cfg.Keys = 10
	r := &runner{cfg: cfg, d: newDialer(cfg.Addr, 4, time.Second, 0), nonce: "t"}
	res := &Result{}
	if err := r.closedLoop(context.Background(), res); err != nil {
		t.Fatal(err)
	}
	if res.Ops < 10 {
		t.Skipf("only %d ops ran; cannot check every key", res.Ops)
	}
	for i := range 10 {
		if v, ok := s.Get(string(r.key(i))); !ok || len(v) != 32 {
			t.Fatalf("key %q: %q %v", r.key(i), v, ok)
		}
	}
}

func TestRendezvous(t *testing.T) {
	for _, gen := range []protocol.Generation{protocol.G0, protocol.G3} {
		t.Run(gen.String(), func(t *testing.T) {
			s := startFake(t, gen)
			cfg := testConfig(s.Addr(), OpRendezvous, gen)
			cfg.Conns, cfg.DialConc = 300, 32
			r := &runner{cfg: cfg, d: newDialer(cfg.Addr, cfg.DialConc, 5*time.Second, 0), nonce: "rv"}
			res := &Result{}
			if err := r.rendezvous(context.Background(), res); err != nil {
				t.Fatal(err)
			}
			if res.Rendezvous.Completed != 300 || res.Ops != 300 || r.errs.n.Load() != 0 {
				t.Fatalf("%+v errors %v", res.Rendezvous, r.errs.list())
			}
			v, ok := s.Get("/init/rv")
			if !ok || int64(binary.LittleEndian.Uint64(v)) != 300 {
				t.Fatalf("init counter %v %v, want 300", v, ok)
			}
			if _, ok := s.Get("/rdzv/rv/done"); !ok {
				t.Fatal("done key not set")
			}
			if s.Accepted() != 300 {
				t.Fatalf("accepted %d connections, want 300", s.Accepted())
			}
			if c := res.CPU; c == nil || c.Cores != runtime.NumCPU() || c.CoresBusyS < 0 ||
				c.CoresBusyS > (res.DurationS+2.0/userHz)*float64(c.Cores) { // ticks: up to 2 more per core
				t.Fatalf("CPU %+v over %.3f s", c, res.DurationS)
			}
		})
	}
}

func TestParseCPULine(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice: busy = 100+2+30+4+5+6 ticks.
	got, err := parseCPULine("cpu  100 2 30 9999 77 4 5 6 0 0")
	if err != nil || got != 1470*time.Millisecond {
		t.Fatalf("%v %v, want 1.47s", got, err)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3", "cpu 1 x 3 4 5 6 7 8"} {
		if _, err := parseCPULine(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	// A name with a space and a ") " inside; utime 250 and stime 30 ticks.
	line := "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 3 0 99 0 0\n"
	name, cpu, err := parseProcStat([]byte(line))
	if err != nil || name != "a) b (c" || cpu != 2800*time.Millisecond {
		t.Fatalf("%q %v %v, want \"a) b (c\" 2.8s", name, cpu, err)
	}
	for _, bad := range []string{"", "4242 noname S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 0 0 0 0 0 x 30 0"} {
		if _, _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// A watched process's CPU time over the measured interval: this test process, which runs the
// fake store and the clients, spends some; a process that does not exist is left out.
func TestClosedLoopReportsWatchedCPU(t *testing.T) {
	s := startFake(t, protocol.G3)
	cfg := testConfig(s.Addr(), OpGet, protocol.G3)
	cfg.Duration, cfg.WatchPIDs = 300*time.Millisecond, []int{os.Getpid(), 1 << 30}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := res.CPU
	if c == nil || len(c.Processes) != 1 || c.Processes[0].PID != os.Getpid() {
		t.Fatalf("CPU %+v, want this process only", c)
	}
	// Per-process time and the machine-wide ticks are counted differently: allow 10 % and 2 ticks.
	if p := c.Processes[0]; p.CPUS <= 0 || p.CPUS > c.CoresBusyS*1.1+2.0/userHz {
		t.Fatalf("this process %.2fs of the machine's %.2fs busy, over %d ops", p.CPUS, c.CoresBusyS, res.Ops)
	}
}

// The busy counter moves when a core works: 200 ms of spinning shows as at least 100 ms.
func TestCoresBusyCountsWork(t *testing.T) {
	b0, ok := coresBusy()
	if !ok {
		t.Skip("no /proc/stat")
	}
	for t0 := time.Now(); time.Since(t0) < 200*time.Millisecond; {
	}
	b1, _ := coresBusy()
	if b1-b0 < 100*time.Millisecond {
		t.Fatalf("busy time grew %v over 200 ms of spinning", b1-b0)
	}
}

func TestWaitStorm(t *testing.T) {
	s := startFake(t, protocol.G3)
	cfg := testConfig(s.Addr(), OpWaitStorm, protocol.G3)
	cfg.Conns = 8
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops == 0 || res.Errors != 0 {
		t.Fatalf("rounds %d errors %d %v", res.Ops, res.Errors, res.ErrorSamples)
	}
	// Every round: 7 WAITs, one SET, one GETNUMKEYS, on top of 8 handshakes of 2 messages.
	if got, want := s.Messages(), int64(res.Ops)*9+16; got < want {
		t.Fatalf("store handled %d messages, want at least %d", got, want)
	}
}

func TestIdleHoldsConnections(t *testing.T) {
	s := startFake(t, protocol.G3)
	cfg := testConfig(s.Addr(), OpIdle, protocol.G3)
	cfg.Conns = 100
	var ready atomic.Int64
	cfg.OnReady = func(n int) { ready.Store(int64(n)) }
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ready.Load() != 100 || res.Connect.OK != 100 || res.Errors != 0 || s.Accepted() != 100 {
		t.Fatalf("ready %d, %+v, errors %v, accepted %d", ready.Load(), res.Connect, res.ErrorSamples, s.Accepted())
	}
}

func TestErrorsAreCounted(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		cfg := testConfig(addr, OpAdd, protocol.G3)
		cfg.DialTimout = 50 * time.Millisecond
		res, err := Run(context.Background(), cfg)
		if err == nil || res.Connect.Failed != 4 || res.Errors < 4 || res.Ops != 0 {
			t.Fatalf("err %v, %+v", err, res)
		}
	})
	t.Run("store closes on missing key", func(t *testing.T) {
		// A closed-loop GET without prefill: the fake closes each connection on the first GET.
		s := startFake(t, protocol.G3)
		cfg := testConfig(s.Addr(), OpGet, protocol.G3)
		r := &runner{cfg: cfg, d: newDialer(cfg.Addr, 4, time.Second, 0), nonce: "missing"}
		cls, _ := r.connectAll(context.Background(), 1)
		defer closeAll(cls)
		req, shapes := r.request(cls[0], OpGet, 0, [][]byte{[]byte("/nope")}, nil, nil)
		if err := cls[0].do(req, shapes...); err == nil {
			t.Fatal("GET of a missing key should fail against the fake store")
		}
	})
	t.Run("wrong ping nonce", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { c.Write([]byte{9, 9, 9, 9}) }()
			}
		}()
		cfg := testConfig(ln.Addr().String(), OpAdd, protocol.G3)
		cfg.Conns, cfg.Duration = 2, 50*time.Millisecond
		res, err := Run(context.Background(), cfg)
		if err == nil || res.Connect.Failed < 2 || !strings.Contains(strings.Join(res.ErrorSamples, " "), "nonce") {
			t.Fatalf("err %v, %+v", err, res)
		}
	})
}

func TestReplyParsing(t *testing.T) {
	cases := []struct {
		name  string
		shape replyShape
		wire  []byte
		ok    bool
	}{
		{"get", replyBytes, append(protocol.AppendBytes(nil, []byte("abc")), 0xEE), true},
		{"get short", replyBytes, []byte{3, 0, 0, 0, 0, 0, 0, 0, 'a'}, false},
		{"get huge", replyBytes, []byte{0, 0, 0, 0, 0, 0, 0, 0x10}, false},
		{"add", replyInt, []byte{1, 2, 3, 4, 5, 6, 7, 8}, true},
		{"wait", replyByte, []byte{0}, true},
		{"multi_get", replyShape{strings: 2}, protocol.AppendBytes(protocol.AppendBytes(nil, []byte("x")), nil), true},
		{"multi_get short", replyShape{strings: 2}, protocol.AppendBytes(nil, []byte("x")), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			go func() { b.Write(tc.wire); b.Close() }()
			cl := newClient(a, protocol.G3)
			err := cl.readReply(tc.shape)
			if (err == nil) != tc.ok {
				t.Fatalf("readReply = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestHistogram(t *testing.T) {
	var h Histogram
	for i := 1; i <= 10000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5000 * time.Microsecond}, {0.99, 9900 * time.Microsecond}, {0.999, 9990 * time.Microsecond}} {
		got := h.Quantile(tc.q)
		if d := float64(got-tc.want) / float64(tc.want); d < -0.02 || d > 0.02 {
			t.Errorf("q%v = %v, want %v ±2%%", tc.q, got, tc.want)
		}
	}
	if h.Count() != 10000 || h.Max() != 10*time.Millisecond {
		t.Fatalf("count %d max %v", h.Count(), h.Max())
	}
	var small Histogram
	small.Record(5)
	small.Record(time.Duration(1) << 50) // clamped to the last bucket, max kept exact
	if small.Quantile(0.5) != 5 || small.Max() != time.Duration(1)<<50 {
		t.Fatalf("q50 %v max %v", small.Quantile(0.5), small.Max())
	}
	for i := range histBuckets {
		if histIndex(histValue(i)) != i {
			t.Fatalf("bucket %d: midpoint %d maps to %d", i, histValue(i), histIndex(histValue(i)))
		}
	}
}

// Every connect op is a connection of its own that reached the store: dial, handshake, one GET.
func TestConnectOpensAConnectionPerOp(t *testing.T) {
	for _, gen := range []protocol.Generation{protocol.G0, protocol.G6} {
		t.Run(gen.String(), func(t *testing.T) {
			s := startFake(t, gen)
			cfg := testConfig(s.Addr(), OpConnect, gen)
			cfg.Keys = 20
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Ops == 0 || res.Errors != 0 {
				t.Fatalf("ops %d errors %d %v", res.Ops, res.Errors, res.ErrorSamples)
			}
			// The prefill connection, then one per op (and those of the warm-up and the ends).
			if got := s.Accepted(); got < int64(res.Ops)+1 {
				t.Fatalf("store accepted %d connections for %d connect ops", got, res.Ops)
			}
			if res.Latency.P50 <= 0 || res.Latency.P99 < res.Latency.P50 {
				t.Fatalf("latency %+v", res.Latency)
			}
		})
	}
}
