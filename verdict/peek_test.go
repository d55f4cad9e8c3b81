package verdict

import (
	"testing"
	"time"

	"github.com/storeguard/storeguard/admission"
)

func TestPeeks(t *testing.T) {
	var p Peeks
	for i := range admission.MaxPeeks {
		if !p.Take() {
			t.Fatalf("take %d refused", i)
		}
	}
	if p.Take() {
		t.Fatal("took one past admission.MaxPeeks")
	}
	p.Done()
	if !p.Take() {
		t.Fatal("a peek given back was not taken again")
	}
	if !Peeked(admission.Banned, time.Second) || !Peeked(admission.BanThrottled, time.Second) {
		t.Error("a banned source's connection is not read")
	}
	if Peeked(admission.Banned, 0) || Peeked(admission.MaxConnections, time.Second) {
		t.Error("read with ban.peek 0, or for a refusal other than a ban")
	}
}

func TestPeek(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := NewPeek(start, time.Second)
	if p.Until() != start.Add(time.Second) || len(p.Bytes()) != 0 {
		t.Fatalf("until %v, %d bytes", p.Until(), len(p.Bytes()))
	}
	// The first bytes: admission.PeekRest more at most.
	if p.Read([]byte("ab"), start.Add(10*time.Millisecond)) || p.Until() != start.Add(10*time.Millisecond+admission.PeekRest) {
		t.Fatalf("after the first bytes: until %v", p.Until())
	}
	// Later bytes move nothing.
	if p.Took(0, start.Add(20*time.Millisecond)) || p.Read([]byte("c"), start.Add(50*time.Millisecond)) ||
		p.Until() != start.Add(10*time.Millisecond+admission.PeekRest) {
		t.Fatalf("later bytes moved the end to %v", p.Until())
	}
	if !p.Read(make([]byte, 100), start.Add(60*time.Millisecond)) || len(p.Bytes()) != admission.PeekBytes ||
		string(p.Bytes()[:3]) != "abc" || len(p.Room()) != 0 {
		t.Fatalf("full: %d bytes %q", len(p.Bytes()), p.Bytes())
	}
	// First bytes after PeekRest would have ended leave ban.peek's end.
	late := NewPeek(start, 50*time.Millisecond)
	if late.Took(1, start.Add(40*time.Millisecond)) || late.Until() != start.Add(50*time.Millisecond) {
		t.Errorf("late first bytes: until %v", late.Until())
	}
	var none *Peek
	if none.Bytes() != nil {
		t.Error("a connection not read has bytes")
	}
}
