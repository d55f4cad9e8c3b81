package admission

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Reasons a client's first valid message got no store connection (store_connections_refused_total),
// or had to wait for one (store_connection_waits_total).
const (
	MaxStoreConnections    Reason = "max_store_connections"    // caps.max-store-connections
	SourceStoreConnections Reason = "source_store_connections" // caps.per-source-store-connections
	StoreDialRate          Reason = "store_dial_rate"          // caps.store-dial-rate as a number
	StorePacing            Reason = "store_pacing"             // caps.store-dial-rate auto: dials in flight fill the window
	SourceStoreDialRate    Reason = "source_store_dial_rate"   // caps.per-source-store-dial-rate
)

// DialRate is how fast the guard may open connections to the store (caps.*store-dial-*): Paced, by
// what the store does (pacing.go), or at most Rate a second and Burst at once in all; and at most
// PerSourceRate a second and PerSourceBurst at once for one client source. A rate of 0 is no limit;
// a burst below 1 is taken as 1. Slow is how long a paced store may answer no dial while one waits
// before it counts as stalling (0: DefaultSlow).
type DialRate struct {
	Paced          bool
	Slow           time.Duration
	Rate           float64
	Burst          int
	PerSourceRate  float64
	PerSourceBurst int
}

// StoreSlots counts the connections the guard holds to the store, in all and per client source,
// against caps.max-store-connections and caps.per-source-store-connections: a store aborts or stops
// accepting when it runs out of descriptors (torch 1.13 aborts on EMFILE), and one host's flood of
// valid messages must leave room for every other host's ranks. It also paces the connections it
// grants (DialRate): torch 2.6+ stores resolve each new peer's name in the thread that serves
// every client, so a churn of store connections faster than the resolver answers stalls the whole
// store. It is safe for concurrent use.
//
// By default it paces by the store (DialRate.Paced, pacing.go): a window of dials in flight, which
// grows with the store's answers to new connections and halves, with a rate cap, when it stalls.
//
// Clients that cannot have a slot at once wait in one queue (Take), served in this order: sources
// that serve a job and have not dialled within recentDial (a job's host), then other sources that
// have not (a new host's rank), in each the source with the fewest clients waiting first, then
// first come; last the sources that dialled within recentDial (churning ones), the one that dialled
// longest ago first, so that they share what is left in turn. (Fewest waiting first: once a stall
// caps the dial rate, churning sources stop dialling and, past recentDial, look like new hosts;
// their dozens of queued clients each came before a new rank, which waited 10 to 14 s behind them.
// A job's host brings its ranks, 8 or so; a churner brings a queue.)
// Slots freed, limits raised and dial tokens coming due are handed straight to waiters, so a
// client asking later (TryTake) never overtakes one.
type StoreSlots struct {
	now func() time.Time

	mu       sync.Mutex
	held     Counter // slots, one a connection
	rate     DialRate
	all      bucket                       // dial tokens of the store (rate.Rate > 0)
	sources  map[netip.Addr]*sourceDials  // sources that dialled lately; absent: not within recentDial, tokens full
	swept    int                          // len(sources) after its last sweep
	queued   map[netip.Addr][]*slotWaiter // the waiters, by source, each source's in arrival order
	nqueued  int                          // how many wait
	arrivals uint64
	timer    *time.Timer // serves the queue when the next dial token a waiter needs is due
	pace     pacing      // rate.Paced
	// lookByHand: tests call paceTick themselves, on their own clock (no pacing timer).
	lookByHand bool
}

// slotWaiter is a client queued in Take.
type slotWaiter struct {
	src     netip.Addr
	serving bool   // its source serves a job: it goes first unless it dialled lately
	seq     uint64 // arrival order
	reason  Reason // what holds it back now
	granted chan struct{}
	slot    *Slot // set before granted is closed
}

// recentDial is how lately a source must have dialled the store to wait behind sources that have
// not: a churning source dials again within it, a job's host seldom does.
const recentDial = time.Second

// sourceDials is what StoreSlots remembers of a source's recent store dials.
type sourceDials struct {
	tokens bucket    // rate.PerSourceRate > 0
	last   time.Time // its last dial
}

// NewStoreSlots caps store connections at limit in all and perSource per source (0: no cap), with
// no dial rate until SetDialRate.
func NewStoreSlots(limit, perSource int) *StoreSlots {
	return &StoreSlots{now: time.Now, held: NewCounter(int64(limit), int64(perSource)),
		sources: map[netip.Addr]*sourceDials{}, queued: map[netip.Addr][]*slotWaiter{}}
}

// full says which cap keeps src from another store connection now, or "".
func (s *StoreSlots) full(src netip.Addr) Reason {
	switch s.held.Exceeds(src, 1, 0) {
	case SourceCap:
		return SourceStoreConnections
	case TotalCap:
		return MaxStoreConnections
	}
	return ""
}

