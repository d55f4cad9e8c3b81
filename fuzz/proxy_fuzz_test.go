// Package fuzz holds fuzz targets that cross packages: arbitrary client bytes through the real
// proxy, over real sockets, to a recording store.
package fuzz

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/proxy"
)

// recorder is a store that hands each connection's bytes to the test once the proxy has closed
// its side.
type recorder struct {
	ln    net.Listener
	conns chan []byte
}

func newRecorder(t testing.TB) *recorder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln, conns: make(chan []byte, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				r.conns <- b
			}()
		}
	}()
	return r
}

type guarded struct {
	gen   protocol.Generation
	addr  string
	store *recorder
}

// eventLoops is event-loops for the proxies: scripts/test.sh runs the package with loops (the
// default) and without (-event-loops=-1).
var eventLoops = flag.Int("event-loops", 0, "event-loops for the proxies under test")

var (
	setupOnce sync.Once
	guards    []guarded
)

// setup starts one proxy per generation for the whole fuzzing process.
func setup(t testing.TB) {
	setupOnce.Do(func() {
		for _, g := range []protocol.Generation{protocol.G0, protocol.G1, protocol.G3, protocol.G6} {
			store := newRecorder(t)
			srv := startFuzzProxy(t, store.ln.Addr().String(), g.String())
			guards = append(guards, guarded{gen: g, addr: srv.Addr().String(), store: store})
		}
	})
}

// startFuzzProxy starts a proxy in front of upstream with the fuzzing limits, and no bans or
// rate caps: the fuzzer is one source that breaks rules all the time.
func startFuzzProxy(t testing.TB, upstream, generation string) *proxy.Server {
	cfg := config.Default()
	cfg.Listen, cfg.MetricsListen, cfg.Upstream = "127.0.0.1:0", "", upstream
	cfg.Generation = generation
	cfg.EventLoops = *eventLoops
	cfg.Limits.MaxMessageBytes, cfg.Limits.MaxValueBytes = int64(fuzzLimits.MaxMessageBytes), int64(fuzzLimits.MaxValueBytes)
	cfg.Limits.MaxKeyBytes, cfg.Limits.MaxKeys = int64(fuzzLimits.MaxKeyBytes), int64(fuzzLimits.MaxKeys)
	cfg.Ban.Violations = 0
	cfg.Caps.PerSourceRate = 0
	srv, err := proxy.New(cfg, proxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go srv.Serve(context.Background())
	return srv
}

// validPrefix is what the store may receive of data: every complete message before the first
// violation, and nothing of a message that is incomplete or offending.
func validPrefix(cfg protocol.Config, data []byte) []byte {
	d := protocol.NewDecoder(cfg)
	end := 0
	for p := 0; p < len(data); {
		n, msg, err := d.Scan(data[p:])
		p += n
		if err != nil {
			break
		}
		if msg != nil {
			end = p
		}
	}
	return data[:end]
}

// FuzzProxyForwardsOnlyValidMessages sends arbitrary bytes, split at an arbitrary point, through
// the proxy and asserts the store received exactly the complete valid messages before the first
// violation: not one byte of an offending or unfinished message.
func FuzzProxyForwardsOnlyValidMessages(f *testing.F) {
	setup(f)
	for _, g := range guards {
		var s []byte
		s = protocol.AppendHandshake(s, g.gen, 9)
		s, _ = protocol.Append(s, g.gen, protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: []byte("v")})
		f.Add(s, uint8(g.gen), uint16(3))
		f.Add(append(s, 0x03, 0x00, 0x00, 0x0b, 0x06, 0xe0, 0, 0, 0, 0, 0), uint8(g.gen), uint16(40))
	}
	f.Fuzz(func(t *testing.T, data []byte, which uint8, split uint16) {
		if len(data) > 1<<17 {
			return
		}
		g := guards[int(which)%len(guards)]
		got := sendAndRecord(t, g.addr, data, split, g.store.conns)
		want := validPrefix(protocol.Config{Gen: protocol.GenSetting{Gen: g.gen}, Limits: fuzzLimits}, data)
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: store received %d bytes %x\nwant %d bytes %x", g.gen, len(got), got, len(want), want)
		}
	})
}

// sendAndRecord sends data through the proxy at addr, split at an arbitrary point, ends the
// client's side and returns what the store behind it received on that connection, which ended
// reports when the store's side closes.
func sendAndRecord(t *testing.T, addr string, data []byte, split uint16, ended <-chan []byte) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cut := int(split) % (len(data) + 1)
	c.Write(data[:cut])
	time.Sleep(time.Millisecond)
	c.Write(data[cut:])
	c.(*net.TCPConn).CloseWrite()
	select {
	case got := <-ended:
		return got
	case <-time.After(10 * time.Second):
		t.Fatal("the store never saw the connection end")
	}
	return nil
}
