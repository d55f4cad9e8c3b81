package admission

import (
	"fmt"
	"testing"
	"time"
)

// take fills the window from distinct sources (no per-source rate here) and returns the slots.
func takeN(t *testing.T, s *StoreSlots, n, from int) []*Slot {
	t.Helper()
	slots := make([]*Slot, n)
	for i := range slots {
		sl, r := s.TryTake(gateAddr(fmt.Sprintf("10.1.%d.%d", (from+i)/250, (from+i)%250+1)))
		if r != "" {
			t.Fatalf("TryTake %d of %d: %q (window %v)", i+1, n, r, s.pace.window)
		}
		slots[i] = sl
	}
	return slots
}

func held(t *testing.T, s *StoreSlots, want Reason) {
	t.Helper()
	if sl, r := s.TryTake(gateAddr("10.9.9.9")); r != want {
		t.Fatalf("TryTake past the window: %q, want %q (window %v, in flight %d)", r, want, s.pace.window, len(s.pace.inflight))
	} else if sl != nil {
		sl.Release()
	}
}

// A store that answers fast is given connections as fast as they come: the window starts at 64
// dials in flight, and each answer within store-dial-slow lets one more in and grows the window by
// one (slow start: it doubles each round).
func TestPacingGrowsWhileTheStoreAnswers(t *testing.T) {
	s, clk := pacedSlots(DialRate{Paced: true})
	round := takeN(t, s, firstWindow, 0)
	held(t, s, StorePacing)
	taken := firstWindow
	for r := range 4 {
		var next []*Slot
		for _, sl := range round {
			sl.Asked()
			clk.advance(time.Millisecond)
			sl.Answered() // 1 ms: fast
			next = append(next, takeN(t, s, 2, taken)...)
			taken += 2
		}
		held(t, s, StorePacing)
		if want := float64(int(firstWindow) << (r + 1)); s.pace.window != want {
			t.Fatalf("round %d: window %v, want %v", r+1, s.pace.window, want)
		}
		round = next
	}
}

// An answer later than store-dial-slow halves the window to half of what is in flight (never below
// minWindow), once per slow; growth above that is one a round.
func TestPacingHalvesWhenTheStoreSlows(t *testing.T) {
	s, clk := pacedSlots(DialRate{Paced: true, Slow: time.Second})
	slots := takeN(t, s, firstWindow, 0)
	for _, sl := range slots {
		sl.Asked()
	}
	clk.advance(1500 * time.Millisecond)
	slots[0].Answered() // 1.5 s
	if want := float64(firstWindow-1) / 2; s.pace.window != want {
		t.Fatalf("window %v after a slow answer with %d in flight, want %v", s.pace.window, firstWindow-1, want)
	}
	held(t, s, StorePacing) // 63 in flight, window 31.5
	slots[1].Answered()     // as slow, within the same second: no second halving
	if want := float64(firstWindow-1) / 2; s.pace.window != want {
		t.Fatalf("window %v after a second slow answer at once, want %v", s.pace.window, want)
	}
	clk.advance(time.Second)
	slots[2].Answered()
	if want := float64(firstWindow-1) / 4; s.pace.window != want {
		t.Fatalf("window %v a second later, want %v", s.pace.window, want)
	}
	for _, sl := range slots[3:] {
		clk.advance(time.Second)
		sl.Answered()
	}
	if s.pace.window != minWindow {
		t.Fatalf("window %v, want the floor %d", s.pace.window, minWindow)
	}
	// Above the threshold, an answer within slow grows it by 1/window.
	fresh := takeN(t, s, minWindow, 100)
	fresh[0].Asked()
	fresh[0].Answered()
	if want := float64(minWindow) + 1.0/minWindow; s.pace.window != want {
		t.Fatalf("window %v after a fast answer at the threshold, want %v", s.pace.window, want)
	}
}

// A stalled store answers nothing: the pacer's look halves the window while requests wait past
// slow. A dial that asked nothing (its first request was a WAIT) is out of flight after slow,
// without telling anything; one whose connection ended is out at once.
func TestPacingLooksAtDialsInFlight(t *testing.T) {
	s, clk := pacedSlots(DialRate{Paced: true, Slow: time.Second})
	slots := takeN(t, s, firstWindow, 0)
	for _, sl := range slots[:40] {
		sl.Asked()
	}
	slots[40].Release()
	if _, n := s.Pacing(); n != firstWindow-1 {
		t.Fatalf("%d in flight after a release, want %d", n, firstWindow-1)
	}
	clk.advance(1100 * time.Millisecond)
	s.paceTick()
	w, n := s.Pacing()
	if n != 40 || w != 20 {
		t.Fatalf("after a look past slow: window %v, %d in flight; want 20 (half the 40 that asked, in flight)", w, n)
	}
	for range 4 {
		clk.advance(time.Second)
		s.paceTick()
	}
	if w, _ := s.Pacing(); w != minWindow {
		t.Fatalf("window %v while the store stays stalled, want %d", w, minWindow)
	}
	held(t, s, StorePacing)
	for _, sl := range slots[:33] { // the store comes back
		sl.Answered()
	}
	if _, r := s.TryTake(gateAddr("10.9.9.8")); r != "" {
		t.Fatalf("TryTake with 7 in flight of a window of %v: %q", s.pace.window, r)
	}
}

// Pacing can be turned off and on by a reload: off forgets the dials in flight, on starts anew.
func TestPacingReload(t *testing.T) {
	s, _ := pacedSlots(DialRate{Paced: true})
	slots := takeN(t, s, firstWindow, 0)
	s.SetDialRate(DialRate{})
	if w, n := s.Pacing(); w != 0 || n != 0 {
		t.Fatalf("not paced: window %v, %d in flight", w, n)
	}
	takeN(t, s, 100, 100)
	slots[0].Answered() // a dial of the old pacer: nothing happens
	s.SetDialRate(DialRate{Paced: true})
	if w, n := s.Pacing(); w != firstWindow || n != 0 {
		t.Fatalf("paced again: window %v, %d in flight", w, n)
	}
}

// Clients the window holds back wait in the queue's order: a source serving a job first.
func TestPacingQueueOrder(t *testing.T) {
	s, _ := pacedSlots(DialRate{Paced: true})
	slots := takeN(t, s, firstWindow, 0)
	newRank := queued(t, s, "10.0.0.2", false)
	jobRank := queued(t, s, "10.0.0.3", true)
	slots[0].Release()
	served(t, jobRank, "the job's rank")
	slots[1].Release()
	served(t, newRank, "the new rank")
}