// holdsBack says what keeps src from a store connection at now (a cap, then a dial rate), or "".
func (s *StoreSlots) holdsBack(src netip.Addr, now time.Time) Reason {
	if r := s.full(src); r != "" {
		return r
	}
	if d := s.sources[src]; d != nil && s.rate.PerSourceRate > 0 &&
		d.tokens.level(now, s.rate.PerSourceRate, s.rate.PerSourceBurst) < 1 {
		return SourceStoreDialRate
	}
	return s.storeHolds(now)
}

// storeHolds says what of the store's own keeps every source from dialling at now (a full pacing
// window, then the store's dial rate), or "".
func (s *StoreSlots) storeHolds(now time.Time) Reason {
	if s.rate.Paced && s.pace.full() {
		return StorePacing
	}
	if rate, burst, reason := s.allRate(); rate > 0 && s.all.level(now, rate, burst) < 1 {
		return reason
	}
	return ""
}

// holdsBackAll reports whether something that is no source's own keeps every source from a store
// connection at now: the cap in all, a full pacing window or the store's dial rate.
func (s *StoreSlots) holdsBackAll(now time.Time) bool {
	return s.held.Full() || s.storeHolds(now) != ""
}

// allRate is the store-wide dial rate in force, with its burst and the reason it holds a client
// back: the fixed caps.store-dial-rate, or, paced, the cap a stall set (0: none). Both spend the
// tokens of s.all.
func (s *StoreSlots) allRate() (rate float64, burst int, reason Reason) {
	if s.rate.Paced {
		return s.pace.rate, minWindow, StorePacing
	}
	return s.rate.Rate, s.rate.Burst, StoreDialRate
}

// Slot is a store connection's place in StoreSlots: Release gives it back. A slot granted while
// the dials are paced also tells the pacer how fast the store answers it (Asked, Answered).
type Slot struct {
	s        *StoreSlots
	src      netip.Addr
	released atomic.Bool
	// Under s.mu, while the dial is in flight (pacing.go): when it was granted, and when the
	// connection forwarded its first request the store answers at once.
	granted, asked time.Time
}

// take counts one slot for src.
func (s *StoreSlots) take(src netip.Addr) *Slot {
	s.held.Take(src, 1)
	return &Slot{s: s, src: src}
}

// Release gives the slot back; calling it again does nothing. A dial still in flight leaves the
// pacing window without telling it anything of the store.
func (sl *Slot) Release() {
	if sl == nil || !sl.released.CompareAndSwap(false, true) {
		return
	}
	s := sl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pace.settle(sl)
	s.held.Release(sl.src, 1)
	s.serveLocked()
}

// dial spends a dial token of the store and one of src (or, paced, puts sl in flight), and notes
// when src dialled.
func (s *StoreSlots) dial(sl *Slot, now time.Time) {
	src := sl.src
	if s.rate.Paced {
		s.pace.start(sl, now)
	}
	if rate, _, _ := s.allRate(); rate > 0 {
		s.all.tokens--
	}
	d := s.sources[src]
	if d == nil {
		s.sweepLocked(now)
		d = &sourceDials{tokens: bucket{tokens: float64(s.rate.PerSourceBurst), at: now}}
		s.sources[src] = d
	}
	d.last = now
	if s.rate.PerSourceRate > 0 {
		d.tokens.tokens--
	}
}

// sweepLocked forgets the sources that have not dialled within recentDial and whose dial tokens are
// full again (what an absent source has), once the table has doubled since the last sweep.
func (s *StoreSlots) sweepLocked(now time.Time) {
	if len(s.sources) < max(64, 2*s.swept) {
		return
	}
	for src, d := range s.sources {
		if now.Sub(d.last) >= recentDial && (s.rate.PerSourceRate == 0 ||
			d.tokens.level(now, s.rate.PerSourceRate, s.rate.PerSourceBurst) >= float64(s.rate.PerSourceBurst)) {
			delete(s.sources, src)
		}
	}
	s.swept = len(s.sources)
}

// serveLocked grants slots to the waiters nothing holds back, best first, and sets the timer for
// the next dial token one of the others needs. While what holds every source back (a full window,
// the cap in all, the store's dial rate) holds, it looks at no waiter: a job's start queues
// thousands, and an answer, a release or a new client each serve the queue.
func (s *StoreSlots) serveLocked() {
	now := s.now()
	var rateHeld []netip.Addr
	for s.nqueued > 0 {
		if s.holdsBackAll(now) {
			rateHeld = nil
			break
		}
		var w *slotWaiter
		w, rateHeld = s.nextLocked(now)
		if w == nil {
			break
		}
		w.slot = s.take(w.src)
		s.dial(w.slot, now)
		s.dequeueLocked(w)
		close(w.granted)
	}
	s.armLocked(now, rateHeld)
}

