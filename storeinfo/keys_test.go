package storeinfo

import (
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
)

type lookups struct {
	Observer
	n int
}

func (l *lookups) KeyLookup(string) { l.n++ }

// TestValue: the store's value of a key, CHECK first (no GET of a missing key, which would wait
// for it); a value past the limit is an error, and the next question still gets its own answer.
// None of it counts as a write-once lookup.
func TestValue(t *testing.T) {
	s := storesim.StartT(t, "127.0.0.1:0", protocol.G3, protocol.BackendLibuv)
	obs := &lookups{}
	l := NewLearner(func() Target { return Target{Addr: s.Addr(), Gen: protocol.G3} }, obs, time.Now)
	s.Set("/r.0/MASTER_PORT", []byte("41234"))
	s.Set("/long", []byte(strings.Repeat("x", 40)))
	if v, ok, err := l.Value([]byte("/r.0/MASTER_PORT"), 16); string(v) != "41234" || !ok || err != nil {
		t.Fatalf("Value = %q, %v, %v", v, ok, err)
	}
	if v, ok, err := l.Value([]byte("/missing"), 16); v != nil || ok || err != nil {
		t.Fatalf("Value of a missing key = %q, %v, %v", v, ok, err)
	}
	if _, _, err := l.Value([]byte("/long"), 16); err == nil || !strings.Contains(err.Error(), "40 bytes, more than 16") {
		t.Fatalf("Value past the limit: %v", err)
	}
	if v, ok, err := l.Value([]byte("/r.0/MASTER_PORT"), 16); string(v) != "41234" || !ok || err != nil {
		t.Fatalf("Value after a refused one = %q, %v, %v", v, ok, err)
	}
	if obs.n != 0 {
		t.Fatalf("%d write-once lookups counted", obs.n)
	}
}
