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
//   - Each answer within Slow grows the window: by one while below the threshold (doubling each
//     round, as slow start) and by 1/window above it (one a round).
//   - An answer later than Slow, or a request unanswered Slow after it was forwarded, halves the
//     window (to half of what is in flight, if less), at most once per Slow, and sets the
//     threshold there; never below minWindow.
//
// So a store that answers fast gets connections as fast as clients bring them, and one that slows
// gets few at a time, in StoreSlots' queue order: the sources serving a job first, new hosts next,
// churning sources last.

// DefaultSlow is caps.store-dial-slow's default: a store that takes longer than this to answer a
// new connection's first request is slowing. Rank 0's store answers a healthy job start of 8,000
// connections well within it; a stalled resolver takes 5 s.
const DefaultSlow = time.Second

const (
	// firstWindow is the window pacing starts with: a host's ranks, many times over, go at once.
	firstWindow = 64
	// minWindow is the fewest dials in flight a slowing store is given, so that the jobs' new ranks
	// still come in while it recovers.
	minWindow = 8
)

// pacing is StoreSlots' window of dials in flight; its fields are under StoreSlots.mu.
type pacing struct {
	slow      time.Duration
	window    float64
	threshold float64
	inflight  map[*Slot]struct{}
	cut       time.Time // the last halving
	timer     *time.Timer
	armed     bool
}

func (p *pacing) begin(slow time.Duration) {
	*p = pacing{slow: slow, window: firstWindow, threshold: math.Inf(1), inflight: map[*Slot]struct{}{}}
}

// end stops pacing: the dials in flight are forgotten.
func (p *pacing) end() {
	if p.timer != nil {
		p.timer.Stop()
	}
	*p = pacing{}
}

func (p *pacing) full() bool { return float64(len(p.inflight)) >= p.window }

// start puts sl in flight.
func (p *pacing) start(sl *Slot, now time.Time) {
	sl.granted = now
	p.inflight[sl] = struct{}{}
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
	delete(p.inflight, sl)
	if now.Sub(sl.asked) > p.slow {
		p.halve(now)
		return
	}
	if p.window < p.threshold {
		p.window++
	} else {
		p.window += 1 / p.window
	}
}

// halve cuts the window to half of it or of what is in flight, whichever is less, once per slow.
func (p *pacing) halve(now time.Time) {
	if now.Sub(p.cut) < p.slow {
		return
	}
	p.cut = now
	p.window = max(minWindow, min(p.window, float64(len(p.inflight)))/2)
	p.threshold = p.window
}

// look goes over the dials in flight at now: one that asked and has waited longer than slow for
// its answer halves the window; one that has asked nothing within slow of its grant is settled.
func (p *pacing) look(now time.Time) {
	late := false
	for sl := range p.inflight {
		switch {
		case sl.asked.IsZero() && now.Sub(sl.granted) >= p.slow:
			delete(p.inflight, sl)
		case !sl.asked.IsZero() && now.Sub(sl.asked) > p.slow:
			late = true
		}
	}
	if late {
		p.halve(now)
	}
}

// arm sets the timer that looks at the dials in flight, a quarter of slow from now, unless it is
// set already or none is in flight; tick is what it calls.
func (p *pacing) arm(tick func()) {
	if len(p.inflight) == 0 || p.armed {
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
	s.pace.look(s.now())
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

// Pacing is the pacing window and the dials in flight now (0, 0: not paced).
func (s *StoreSlots) Pacing() (window float64, inflight int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.rate.Paced {
		return 0, 0
	}
	return s.pace.window, len(s.pace.inflight)
}