// nextLocked is the waiter to serve now, in the queue's order (StoreSlots), or nil: none that
// nothing holds back; rateHeld are the sources their own dial rate holds back. It looks at each
// source once, at the waiter of its own that goes first.
func (s *StoreSlots) nextLocked(now time.Time) (best *slotWaiter, rateHeld []netip.Addr) {
	var bestClass int
	var bestLast time.Time
	for src, q := range s.queued {
		switch s.holdsBack(src, now) {
		case "":
		case SourceStoreDialRate:
			rateHeld = append(rateHeld, src)
			continue
		default:
			continue
		}
		w := q[0]
		class, last := s.class(w, now)
		if class == 1 && !w.serving { // a waiter of a job's host, if there is one, is class 0
			for _, x := range q[1:] {
				if x.serving {
					if c, _ := s.class(x, now); c == 0 {
						w, class = x, 0
					}
					break
				}
			}
		}
		if best == nil || class < bestClass || class == bestClass && s.before(w, best, last, bestLast) {
			best, bestClass, bestLast = w, class, last
		}
	}
	return best, rateHeld
}

// before reports whether w goes before other, of the same class, with last and otherLast their
// sources' last dials: the one that dialled longer ago, then the source with fewer waiting, then
// the first come.
func (s *StoreSlots) before(w, other *slotWaiter, last, otherLast time.Time) bool {
	if !last.Equal(otherLast) {
		return last.Before(otherLast)
	}
	if n, m := len(s.queued[w.src]), len(s.queued[other.src]); n != m {
		return n < m
	}
	return w.seq < other.seq
}

// class is w's place in the queue's order: 0 a job's host, 1 another source that has not dialled
// within recentDial, 2 one that has, with when it last dialled (zero for the others: first come).
// A job's host serves a job (its caller says so: a live connection that completed a valid
// message) and holds a store connection: a churner's connections that completed a message wait in
// this queue with it, and hold none. A source with more clients waiting than a host's start brings
// (caps.per-source-store-dial-burst, or 32) is churning, whenever it last dialled: once a stall
// caps the dial rate, a churner dials seldom.
func (s *StoreSlots) class(w *slotWaiter, now time.Time) (int, time.Time) {
	d := s.sources[w.src]
	switch {
	case d != nil && now.Sub(d.last) < recentDial:
		return 2, d.last
	case len(s.queued[w.src]) > max(s.rate.PerSourceBurst, hostStart):
		return 2, time.Time{}
	case w.serving && s.held.Holds(w.src) > 0:
		return 0, time.Time{}
	}
	return 1, time.Time{}
}

// hostStart is the most store clients a host's start brings at once when no per-source dial burst
// says: 8 ranks x up to 4 store clients each.
const hostStart = 32

func (s *StoreSlots) dequeueLocked(w *slotWaiter) {
	q := s.queued[w.src]
	if i := slices.Index(q, w); i >= 0 {
		s.nqueued--
		if len(q) == 1 {
			delete(s.queued, w.src)
		} else {
			s.queued[w.src] = slices.Delete(q, i, i+1)
		}
	}
}

// armLocked sets the timer for the soonest dial token a waiter held back by a dial rate needs (the
// store's, or those of rateHeld, sources held back by their own), and the pacer's for its next
// look at the dials in flight.
func (s *StoreSlots) armLocked(now time.Time, rateHeld []netip.Addr) {
	if s.rate.Paced && !s.lookByHand {
		s.pace.arm(s.paceTick)
	}
	next := time.Duration(-1)
	if rate, burst, _ := s.allRate(); s.nqueued > 0 && rate > 0 && s.all.level(now, rate, burst) < 1 {
		next = s.all.due(rate) // a full pacing window frees as answers come; a spent rate's token comes due
	}
	for _, src := range rateHeld {
		if d := s.sources[src].tokens.due(s.rate.PerSourceRate); next < 0 || d < next {
			next = d
		}
	}
	switch {
	case next < 0:
	case s.timer == nil:
		s.timer = time.AfterFunc(next, s.serve)
	default:
		s.timer.Reset(next)
	}
}

// serve serves the queue (the timer's function).
func (s *StoreSlots) serve() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serveLocked()
}

// TryTake takes a slot for src if one is free now and the dial rate or the pacing window has room
// for it; otherwise reason names the cap, rate or window that holds it back.
func (s *StoreSlots) TryTake(src netip.Addr) (slot *Slot, reason Reason) {
	src = src.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serveLocked() // the waiters first, with any token that came due
	now := s.now()
	if r := s.holdsBack(src, now); r != "" {
		return nil, r
	}
	slot = s.take(src)
	s.dial(slot, now)
	return slot, ""
}

