package storeinfo

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
)

// TestLearnStoreEveryGeneration: the probes name every generation and backend, and leave the
// store as they found it (no key created, none left behind).
func TestLearnStoreEveryGeneration(t *testing.T) {
	type store struct {
		g protocol.Generation
		b protocol.Backend
	}
	cases := []struct {
		store
		want Info
	}{
		{store{protocol.G0, protocol.BackendLegacy}, Info{protocol.G0, protocol.BackendLegacy}},
		{store{protocol.G1, protocol.BackendLegacy}, Info{protocol.G1, protocol.BackendLegacy}},
		// A legacy G4 store has no queue ops: it answers exactly as G3.
		{store{protocol.G4, protocol.BackendLegacy}, Info{protocol.G3, protocol.BackendLegacy}},
	}
	for g := protocol.G2; g <= protocol.LatestGeneration; g++ {
		for _, b := range []protocol.Backend{protocol.BackendLegacy, protocol.BackendLibuv} {
			if g != protocol.G4 || b != protocol.BackendLegacy {
				cases = append(cases, struct {
					store
					want Info
				}{store{g, b}, Info{g, b}})
			}
		}
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s-%s", tc.g, tc.b), func(t *testing.T) {
			s := storesim.StartT(t, "127.0.0.1:0", tc.g, tc.b)
			got, err := Learn(context.Background(), s.Addr(), 2*time.Second)
			if err != nil || got != tc.want {
				t.Fatalf("Learn = %v, %v; want %v", got, err, tc.want)
			}
			if n := s.NumKeys(); n != 0 {
				t.Errorf("the probes left %d keys in the store", n)
			}
		})
	}
}

// TestLearnStoreNeverGuesses: a store that does not answer, or is not up, is an error to retry,
// not a generation.
func TestLearnStoreNeverGuesses(t *testing.T) {
	s := storesim.StartT(t, "127.0.0.1:0", protocol.G1, protocol.BackendLegacy)
	s.Pause()
	if got, err := Learn(context.Background(), s.Addr(), 200*time.Millisecond); !errors.Is(err, errStoreSlow) {
		t.Fatalf("paused G1 store: %v, %v; want errStoreSlow", got, err)
	}
	s.Resume()
	if got, err := Learn(context.Background(), s.Addr(), time.Second); err != nil || got.Gen != protocol.G1 {
		t.Fatalf("resumed G1 store: %v, %v", got, err)
	}
	if got, err := Learn(context.Background(), closedAddr(t), 200*time.Millisecond); err == nil {
		t.Fatalf("no store: %v, want an error", got)
	}
}

// closedAddr is an address on this host where nothing listens: a dial is refused.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return ln.Addr().String()
}

// TestProbeBytesHarmNoLegacyStore: the probes are the bytes docs/protocol.md shows, and every one
// that a G0/G1 store reads as a SET declares a key length of 2^63 or more, which it refuses before
// allocating.
func TestProbeBytesHarmNoLegacyStore(t *testing.T) {
	key := hex.EncodeToString(probeKey)
	klen := "1b00000000000000"
	want := map[string]string{
		"A": "00cef7853c 07 0dffffffff",
		"B": "06 0b",
		"F": "0c",
		"C": "00cef7853c 0dffffffff 11",
		"D": "00cef7853c 0dffffffff 12" + klen + key + "0100000000000000 08" + klen + key,
		"E": "00cef7853c 0dffffffff 10" + klen + key,
	}
	hello := func(b []byte) []byte { return append(probeHello[:len(probeHello):len(probeHello)], b...) }
	got := map[string][]byte{"A": probeG2Steps.a, "B": probeLegacy, "F": probeG2Steps.cancelWait,
		"C": hello(probeG2Steps.list), "D": hello(probeG2Steps.barrier), "E": hello(probeG2Steps.queueLen)}
	for name, w := range want {
		if g := hex.EncodeToString(got[name]); g != strings.ReplaceAll(w, " ", "") {
			t.Errorf("probe %s: %s, want %s", name, g, w)
		}
		if b := got[name]; b[0] == 0 {
			if keyLen := binary.LittleEndian.Uint64(b[1:9]); keyLen < 1<<63 {
				t.Errorf("probe %s: a G0/G1 store reads a key length of %#x", name, keyLen)
			}
		}
	}
}
