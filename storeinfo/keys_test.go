package storeinfo

import (
	"net"
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
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(protocol.AppendHandshake(nil, protocol.G3, 1))
	for k, v := range map[string]string{"/r.0/MASTER_PORT": "41234", "/long": strings.Repeat("x", 40)} {
		m, _ := protocol.Append(nil, protocol.G3, protocol.Request{Op: protocol.OpSet, Key: []byte(k), Value: []byte(v)})
		c.Write(m)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.NumKeys() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
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
