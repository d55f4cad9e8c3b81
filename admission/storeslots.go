package admission

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Reasons a client's first valid message got no store connection (store_connections_refused_total).
const (
	MaxStoreConnections    Reason = "max_store_connections"    // caps.max-store-connections
	SourceStoreConnections Reason = "source_store_connections" // caps.per-source-store-connections
)

// StoreSlots counts the connections the guard holds to the store, in all and per client source,
// against caps.max-store-connections and caps.per-source-store-connections: a store aborts or stops
// accepting when it runs out of descriptors (torch 1.13 aborts on EMFILE), and one host's flood of
// valid messages must leave room for every other host's ranks. It is safe for concurrent use.
type StoreSlots struct {
	mu       sync.Mutex
	cond     *sync.Cond
	limit    int // 0 = unlimited
	perSrc   int // 0 = unlimited
	used     int
	bySource map[netip.Addr]int
}

// NewStoreSlots caps store connections at limit in all and perSource per source (0: no cap).
func NewStoreSlots(limit, perSource int) *StoreSlots {
	s := &StoreSlots{limit: limit, perSrc: perSource, bySource: map[netip.Addr]int{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// full says which cap keeps src from another store connection now, or "".
func (s *StoreSlots) full(src netip.Addr) Reason {
	switch {
	case s.perSrc > 0 && s.bySource[src] >= s.perSrc:
		return SourceStoreConnections
	case s.limit > 0 && s.used >= s.limit:
		return MaxStoreConnections
	}
	return ""
}

// take counts one slot for src and returns what gives it back, once.
func (s *StoreSlots) take(src netip.Addr) (release func()) {
	s.used++
	s.bySource[src]++
	var released atomic.Bool
	return func() {
		if !released.CompareAndSwap(false, true) {
			return
		}
		s.mu.Lock()
		s.used--
		if s.bySource[src]--; s.bySource[src] <= 0 {
			delete(s.bySource, src)
		}
		s.mu.Unlock()
		s.cond.Broadcast()
	}
}

// TryTake takes a slot for src if one is free now: release gives it back (calling it again does
// nothing); otherwise reason names the cap that is full.
func (s *StoreSlots) TryTake(src netip.Addr) (release func(), reason Reason) {
	src = src.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.full(src); r != "" {
		return nil, r
	}
	return s.take(src), ""
}

// Take takes a slot for src, waiting while the caps are full, until ctx ends: then reason names
// the cap that was full last.
func (s *StoreSlots) Take(ctx context.Context, src netip.Addr) (release func(), reason Reason) {
	src = src.Unmap()
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		r := s.full(src)
		if r == "" {
			return s.take(src), ""
		}
		if ctx.Err() != nil {
			return nil, r
		}
		s.cond.Wait()
	}
}

// SetLimits changes the caps (0: none). Slots already taken stay taken; waiters look again.
func (s *StoreSlots) SetLimits(limit, perSource int) {
	s.mu.Lock()
	s.limit, s.perSrc = limit, perSource
	s.mu.Unlock()
	s.cond.Broadcast()
}

// InUse is how many slots are taken now.
func (s *StoreSlots) InUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// Limit is the cap in all now; 0: none.
func (s *StoreSlots) Limit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit
}

// Adopt counts a store connection another process opened and hands over, whatever the caps say
// now: it is open already. It returns what gives the slot back, as TryTake.
func (s *StoreSlots) Adopt(src netip.Addr) (release func()) {
	src = src.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.take(src)
}
