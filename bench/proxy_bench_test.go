package bench

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/proxy"
)

// Benchmarks of closed-loop requests against the fake store, directly and through an in-process
// proxy.Server, for profiling the proxy:
//
//	go test ./bench -run '^$' -bench 'Proxy' -cpuprofile /tmp/cpu.out
//	go tool pprof -top -focus 'storeguard/proxy|internal/poll|syscall' bench.test /tmp/cpu.out
//
// Client, proxy and store share the process (and the machine's cores), as they do on loopback.

func startProxy(b *testing.B, upstream string, gen string) string {
	b.Helper()
	c := config.Default()
	c.Listen, c.Upstream, c.MetricsListen = "127.0.0.1:0", upstream, ""
	c.Generation = gen
	c.Caps.PerSourceConnections, c.Caps.PerSourceRate, c.Caps.MaxConnections = 0, 0, config.AutoCount{N: 1 << 20}
	c.Caps.StoreDialRate, c.Caps.PerSourceStoreDialRate = config.AutoRate{}, 0 // each run dials its clients anew, from one source
	srv, err := proxy.New(config.MustParse(c), proxy.Options{})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	return srv.Addr().String()
}

func benchOps(b *testing.B, addr string, op Op, gen protocol.Generation, conns int) {
	cfg := Config{Addr: addr, Conns: conns, Op: op, Gen: gen, ValueSize: 64, Keys: 1000, Batch: 8,
		Timeout: time.Minute, DialTimout: 5 * time.Second}
	r := &runner{cfg: cfg, d: newDialer(addr, 64, 5*time.Second, 0), nonce: "b"}
	keys := make([][]byte, cfg.Keys)
	for i := range keys {
		keys[i] = r.key(i)
	}
	value := bytes.Repeat([]byte{'v'}, cfg.ValueSize)
	if err := r.prefill(context.Background(), keys, value); err != nil {
		b.Fatal(err)
	}
	cls, _ := r.connectAll(context.Background(), conns)
	defer closeAll(cls)
	for _, c := range cls {
		if c == nil {
			b.Fatal(r.errs.list())
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w, cl := range cls {
		wg.Go(func() {
			var shapes []replyShape
			for i := w * 37; next.Add(1) <= int64(b.N); i++ {
				var req []byte
				req, shapes = r.request(cl, op, i, keys, value, shapes)
				if err := cl.do(req, shapes...); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkProxy(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	store := NewFakeStore(ln, protocol.G3)
	defer store.Close()
	proxied := startProxy(b, store.Addr(), "G3")
	for _, target := range []struct{ name, addr string }{{"direct", store.Addr()}, {"storeguard", proxied}} {
		for _, op := range []Op{OpGet, OpMix} {
			for _, conns := range []int{1, 16} {
				b.Run(target.name+"/"+string(op)+"/conns="+strconv.Itoa(conns), func(b *testing.B) {
					benchOps(b, target.addr, op, protocol.G3, conns)
				})
			}
		}
	}
}
