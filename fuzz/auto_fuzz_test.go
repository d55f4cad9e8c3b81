package fuzz

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/proxy"
	"github.com/storeguard/storeguard/storeinfo"
)

type autoGuard struct {
	store *storesim.Store
	mode  mode
	addr  string
}

var (
	autoOnce   sync.Once
	autoGuards [][]autoGuard // per simulated store kind, a guard of each forwarding mode
)

// fuzzLimits are the limits of every fuzzed guard, small so that the fuzzer reaches them.
var fuzzLimits = protocol.Limits{MaxKeyBytes: 1 << 10, MaxValueBytes: 1 << 14, MaxKeys: 256, MaxMessageBytes: 1 << 16,
	BlockWatchKey: true}

// setupAuto starts, for the whole fuzzing process, simulated stores of every generation (and both
// backends of G6), each with a guard in auto mode in front of it per forwarding mode, and waits
// until each guard has learned its store.
func setupAuto(t testing.TB) {
	autoOnce.Do(func() {
		stores := []struct {
			g protocol.Generation
			b protocol.Backend
		}{{protocol.G0, protocol.BackendLegacy}, {protocol.G1, protocol.BackendLegacy}, {protocol.G2, protocol.BackendLibuv},
			{protocol.G3, protocol.BackendLegacy}, {protocol.G4, protocol.BackendLibuv}, {protocol.G5, protocol.BackendLibuv},
			{protocol.G6, protocol.BackendLibuv}, {protocol.G6, protocol.BackendLegacy}}
		type learning struct {
			srv  *proxy.Server
			want storeinfo.Info
		}
		var started []learning
		for _, st := range stores {
			var each []autoGuard
			for _, m := range modes {
				store, err := storesim.Start("127.0.0.1:0", st.g, st.b)
				if err != nil {
					t.Fatal(err)
				}
				srv := startFuzzProxy(t, store.Addr(), "auto", m)
				started = append(started, learning{srv, storeinfo.Info{Gen: st.g, Backend: st.b}})
				each = append(each, autoGuard{store: store, mode: m, addr: srv.Addr().String()})
			}
			autoGuards = append(autoGuards, each)
		}
		// The guards learn their stores at once: wait for all of them.
		end := time.Now().Add(10 * time.Second)
		for _, l := range started {
			for info, ok := l.srv.Store(); !ok || info != l.want; info, ok = l.srv.Store() {
				if time.Now().After(end) {
					t.Fatalf("a guard did not learn the simulated %s %s store", l.want.Gen, l.want.Backend)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		// The guards' own store connections (probes, and the sentinel that stays open) are not a
		// client's: sendAndRecord looks at the connections after these only.
		for _, each := range autoGuards {
			for _, g := range each {
				if _, _, err := g.store.Settle(10 * time.Second); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// FuzzAutoFramesAsTheStore: in auto mode, for every pair of client generation (the handshake the
// fuzzer puts in front, or none) and store generation, every byte the guard forwards is framed
// into whole messages by a decoder of the store's true generation, and is a prefix of what that
// decoder accepts of the stream: the guard never forwards a byte the store would read otherwise.
// Both forwarding paths forward the same bytes.
func FuzzAutoFramesAsTheStore(f *testing.F) {
	setupAuto(f)
	var g6 []byte
	g6, _ = protocol.Append(g6, protocol.G6, protocol.Request{Op: protocol.OpSet})
	g1, _ := protocol.Append(nil, protocol.G1, protocol.Request{Op: protocol.OpAppend, Key: []byte("k"), Value: []byte("v")})
	for i := range autoGuards {
		for c := range uint8(protocol.LatestGeneration) + 2 {
			f.Add(g6, uint8(i), c, uint16(3))
			f.Add(g1, uint8(i), c, uint16(9))
		}
		f.Add([]byte{0x03, 0x00, 0x00, 0x0b, 0x06, 0xe0, 0, 0, 0, 0, 0}, uint8(i), uint8(0), uint16(4))
	}
	f.Fuzz(func(t *testing.T, body []byte, which, client uint8, split uint16) {
		if len(body) > 1<<16 {
			return
		}
		var data []byte
		if c := int(client) % (int(protocol.LatestGeneration) + 2); c > 0 {
			data = protocol.AppendHandshake(nil, protocol.Generation(c-1), 9)
		}
		data = append(data, body...)
		var first []byte // what the first mode's store received
		for i, g := range autoGuards[int(which)%len(autoGuards)] {
			got := sendAndRecord(t, g.addr, data, split, g.store)
			store := protocol.Config{Gen: protocol.GenSetting{Gen: g.store.Gen}, Backend: g.store.Backend, Limits: fuzzLimits}
			want := protocol.ValidPrefix(store, data)
			if !bytes.HasPrefix(want, got) {
				t.Fatalf("%s %s store, %s: it received %x\nwhich is not a prefix of the %x its own decoder accepts of %x",
					g.store.Gen, g.store.Backend, g.mode.name, got, want, data)
			}
			if whole := protocol.ValidPrefix(store, got); !bytes.Equal(whole, got) {
				t.Fatalf("%s %s store, %s: it received %x, of which only %x are whole messages",
					g.store.Gen, g.store.Backend, g.mode.name, got, whole)
			}
			if i == 0 {
				first = got
			} else if !bytes.Equal(got, first) {
				t.Fatalf("%s %s store: with %s it received %x, with %s %x",
					g.store.Gen, g.store.Backend, modes[0].name, first, g.mode.name, got)
			}
		}
	})
}
