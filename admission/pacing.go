package admission

import (
	"math"
	"time"
)

// Pacing store dials by what the store does (caps.store-dial-rate: auto).
//
// A store has one thread that serves every client, and a new connection costs it work in that
// thread: torch 2.6+ resolves the peer's name there, so a store whose resolver stalls serves no
// one meanwhile. A fixed dial rate low enough for such a store makes a large job's start wait
// (2,000 ranks 50 times slower than direct, 8,000 never); one high enough for a large job does not
// protect the store. So the guard paces by the store's own answers, as TCP paces by its acks: a
// window of dials in flight, those granted whose store has not answered yet.
//
//   - A dial is in flight from its grant until the store answers the first request the connection
//     forwarded that it answers at once (anything but WAIT and BARRIER: Slot.Asked, Slot.Answered),
//     or the connection ends, or it has asked nothing such within Slow of its grant (a connection
//     that only WAITs or SETs tells nothing of the store's speed; it has held its place that long).
//   - Each answer grows the window: by one while below the threshold (doubling each round, as slow
//     start) and by 1/window above it (one a round). The threshold is forgotten forgetStall after
//     the last stall: a store busy with a large job answers a round in a second, and one a round
//     would take minutes to give it back the window a stall took. An answer grows it only while
//     half of it is in use (as TCP's window validation, RFC 7661: a window the clients never
//     filled says nothing of the store), and never past the store's accept queue (SetBacklog):
//     the dials in flight past it are dropped by the kernel and wait out SYN retransmissions, 1,
//     3, 7 s (torch 1.13's store, backlog 2,048: its 8,000-rank start overflowed by 4,100 to
//     14,700 a start through the guard, 770 to 1,800 direct, while the window grew to 31,000).
//   - A store that makes no progress halves it: when a dial has waited longer than Slow for its
//     answer and no dial was answered within Slow, the window drops to half of it or of what is in
//     flight, whichever is less (never below minWindow), at most once per Slow, and the threshold
//     with it.
//   - A stall also caps the dial rate, at half of the most granted in a Slow lately (the last two
//     whole periods of Slow and this one; at most half the cap already set; never below minRate):
//     a store that answers each new connection in a millisecond but stalls past some rate (a
//     resolver that drops what comes faster than it answers) is kept below it, which no window
//     does. A stall after nothing was granted lately leaves the rate as it is: the store is slow
//     with the dials it had, which the window answers, and half of nothing would cap it at
//     minRate (a legacy store that stalled at the end of an 8,000-rank start was capped at 4 a
//     second, and the next start took 43 s, not 6). Each second without a stall raises the cap
//     by an eighth; past maxRate it is lifted.
//
// Progress, not each answer's time, is the signal: a store busy with a large job answers a new
// connection late (torch 1.13's legacy store polls every connection it has: 8,000 took 16 s
// direct) but answers new connections all the while, and fewer dials in flight would only slow the
// job's start; a stalled store (a resolver that does not answer: 5 s) answers none. So a store
// that answers gets connections as fast as clients bring them, and one that stalls gets few at a
// time, in StoreSlots' queue order: the sources serving a job first, new hosts next, churning
// sources last.

// DefaultSlow is caps.store-dial-slow's default: a store that answers no new connection for this
// long while one waits is stalling (a stalled resolver takes 5 s; a legacy store polling 8,000
// connections still answers one every few milliseconds). Every dial granted before a stall is seen
// costs the stalled store a lookup: at 150 new connections a second, 1 s let 138 through, 250 ms 39.
const DefaultSlow = 250 * time.Millisecond

// raiseEvery is how often a rate cap rises by an eighth while the store does not stall.
const raiseEvery = time.Second

// forgetStall is how long after a stall the window grows by one a round, not one an answer.
const forgetStall = 2 * time.Second

