package verdict

import (
	"net/netip"
	"sync"
	"testing"
)

func TestSources(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	var changed []netip.Addr
	s := NewSources(nil, func(src netip.Addr) { changed = append(changed, src) })
	if s.Serving(a) || s.ServingBesides(a, false) {
		t.Fatal("a source with nothing counted serves a job")
	}
	s.Talk(a)
	if !s.Serving(a) || s.Serving(b) || s.Count(a) != 1 {
		t.Fatalf("after one talk: serving %v, b serving %v, count %d", s.Serving(a), s.Serving(b), s.Count(a))
	}
	// A connection's own valid messages are no evidence of a job.
	if s.ServingBesides(a, true) || !s.ServingBesides(a, false) {
		t.Error("ServingBesides counts the asking connection")
	}
	s.Talk(a)
	if !s.ServingBesides(a, true) {
		t.Error("another connection of the source talked")
	}
	s.Untalk(a)
	s.Untalk(a)
	if s.Serving(a) || s.Count(a) != 0 || len(s.talkers) != 0 {
		t.Errorf("after both ended: serving %v, count %d, %d sources kept", s.Serving(a), s.Count(a), len(s.talkers))
	}
	if len(changed) != 4 {
		t.Errorf("changed called %d times, want 4", len(changed))
	}
}

// The Locker given guards the counts, and changed runs with it held.
func TestSourcesLocker(t *testing.T) {
	var mu sync.Mutex
	src := netip.MustParseAddr("10.0.0.1")
	var s *Sources
	s = NewSources(&mu, func(a netip.Addr) {
		if mu.TryLock() {
			t.Error("changed called without the lock held")
			mu.Unlock()
		}
		_ = s.Count(a)
	})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				s.Talk(src)
				s.Serving(src)
				s.Untalk(src)
			}
		})
	}
	wg.Wait()
	mu.Lock()
	n := s.Count(src)
	mu.Unlock()
	if n != 0 {
		t.Errorf("count %d after every talk was undone", n)
	}
}
