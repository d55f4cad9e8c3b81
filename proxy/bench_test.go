package proxy

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
)

// BenchmarkForwardSmall measures the proxy's cost per small message, over real loopback sockets:
// a client pipelines GETs of a short key through the proxy to a sink that discards them.
// allocs/op counts every goroutine, proxy included.
func BenchmarkForwardSmall(b *testing.B) {
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := sink.Accept()
		if err != nil {
			return
		}
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	cfg := config.Default()
	cfg.Listen, cfg.MetricsListen, cfg.Upstream, cfg.Generation = "127.0.0.1:0", "", sink.Addr().String(), "2.6"
	srv, err := New(parsed(b, cfg), Options{})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx)

	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	c.Write(protocol.AppendHandshake(nil, protocol.G3, 1))
	msg, _ := protocol.Append(nil, protocol.G3, protocol.Request{Op: protocol.OpGet, Key: []byte("/rank_0/key")})
	batch := make([]byte, 0, 64*len(msg))
	for range 64 {
		batch = append(batch, msg...)
	}
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 64 {
		if _, err := c.Write(batch[:min(64, b.N-i)*len(msg)]); err != nil {
			b.Fatal(err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	n := <-got
	b.StopTimer()
	if want := int64(b.N*len(msg) + 10); n != want {
		b.Fatalf("sink got %d bytes, want %d", n, want)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