const (
	// firstWindow is the window pacing starts with when the store's accept queue is not known (a
	// store on another host): 64 hosts' ranks go at once, as the fixed rate's burst let them (a
	// legacy store answers a round of a large job's start in half a second: a smaller first window
	// cost it rounds). Known, the queue is the first window (begin).
	firstWindow = 512
	// minWindow is the fewest dials in flight a slowing store is given, so that the jobs' new ranks
	// still come in while it recovers; also the burst of a capped rate.
	minWindow = 8
	// minRate and maxRate bound the rate a stall sets (dials a second): past maxRate (a healthy torch
	// 2.15 store accepts about 3,000 a second) the cap is lifted.
	minRate = 4
	maxRate = 8192
)

// pacing is StoreSlots' window of dials in flight; its fields are under StoreSlots.mu.
type pacing struct {
	slow      time.Duration
	window    float64
	threshold float64
	ceiling   float64 // the store's accept queue (0: unknown), kept across begin and end
	inflight  map[*Slot]struct{}
	cut       time.Time // the last halving
	progress  time.Time // the last answer
	// rate caps the dials a second after a stall (0: none), with StoreSlots.all as its bucket;
	// raised is when it was last raised. granted counts the dials granted since period began, and
	// prior those of the two periods before (each Slow long), to measure the rate a stall halves.
	rate    float64
	raised  time.Time
	period  time.Time
	granted int
	prior   [2]int
	timer   *time.Timer
	armed   bool
}

// begin starts pacing at its first window: the store's accept queue when known, which is what
// the store takes at once from clients that dial it directly (a legacy store's start of 2,000
// ranks, within its queue of 2,048, waited for a first window of 512 to grow: 313 ranks in a fresh
// guard's first start, about 95 in each start after, each handed from its event loop to goroutines
// and back), or firstWindow.
func (p *pacing) begin(slow time.Duration) {
	*p = pacing{slow: slow, window: firstWindow, threshold: math.Inf(1), inflight: map[*Slot]struct{}{}, ceiling: p.ceiling}
	p.learned()
}

// learned sets the window once the store's accept queue is known: the first window, while no
// stall has cut it, and never past the queue after.
func (p *pacing) learned() {
	if p.ceiling > 0 && p.cut.IsZero() {
		p.window = max(minWindow, p.ceiling)
	}
	p.bound()
}

// bound keeps the window within the store's accept queue.
func (p *pacing) bound() {
	if p.ceiling > 0 && p.window > p.ceiling {
		p.window = max(minWindow, p.ceiling)
	}
}

// end stops pacing: the dials in flight are forgotten.
func (p *pacing) end() {
	if p.timer != nil {
		p.timer.Stop()
	}
	*p = pacing{ceiling: p.ceiling}
}

func (p *pacing) full() bool { return float64(len(p.inflight)) >= p.window }

// start puts sl in flight.
func (p *pacing) start(sl *Slot, now time.Time) {
	sl.granted = now
	p.inflight[sl] = struct{}{}
	p.count(now)
	p.granted++
}

// count moves the grant counts on to the period of now.
func (p *pacing) count(now time.Time) {
	for i := 0; now.Sub(p.period) >= p.slow; i++ {
		if i == 3 { // nothing granted for a while: start afresh
			p.prior, p.granted, p.period = [2]int{}, 0, now
			return
		}
		p.prior, p.granted, p.period = [2]int{p.granted, p.prior[0]}, 0, p.period.Add(p.slow)
	}
}

// recentRate is the most dials a second granted in one period lately: the two whole periods
// before this one, and this one so far.
func (p *pacing) recentRate(now time.Time) float64 {
	p.count(now)
	return float64(max(p.prior[0], p.prior[1], p.granted)) / p.slow.Seconds()
}

// settle takes sl out of flight, telling nothing of the store.
func (p *pacing) settle(sl *Slot) {
	if p.inflight != nil {
		delete(p.inflight, sl)
	}
}

