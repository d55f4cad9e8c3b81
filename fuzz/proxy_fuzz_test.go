// Package fuzz holds fuzz targets that cross packages: arbitrary client bytes through the real
// proxy, over real sockets, to a recording store.
package fuzz

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/proxy"
)

// A forwarding mode is config.EventLoops for a fuzzed proxy: every input goes through a proxy of
// each mode, so that both forwarding paths meet every input the fuzzer finds.
type mode struct {
	name  string
	loops int
}

var modes = []mode{{"loops", 2}, {"goroutines", -1}}

// guarded is a proxy of one generation and forwarding mode in front of a recorder.
type guarded struct {
	gen   protocol.Generation
	mode  mode
	addr  string
	store *storesim.Store
}

var (
	setupOnce sync.Once
	guards    [][]guarded // per generation, a proxy of each mode
)

// setup starts, for the whole fuzzing process, one proxy per generation and forwarding mode.
func setup(t testing.TB) {
	setupOnce.Do(func() {
		for _, g := range []protocol.Generation{protocol.G0, protocol.G1, protocol.G3, protocol.G6} {
			var each []guarded
			for _, m := range modes {
				store, err := storesim.StartRecorder("127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				store.Answer(protocol.GenSetting{Gen: g}) // for limits.max-pending-replies
				srv := startFuzzProxy(t, store.Addr(), g.String(), m)
				each = append(each, guarded{gen: g, mode: m, addr: srv.Addr().String(), store: store})
			}
			guards = append(guards, each)
		}
	})
}

// startFuzzProxy starts a proxy in front of upstream with the fuzzing limits, and no bans, rate
// caps, dial pacing, store quota or value-split rule: the fuzzer is one source that breaks rules
// all the time, opens thousands of connections a second, writes keys it never deletes, and
// APPENDs, for each of which the rule asks the store on a connection of the guard's own (policy's
// tests and interop/test_allow_list.py judge that rule).
func startFuzzProxy(t testing.TB, upstream, generation string, m mode) *proxy.Server {
	cfg := config.Default()
	cfg.Listen, cfg.MetricsListen, cfg.Upstream = "127.0.0.1:0", "", upstream
	cfg.Generation = generation
	cfg.EventLoops = m.loops
	cfg.Limits.MaxMessageBytes, cfg.Limits.MaxValueBytes = config.ByteLimit(fuzzLimits.MaxMessageBytes), config.ByteLimit(fuzzLimits.MaxValueBytes)
	cfg.Limits.MaxKeyBytes, cfg.Limits.MaxKeys = int64(fuzzLimits.MaxKeyBytes), int64(fuzzLimits.MaxKeys)
	cfg.Ban.Violations = 0
	cfg.Caps.PerSourceRate = 0
	cfg.Caps.StoreDialRate, cfg.Caps.PerSourceStoreDialRate = config.AutoRate{}, 0
	cfg.Quota.Mode = "off"
	cfg.Policy.ValueSplit = "off"
	srv, err := proxy.New(config.MustParse(cfg), proxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go srv.Serve(context.Background())
	return srv
}

// FuzzProxyForwardsOnlyValidMessages sends arbitrary bytes, split at an arbitrary point, through
// the proxy of each forwarding mode and asserts the store received exactly the complete valid
// messages before the first violation: not one byte of an offending or unfinished message.
func FuzzProxyForwardsOnlyValidMessages(f *testing.F) {
	setup(f)
	for i, each := range guards {
		g := each[0].gen
		var s []byte
		s = protocol.AppendHandshake(s, g, 9)
		s, _ = protocol.Append(s, g, protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: []byte("v")})
		f.Add(s, uint8(i), uint16(3))
		f.Add(append(s, 0x03, 0x00, 0x00, 0x0b, 0x06, 0xe0, 0, 0, 0, 0, 0), uint8(i), uint16(40))
	}
	f.Fuzz(func(t *testing.T, data []byte, which uint8, split uint16) {
		if len(data) > 1<<17 {
			return
		}
		for _, g := range guards[int(which)%len(guards)] {
			got := sendAndRecord(t, g.addr, data, split, g.store)
			want := protocol.ValidPrefix(protocol.Config{Gen: protocol.GenSetting{Gen: g.gen}, Limits: fuzzLimits}, data)
			if !bytes.Equal(got, want) {
				t.Fatalf("%s, %s: store received %d bytes %x\nwant %d bytes %x", g.gen, g.mode.name, len(got), got, len(want), want)
			}
		}
	})
}

// sendAndRecord sends data through the proxy at addr, split at an arbitrary point, ends the
// client's side, waits for the proxy to close the connection and returns what store received for
// it: nothing when the proxy made no store connection for it (it makes one for the first message
// it forwards). A store connection the proxy made was established before the proxy closed the
// client, so store.Settle finds it.
func sendAndRecord(t *testing.T, addr string, data []byte, split uint16, store *storesim.Store) []byte {
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
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the proxy kept the connection open after the client's end")
	}
	from, to, err := store.Settle(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Forget() // a long fuzzing run keeps no store's record of the inputs
	switch to - from {
	case 0:
		return nil
	case 1:
		got, err := store.Wait(from, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	t.Fatalf("the proxy made %d store connections for one client", to-from)
	return nil
}