// Take takes a slot for src, waiting in the queue until one is free and the dial rate or pacing
// window has room for it, or until ctx ends: then reason names what held it back last. serving: src has a live
// connection serving a job, and goes before other sources unless it dialled within recentDial (one
// live connection does not put a churning source first).
func (s *StoreSlots) Take(ctx context.Context, src netip.Addr, serving bool) (slot *Slot, reason Reason) {
	w := &slotWaiter{src: src.Unmap(), serving: serving, granted: make(chan struct{})}
	s.mu.Lock()
	w.seq = s.arrivals
	s.arrivals++
	s.queued[w.src] = append(s.queued[w.src], w)
	s.nqueued++
	s.serveLocked()
	// What holds it back, if it waits: never "" then, for serveLocked stops only when every source
	// is held back (by what holds all back, or by its own cap or rate).
	w.reason = s.holdsBack(w.src, s.now())
	s.mu.Unlock()
	select {
	case <-w.granted:
		return w.slot, ""
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-w.granted: // granted meanwhile
		return w.slot, ""
	default:
	}
	if r := s.holdsBack(w.src, s.now()); r != "" {
		w.reason = r
	}
	s.dequeueLocked(w)
	return nil, w.reason
}

// SetLimits changes the caps (0: none). Slots already taken stay taken; waiters look again.
func (s *StoreSlots) SetLimits(limit, perSource int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held.SetLimits(int64(limit), int64(perSource))
	s.serveLocked()
}

// SetDialRate changes the dial rates. Tokens on hand are kept, counted up to now at the old rates,
// up to the new bursts; a rate that was off starts full. Pacing keeps its window across changes
// of Slow; turned on, it starts at its first window.
func (s *StoreSlots) SetDialRate(r DialRate) {
	r.Burst, r.PerSourceBurst = max(1, r.Burst), max(1, r.PerSourceBurst)
	if r.Slow <= 0 {
		r.Slow = DefaultSlow
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	switch {
	case r.Paced && !s.rate.Paced:
		s.pace.begin(r.Slow)
	case r.Paced:
		s.pace.slow = r.Slow
	case s.rate.Paced:
		s.pace.end()
	}
	s.all = s.all.rerated(now, s.rate.Rate, s.rate.Burst, r.Burst)
	for _, d := range s.sources {
		d.tokens = d.tokens.rerated(now, s.rate.PerSourceRate, s.rate.PerSourceBurst, r.PerSourceBurst)
	}
	s.rate = r
	s.serveLocked()
}

// SetBacklog tells the pacer how many connections the store's accept queue holds (0: unknown): the
// window starts at it, first learned before any stall, and stays within it.
func (s *StoreSlots) SetBacklog(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	unknown := s.pace.ceiling == 0
	s.pace.ceiling = float64(max(0, n))
	if s.rate.Paced && unknown {
		s.pace.learned() // bounds it too
	} else if s.rate.Paced {
		s.pace.bound()
	}
	s.serveLocked()
}

// InUse is how many slots are taken now.
func (s *StoreSlots) InUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.held.Used())
}

// Waiting is how many clients wait in Take now.
func (s *StoreSlots) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nqueued
}

// Limit is the cap in all now; 0: none.
func (s *StoreSlots) Limit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.held.Limit())
}

// Adopt counts a store connection another process opened and hands over, whatever the caps say
// now: it is open already (it spends no dial token and is not in flight).
func (s *StoreSlots) Adopt(src netip.Addr) *Slot {
	src = src.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.take(src)
}

// bucket is a token bucket: tokens as of at.
type bucket struct {
	tokens float64
	at     time.Time
}

// level brings the bucket up to now, at rate tokens a second up to burst, and returns its tokens.
func (b *bucket) level(now time.Time, rate float64, burst int) float64 {
	if d := now.Sub(b.at); d > 0 {
		b.tokens += d.Seconds() * rate
		b.at = now
	}
	b.tokens = min(b.tokens, float64(burst)) // also after a burst lowered by SetDialRate
	return b.tokens
}

// rerated is the bucket as of now for a new burst: its tokens counted at the old rate and burst, or
// full if the old rate was 0 (off: none were counted).
func (b bucket) rerated(now time.Time, rate float64, burst, newBurst int) bucket {
	if rate == 0 {
		return bucket{tokens: float64(newBurst), at: now}
	}
	b.level(now, rate, burst)
	return b
}

// due is how long until the bucket, as last brought up to date, holds a whole token at rate.
func (b *bucket) due(rate float64) time.Duration {
	if b.tokens >= 1 {
		return 0
	}
	return time.Duration((1-b.tokens)/rate*float64(time.Second)) + time.Millisecond
}
