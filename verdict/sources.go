package verdict

import (
	"net/netip"
	"sync"
)

// Sources counts, per source, the connections open that completed a valid message. A source with
// one serves a job (a rank is there; behind NAT a scanner may share its address): admission
// throttles it rather than refusing it when it is banned, a message deadline of its connections is
// spared (guard.Stream.Expired), and its empty flows are no scan.
//
// The counts are guarded by the Locker Sources is made with: serve's server mutex, which also
// guards the silent index that weighs them (Count, with it held); nil for replay's one goroutine.
type Sources struct {
	mu      sync.Locker
	changed func(src netip.Addr)
	talkers map[netip.Addr]int
}

// NewSources makes the counts, guarded by mu. changed, if set, is called with mu held after a
// source's count changed.
func NewSources(mu sync.Locker, changed func(src netip.Addr)) *Sources {
	if mu == nil {
		mu = noLock{}
	}
	return &Sources{mu: mu, changed: changed, talkers: make(map[netip.Addr]int)}
}

type noLock struct{}

func (noLock) Lock()   {}
func (noLock) Unlock() {}

// Talk counts a connection of src that completed its first valid message; Untalk uncounts it at
// its end.
func (s *Sources) Talk(src netip.Addr) {
	s.mu.Lock()
	s.talkers[src]++
	s.change(src)
	s.mu.Unlock()
}

// Untalk uncounts a connection of src that Talk counted, once it ended.
func (s *Sources) Untalk(src netip.Addr) {
	s.mu.Lock()
	if s.talkers[src]--; s.talkers[src] <= 0 {
		delete(s.talkers, src)
	}
	s.change(src)
	s.mu.Unlock()
}

func (s *Sources) change(src netip.Addr) {
	if s.changed != nil {
		s.changed(src)
	}
}

// Serving reports whether src serves a job: it has a connection open that completed a valid
// message.
func (s *Sources) Serving(src netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.talkers[src] > 0
}

// ServingBesides reports whether src serves a job by a connection other than the one asking,
// which self says Talk counted: its own valid messages are no evidence.
func (s *Sources) ServingBesides(src netip.Addr, self bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.talkers[src]
	if self {
		n--
	}
	return n > 0
}

// Count is how many connections of src Talk counted; the caller holds the Locker.
func (s *Sources) Count(src netip.Addr) int { return s.talkers[src] }
