package audit

import (
	"bufio"
	"encoding/json"
	"io"
	"net/netip"
	"testing"
	"time"
)

// A sink nobody reads (a pipe whose reader stalled) must not stop whoever records events: the
// queue takes what fits, drops the rest without waiting, and once the sink reads again it writes
// the queued events and then one dropped_summary with the exact count.
func TestQueueNeverWaitsForAStalledSink(t *testing.T) {
	pr, pw := io.Pipe()
	q := NewQueue(New(pw, Options{}), 4)
	src := netip.MustParseAddr("192.0.2.7")
	var dropped int
	start := time.Now()
	for range 100 {
		if err := q.Write(Event{Action: ActionBlocked, Reason: "key_too_long", SourceIP: src}); err == ErrQueueFull {
			dropped++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if waited := time.Since(start); waited > 30*time.Second {
		t.Fatalf("100 writes into a stalled sink took %v", waited)
	}
	// The drain goroutine holds one event in its blocked write; 4 wait in the queue.
	if dropped < 100-6 || dropped > 100-4 || q.Dropped() != uint64(dropped) {
		t.Fatalf("dropped %d (Dropped() %d), want 94 to 96", dropped, q.Dropped())
	}
	lines := make(chan map[string]any, 200)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var m map[string]any
			json.Unmarshal(sc.Bytes(), &m)
			lines <- m
		}
		close(lines)
	}()
	// One more event after the sink recovers carries the summary in front of it.
	time.Sleep(50 * time.Millisecond)
	q.Write(Event{Action: ActionBlocked, Reason: "unknown_opcode", SourceIP: src})
	if err := q.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	var blocked int
	var summarised float64
	for m := range lines {
		switch m["event.action"] {
		case string(ActionBlocked):
			blocked++
		case string(ActionDroppedSummary):
			summarised += m["storeguard.suppressed"].(float64)
		}
	}
	if blocked+dropped != 101 || int(summarised) != dropped {
		t.Fatalf("written %d blocked + %d dropped, summary said %v: want 101 in all, the summary exact", blocked,
			dropped, summarised)
	}
}

// Close gives up on a sink that stays stalled instead of hanging shutdown.
func TestQueueCloseGivesUpOnAStalledSink(t *testing.T) {
	_, pw := io.Pipe()
	q := NewQueue(New(pw, Options{}), 4)
	q.Write(Event{Action: ActionBlocked})
	q.Write(Event{Action: ActionBlocked})
	if err := q.Close(100 * time.Millisecond); err == nil {
		t.Fatal("Close reported success with events stuck behind a stalled sink")
	}
}
