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

// askedWindow is a pacer of slow whose first window is all in flight, every dial asked.
func askedWindow(t *testing.T, slow time.Duration) (*StoreSlots, *fakeClock, []*Slot) {
	t.Helper()
	s, clk := pacedSlots(DialRate{Paced: true, Slow: slow})
	slots := takeN(t, s, firstWindow, 0)
	for _, sl := range slots {
		sl.Asked()
	}
	return s, clk, slots
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

// A stalled store answers nothing: the pacer's look halves the window while a request has waited
// past slow and no answer came within slow, once per slow, never below minWindow; growth above the
// threshold is then one a round. A dial that asked nothing (its first request was a WAIT) is out of
// flight after slow, telling nothing; one whose connection ended is out at once.
func TestPacingHalvesWhenTheStoreStalls(t *testing.T) {
	s, clk := pacedSlots(DialRate{Paced: true, Slow: time.Second})
	slots := takeN(t, s, firstWindow, 0)
	for _, sl := range slots[:40] {
		sl.Asked()
	}
	slots[40].Release()
	if _, n, _ := s.Pacing(); n != firstWindow-1 {
		t.Fatalf("%d in flight after a release, want %d", n, firstWindow-1)
	}
	clk.advance(1100 * time.Millisecond)
	s.paceTick()
	w, n, _ := s.Pacing()
	if n != 40 || w != 20 {
		t.Fatalf("after a look past slow: window %v, %d in flight; want 20 (half the 40 that asked, in flight)", w, n)
	}
	s.paceTick()
	if w, _, _ := s.Pacing(); w != 20 {
		t.Fatalf("window %v after a second look at once, want 20 (once per slow)", w)
	}
	for range 3 {
		clk.advance(time.Second)
		s.paceTick()
	}
	if w, _, _ := s.Pacing(); w != minWindow {
		t.Fatalf("window %v while the store stays stalled, want %d", w, minWindow)
	}
	held(t, s, StorePacing)
	for _, sl := range slots[:33] { // the store comes back
		sl.Answered()
	}
	// At the threshold (8), each answer adds 1/window: 33 of them make about sqrt(8² + 2·33) = 11.4.
	if w, n, _ = s.Pacing(); n != 7 || w < 11 || w > 12 {
		t.Fatalf("after 33 answers at the threshold: window %v, %d in flight; want about 11.4 and 7", w, n)
	}
	clk.advance(1100 * time.Millisecond) // the other 7 still wait, and no answer came meanwhile
	s.paceTick()
	if w, _, _ := s.Pacing(); w != minWindow {
		t.Fatalf("window %v after another stalled second with 7 waiting, want %d", w, minWindow)
	}
}

// A store busy with a large job answers each new connection late (a legacy store polling 8,000
// connections) but keeps answering: that is progress, and the window grows, never halves.
func TestPacingKeepsAStoreThatAnswersLate(t *testing.T) {
	s, clk, slots := askedWindow(t, time.Second)
	clk.advance(2 * time.Second)
	for i, sl := range slots {
		sl.Answered() // each 2 s or more after it asked
		takeN(t, s, 1, 1000+i)[0].Asked()
		if i%4 == 0 {
			clk.advance(100 * time.Millisecond)
			s.paceTick()
		}
	}
	if w, _, _ := s.Pacing(); w != 2*firstWindow {
		t.Fatalf("window %v after %d late answers that kept coming, want %d", w, firstWindow, 2*firstWindow)
	}
}

// Pacing can be turned off and on by a reload: off forgets the dials in flight, on starts anew.
func TestPacingReload(t *testing.T) {
	s, _ := pacedSlots(DialRate{Paced: true})
	slots := takeN(t, s, firstWindow, 0)
	s.SetDialRate(DialRate{})
	if w, n, _ := s.Pacing(); w != 0 || n != 0 {
		t.Fatalf("not paced: window %v, %d in flight", w, n)
	}
	takeN(t, s, 100, 100)
	slots[0].Answered() // a dial of the old pacer: nothing happens
	s.SetDialRate(DialRate{Paced: true})
	if w, n, _ := s.Pacing(); w != firstWindow || n != 0 {
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

// A store that answers each connection at once but stalls past some rate (a resolver that drops
// what comes faster than it answers) is not protected by a window: a stall also caps the dial rate
// at half of what was granted in the second before it. Each second without a stall raises the cap
// by an eighth; past maxRate it is lifted.
func TestPacingCapsTheRateAfterAStall(t *testing.T) {
	s, clk := pacedSlots(DialRate{Paced: true, Slow: time.Second})
	for i := range 100 { // 100 a second, each answered at once
		sl := takeN(t, s, 1, i)[0]
		sl.Asked()
		sl.Answered()
		clk.advance(10 * time.Millisecond)
	}
	stuck := takeN(t, s, 1, 100)[0]
	stuck.Asked()
	clk.advance(1100 * time.Millisecond) // no answer for 1.1 s while one waits: a stall
	s.paceTick()
	_, _, rate := s.Pacing()
	if rate != 50 { // the most granted in a second lately, halved
		t.Fatalf("rate cap %v after a stall following 100 dials a second, want 50", rate)
	}
	held(t, s, StorePacing) // the stall spent the tokens
	clk.advance(time.Second / 20)
	granted := 0
	for i := range 100 { // a second more: about rate dials, where 100 came
		if sl, r := s.TryTake(gateAddr(fmt.Sprintf("10.2.0.%d", i+1))); r == "" {
			granted++
			sl.Asked()
			sl.Answered()
		}
		clk.advance(10 * time.Millisecond)
	}
	if float64(granted) < rate-2 || float64(granted) > rate+minWindow+1 {
		t.Fatalf("%d dials granted in the second after the stall, with a cap of %v a second", granted, rate)
	}
	stuck.Answered()
	for range 60 { // no stall: an eighth more each second, until lifted (50 × 1.125^44 > 8192)
		clk.advance(time.Second)
		s.paceTick()
	}
	if _, _, r := s.Pacing(); r != 0 {
		t.Fatalf("rate cap %v after 60 s without a stall, want it lifted", r)
	}
}

// Two seconds after the last stall the window grows by one an answer again (slow start): one a
// round would take minutes to give a busy store back what a stall took.
func TestPacingForgetsAStall(t *testing.T) {
	s, clk, slots := askedWindow(t, 250*time.Millisecond)
	clk.advance(300 * time.Millisecond)
	const half = firstWindow / 2
	s.paceTick() // a stall: window and threshold half the first
	slots[0].Answered()
	if w, _, _ := s.Pacing(); w != half+1.0/half {
		t.Fatalf("window %v after an answer at the threshold, want %v", w, half+1.0/half)
	}
	for _, sl := range slots[1:] {
		sl.Answered()
	}
	clk.advance(forgetStall)
	s.paceTick()
	w0, _, _ := s.Pacing()
	var again []*Slot // the window in use, taken as the rate cap the stall set allows: an answer grows it
	for i := range int(w0) {
		clk.advance(time.Millisecond)
		again = append(again, takeN(t, s, 1, 1000+i)...)
	}
	w0, _, _ = s.Pacing()
	again[0].Asked()
	again[0].Answered()
	if w, _, _ := s.Pacing(); w != w0+1 {
		t.Fatalf("window %v after an answer %v after the stall, want %v (one an answer)", w, forgetStall, w0+1)
	}
}

// A window the clients never fill says nothing of the store: answers grow it only while half of it
// is in use (a quiet job's thousands of one-at-a-time dials took the window to 31,000 before).
func TestPacingGrowsOnlyAWindowInUse(t *testing.T) {
	s, clk := pacedSlots(DialRate{Paced: true})
	for i := range 3000 { // one at a time, each answered at once
		sl := takeN(t, s, 1, i)[0]
		sl.Asked()
		clk.advance(time.Millisecond)
		sl.Answered()
	}
	if w, _, _ := s.Pacing(); w != firstWindow {
		t.Fatalf("window %v after 3,000 dials one at a time, want %d", w, firstWindow)
	}
	slots := takeN(t, s, firstWindow/2, 5000) // half of it in flight: each answer grows it
	for _, sl := range slots {
		sl.Asked()
	}
	slots[0].Answered()
	if w, _, _ := s.Pacing(); w != firstWindow+1 {
		t.Fatalf("window %v after an answer with half of it in flight, want %d", w, firstWindow+1)
	}
}

// The window never grows past the store's accept queue (SetBacklog): the dials past it would be
// dropped by the kernel and wait out SYN retransmissions. A backlog below the window cuts it; an
// unknown one (0) leaves it.
func TestPacingStaysWithinTheBacklog(t *testing.T) {
	s, clk := pacedSlots(DialRate{Paced: true})
	s.SetBacklog(600)
	round := takeN(t, s, firstWindow, 0)
	taken := firstWindow
	for range 3 { // fast rounds: slow start would double the window each
		var next []*Slot
		for _, sl := range round {
			sl.Asked()
			clk.advance(time.Millisecond)
			sl.Answered()
			for range 2 {
				if sl, r := s.TryTake(gateAddr(fmt.Sprintf("10.3.%d.%d", taken/250, taken%250+1))); r == "" {
					next = append(next, sl)
					taken++
				}
			}
		}
		round = next
	}
	if w, n, _ := s.Pacing(); w != 600 || n != 600 {
		t.Fatalf("window %v, %d in flight, behind a backlog of 600; want 600 and 600", w, n)
	}
	held(t, s, StorePacing)
	s.SetBacklog(100)
	if w, _, _ := s.Pacing(); w != 100 {
		t.Fatalf("window %v after the backlog fell to 100", w)
	}
	s.SetBacklog(0)
	s.SetDialRate(DialRate{})
	s.SetDialRate(DialRate{Paced: true}) // pacing anew starts at its first window
	if w, _, _ := s.Pacing(); w != firstWindow {
		t.Fatalf("window %v when paced anew with the backlog unknown, want %d", w, firstWindow)
	}
	s.SetBacklog(300)
	s.SetDialRate(DialRate{})
	s.SetDialRate(DialRate{Paced: true})
	if w, _, _ := s.Pacing(); w != 300 {
		t.Fatalf("window %v when paced anew behind a backlog of 300, want 300", w)
	}
}

// The store's accept queue is the first window: what the store takes at once from clients that
// dial it directly. A start within it waits for nothing (a legacy store's queue of 2,048 and a start
// of 2,000); a queue learned after pacing began sets the window while no stall has cut it, and
// after one only bounds it.
func TestPacingStartsAtTheStoresBacklog(t *testing.T) {
	s, _ := pacedSlots(DialRate{Paced: true})
	s.SetBacklog(2048)
	takeN(t, s, 2000, 0) // fails on the first one held back
	if w, n, _ := s.Pacing(); w != 2048 || n != 2000 {
		t.Fatalf("window %v, %d in flight, after 2,000 dials behind a backlog of 2,048; want 2048 and 2000", w, n)
	}

	s, _ = pacedSlots(DialRate{Paced: true}) // the store listened after the guard began
	if w, _, _ := s.Pacing(); w != firstWindow {
		t.Fatalf("window %v with the backlog unknown, want %d", w, firstWindow)
	}
	s.SetBacklog(2048)
	if w, _, _ := s.Pacing(); w != 2048 {
		t.Fatalf("window %v once a backlog of 2,048 is learned, want 2048", w)
	}

	s, clk := pacedSlots(DialRate{Paced: true, Slow: time.Second}) // a stall before the backlog is known
	for _, sl := range takeN(t, s, 100, 0) {
		sl.Asked()
	}
	clk.advance(1100 * time.Millisecond)
	s.paceTick()
	s.SetBacklog(2048)
	if w, _, _ := s.Pacing(); w != 50 {
		t.Fatalf("window %v after a stall, then a backlog of 2,048 learned; want 50 (the stall's)", w)
	}
}

// A store that stalls with the dials it has, when nothing was granted lately (a legacy store at
// the end of an 8,000-rank start, its last ranks' answers late), gets a smaller window but no rate
// cap: half of nothing would cap it at minRate, and the next start would wait for it. A stall
// after dials were granted still caps the rate, and a look that still sees them halves it again;
// once none was granted in the last three periods, the halvings leave the cap where it is.
func TestPacingLeavesTheRateOfAStoreThatStallsWithNothingGranted(t *testing.T) {
	s, clk, slots := askedWindow(t, 250*time.Millisecond)
	clk.advance(time.Second) // all granted a second ago; none answered since
	s.paceTick()
	if w, _, rate := s.Pacing(); w != firstWindow/2 || rate != 0 {
		t.Fatalf("after a stall with nothing granted lately: window %v, rate cap %v; want %d and none", w, rate, firstWindow/2)
	}
	for _, sl := range slots {
		sl.Release()
	}

	s, clk = pacedSlots(DialRate{Paced: true, Slow: 250 * time.Millisecond})
	slots = takeN(t, s, 200, 0) // 200 in the last period
	for _, sl := range slots {
		sl.Asked()
	}
	clk.advance(300 * time.Millisecond)
	s.paceTick()
	if _, _, rate := s.Pacing(); rate != 400 { // 200 in 250 ms, halved
		t.Fatalf("rate cap %v after a stall following 200 dials in 250 ms, want 400", rate)
	}
	for range 8 { // the stall goes on, nothing granted
		clk.advance(300 * time.Millisecond)
		s.paceTick()
	}
	if w, _, rate := s.Pacing(); w != minWindow || rate != 200 {
		t.Fatalf("after 2.4 s more of the stall: window %v, rate cap %v; want %d and 200 (the look at 600 ms still saw the 200)", w, rate, minWindow)
	}
}
