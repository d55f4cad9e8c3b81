package admission

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestStoreSlotsCaps(t *testing.T) {
	tests := []struct {
		name          string
		limit, perSrc int
		held          []string // sources holding a slot first
		src           string
		want          Reason
	}{
		{name: "no caps", held: []string{"10.0.0.1", "10.0.0.1"}, src: "10.0.0.1"},
		{name: "under both", limit: 3, perSrc: 2, held: []string{"10.0.0.1"}, src: "10.0.0.1"},
		{name: "source full", limit: 10, perSrc: 2, held: []string{"10.0.0.1", "10.0.0.1"}, src: "10.0.0.1", want: SourceStoreConnections},
		{name: "another source", limit: 10, perSrc: 2, held: []string{"10.0.0.1", "10.0.0.1"}, src: "10.0.0.2"},
		{name: "all full", limit: 2, perSrc: 2, held: []string{"10.0.0.1", "10.0.0.2"}, src: "10.0.0.3", want: MaxStoreConnections},
		{name: "source named first", limit: 2, perSrc: 2, held: []string{"10.0.0.1", "10.0.0.1"}, src: "10.0.0.1", want: SourceStoreConnections},
		{name: "mapped is the same source", perSrc: 1, held: []string{"10.0.0.1"}, src: "::ffff:10.0.0.1", want: SourceStoreConnections},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStoreSlots(tc.limit, tc.perSrc)
			for _, h := range tc.held {
				if _, r := s.TryTake(gateAddr(h)); r != "" {
					t.Fatalf("setup: TryTake(%s) = %q", h, r)
				}
			}
			release, r := s.TryTake(gateAddr(tc.src))
			if r != tc.want || (release == nil) != (tc.want != "") {
				t.Fatalf("TryTake(%s) = %q, want %q", tc.src, r, tc.want)
			}
		})
	}
}

// Every slot taken is given back exactly once, however often its release is called: a count
// that leaked would lock a job out of its store.
func TestStoreSlotsReleaseOnce(t *testing.T) {
	s := NewStoreSlots(2, 1)
	a, _ := s.TryTake(gateAddr("10.0.0.1"))
	b, _ := s.TryTake(gateAddr("10.0.0.2"))
	a()
	a()
	if n := s.InUse(); n != 1 {
		t.Fatalf("InUse = %d after one of two released (twice), want 1", n)
	}
	if _, r := s.TryTake(gateAddr("10.0.0.2")); r != SourceStoreConnections {
		t.Fatalf("a second release of another source's slot freed 10.0.0.2's: %q", r)
	}
	b()
	if n := s.InUse(); n != 0 || len(s.bySource) != 0 {
		t.Fatalf("InUse = %d, sources %v after all released", n, s.bySource)
	}
}

func TestStoreSlotsTakeWaits(t *testing.T) {
	s := NewStoreSlots(1, 0)
	held, _ := s.TryTake(gateAddr("10.0.0.1"))
	got := make(chan Reason)
	go func() {
		release, r := s.Take(context.Background(), gateAddr("10.0.0.2"))
		if release != nil {
			defer release()
		}
		got <- r
	}()
	select {
	case r := <-got:
		t.Fatalf("Take returned %q while the only slot was held", r)
	case <-time.After(50 * time.Millisecond):
	}
	held()
	if r := <-got; r != "" {
		t.Fatalf("Take after a release = %q, want a slot", r)
	}
}

func TestStoreSlotsTakeGivesUp(t *testing.T) {
	s := NewStoreSlots(0, 1)
	s.TryTake(gateAddr("10.0.0.1"))
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if release, r := s.Take(ctx, gateAddr("10.0.0.1")); release != nil || r != SourceStoreConnections {
		t.Fatalf("Take with the source full and ctx ended = %q, want %q", r, SourceStoreConnections)
	}
	if n := s.InUse(); n != 1 {
		t.Fatalf("InUse = %d, want 1", n)
	}
}

func TestStoreSlotsRaisedLimitWakesWaiters(t *testing.T) {
	s := NewStoreSlots(1, 0)
	s.TryTake(gateAddr("10.0.0.1"))
	got := make(chan Reason)
	go func() {
		_, r := s.Take(context.Background(), gateAddr("10.0.0.2"))
		got <- r
	}()
	time.Sleep(20 * time.Millisecond)
	s.SetLimits(2, 0)
	if r := <-got; r != "" {
		t.Fatalf("Take after the limit was raised = %q", r)
	}
	if s.Limit() != 2 || s.InUse() != 2 {
		t.Fatalf("Limit %d InUse %d, want 2 and 2", s.Limit(), s.InUse())
	}
}

func TestStoreSlotsConcurrent(t *testing.T) {
	s := NewStoreSlots(8, 3)
	var wg sync.WaitGroup
	var mu sync.Mutex
	maxUsed := 0
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := gateAddr([]string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}[i%4])
			for range 50 {
				release, r := s.Take(context.Background(), src)
				if r != "" {
					t.Errorf("Take = %q", r)
					return
				}
				s.mu.Lock()
				n, used := s.bySource[src], s.used
				s.mu.Unlock()
				mu.Lock()
				maxUsed = max(maxUsed, used)
				mu.Unlock()
				if n > 3 {
					t.Errorf("source %s holds %d slots, cap 3", src, n)
				}
				release()
			}
		}()
	}
	wg.Wait()
	if s.InUse() != 0 || maxUsed > 8 {
		t.Fatalf("InUse %d at the end (want 0), at most %d at once (cap 8)", s.InUse(), maxUsed)
	}
}