// answered takes sl out of flight with the time the store took to answer it.
func (p *pacing) answered(sl *Slot, now time.Time) {
	if _, ok := p.inflight[sl]; !ok || sl.asked.IsZero() {
		p.settle(sl)
		return
	}
	used := float64(len(p.inflight))
	delete(p.inflight, sl)
	p.progress = now
	switch {
	case used < p.window/2:
	case p.window < p.threshold:
		p.window++
	default:
		p.window += 1 / p.window
	}
	p.bound()
}

// halve cuts the window to half of it or of what is in flight, whichever is less, and the dial
// rate to half of what was granted lately or of the cap, once per slow. tokens are the rate's.
func (p *pacing) halve(now time.Time, tokens *bucket) {
	if now.Sub(p.cut) < p.slow {
		return
	}
	p.cut, p.raised = now, now
	p.window = max(minWindow, min(p.window, float64(len(p.inflight)))/2)
	p.threshold = p.window
	r := p.recentRate(now)
	if r == 0 {
		return
	}
	if p.rate > 0 {
		r = min(r, p.rate)
	}
	p.rate = max(minRate, r/2)
	*tokens = bucket{at: now} // the stall spent what was there
}

// raise lifts the rate cap by an eighth each raiseEvery without a stall, and lifts it past maxRate.
func (p *pacing) raise(now time.Time) {
	if p.rate == 0 || now.Sub(p.raised) < raiseEvery {
		return
	}
	p.raised = now
	if p.rate += max(1, p.rate/8); p.rate > maxRate {
		p.rate = 0
	}
}

// look goes over the dials in flight at now: one that asked and has waited longer than slow for
// its answer, with no answer to any within slow, halves the window; one that has asked nothing
// within slow of its grant is settled.
func (p *pacing) look(now time.Time, tokens *bucket) {
	late := false
	for sl := range p.inflight {
		switch {
		case sl.asked.IsZero() && now.Sub(sl.granted) >= p.slow:
			delete(p.inflight, sl)
		case !sl.asked.IsZero() && now.Sub(sl.asked) > p.slow:
			late = true
		}
	}
	switch {
	case late && now.Sub(p.progress) > p.slow:
		p.halve(now, tokens)
	case now.Sub(p.cut) >= forgetStall:
		p.threshold = math.Inf(1)
		fallthrough
	default:
		p.raise(now)
	}
}

// arm sets the timer that looks at the dials in flight, a quarter of slow from now, unless it is
// set already or there is nothing to look at (none in flight, no rate cap to raise); tick is what
// it calls.
func (p *pacing) arm(tick func()) {
	if len(p.inflight) == 0 && p.rate == 0 || p.armed {
		return
	}
	p.armed = true
	if p.timer == nil {
		p.timer = time.AfterFunc(p.slow/4, tick)
	} else {
		p.timer.Reset(p.slow / 4)
	}
}

// paceTick is the pacer's timer: it looks at the dials in flight and serves the queue.
func (s *StoreSlots) paceTick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.rate.Paced {
		return
	}
	s.pace.armed = false
	s.pace.look(s.now(), &s.all)
	s.serveLocked()
}

// Asked tells the pacer that the connection forwarded its first request the store answers at once;
// later calls do nothing.
func (sl *Slot) Asked() {
	s := sl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pace.inflight[sl]; ok && sl.asked.IsZero() {
		sl.asked = s.now()
	}
}

// Answered tells the pacer that the store's first bytes on the connection came: the dial is out of
// flight, and, if it had asked, the time the store took grows or halves the window.
func (sl *Slot) Answered() {
	s := sl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pace.inflight[sl]; !ok {
		return
	}
	s.pace.answered(sl, s.now())
	s.serveLocked()
}

// Pacing is the pacing window, the dials in flight and the rate cap a stall set (0: none) now;
// all 0 when not paced.
func (s *StoreSlots) Pacing() (window float64, inflight int, rate float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.rate.Paced {
		return 0, 0, 0
	}
	return s.pace.window, len(s.pace.inflight), s.pace.rate
}
