package fuzz

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
)

type autoGuard struct {
	store *storesim.Store
	addr  string
}

var (
	autoOnce   sync.Once
	autoGuards []autoGuard
)

// fuzzLimits are the limits of every fuzzed guard, small so that the fuzzer reaches them.
var fuzzLimits = protocol.Limits{MaxKeyBytes: 1 << 10, MaxValueBytes: 1 << 14, MaxKeys: 256, MaxMessageBytes: 1 << 16,
	BlockWatchKey: true}

// setupAuto starts, for the whole fuzzing process, one simulated store per generation (and both
// backends of G6) with a guard in auto mode in front of each, and waits until each guard has
// learned its store.
func setupAuto(t testing.TB) {
	autoOnce.Do(func() {
		stores := []struct {
			g protocol.Generation
			b protocol.Backend
		}{{protocol.G0, protocol.BackendLegacy}, {protocol.G1, protocol.BackendLegacy}, {protocol.G2, protocol.BackendLibuv},
			{protocol.G3, protocol.BackendLegacy}, {protocol.G4, protocol.BackendLibuv}, {protocol.G5, protocol.BackendLibuv},
			{protocol.G6, protocol.BackendLibuv}, {protocol.G6, protocol.BackendLegacy}}
		for _, st := range stores {
			store, err := storesim.Start("127.0.0.1:0", st.g, st.b)
			if err != nil {
				t.Fatal(err)
			}
			srv := startFuzzProxy(t, store.Addr(), "auto")
			for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if info, ok := srv.Store(); ok && info.Gen == st.g && info.Backend == st.b {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("the guard did not learn the simulated %s %s store", st.g, st.b)
				}
			}
			autoGuards = append(autoGuards, autoGuard{store: store, addr: srv.Addr().String()})
		}
	})
}

// FuzzAutoFramesAsTheStore: in auto mode, for every pair of client generation (the handshake the
// fuzzer puts in front, or none) and store generation, every byte the guard forwards is framed
// into whole messages by a decoder of the store's true generation, and is a prefix of what that
// decoder accepts of the stream: the guard never forwards a byte the store would read otherwise.
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
		g := autoGuards[int(which)%len(autoGuards)]
		var data []byte
		if c := int(client) % (int(protocol.LatestGeneration) + 2); c > 0 {
			data = protocol.AppendHandshake(nil, protocol.Generation(c-1), 9)
		}
		data = append(data, body...)
		for len(g.store.Ended) > 0 {
			<-g.store.Ended
		}
		got := sendAndRecord(t, g.addr, data, split, g.store.Ended)
		store := protocol.Config{Gen: protocol.GenSetting{Gen: g.store.Gen}, Backend: g.store.Backend, Limits: fuzzLimits}
		want := validPrefix(store, data)
		if !bytes.HasPrefix(want, got) {
			t.Fatalf("%s %s store: it received %x\nwhich is not a prefix of the %x its own decoder accepts of %x",
				g.store.Gen, g.store.Backend, got, want, data)
		}
		if whole := validPrefix(store, got); !bytes.Equal(whole, got) {
			t.Fatalf("%s %s store: it received %x, of which only %x are whole messages", g.store.Gen, g.store.Backend, got, whole)
		}
	})
}
