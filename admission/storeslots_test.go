package admission

import (
	"context"
	"fmt"
	"net/netip"
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
	a.Release()
	a.Release()
	if n := s.InUse(); n != 1 {
		t.Fatalf("InUse = %d after one of two released (twice), want 1", n)
	}
	if _, r := s.TryTake(gateAddr("10.0.0.2")); r != SourceStoreConnections {
		t.Fatalf("a second release of another source's slot freed 10.0.0.2's: %q", r)
	}
	b.Release()
	if n := s.InUse(); n != 0 || len(s.held.bySource) != 0 {
		t.Fatalf("InUse = %d, sources %v after all released", n, s.held.bySource)
	}
}

func TestStoreSlotsTakeWaits(t *testing.T) {
	s := NewStoreSlots(1, 0)
	held, _ := s.TryTake(gateAddr("10.0.0.1"))
	got := make(chan Reason)
	go func() {
		release, r := s.Take(context.Background(), gateAddr("10.0.0.2"), false)
		if release != nil {
			defer release.Release()
		}
		got <- r
	}()
	select {
	case r := <-got:
		t.Fatalf("Take returned %q while the only slot was held", r)
	case <-time.After(50 * time.Millisecond):
	}
	held.Release()
	if r := <-got; r != "" {
		t.Fatalf("Take after a release = %q, want a slot", r)
	}
}

func TestStoreSlotsTakeGivesUp(t *testing.T) {
	s := NewStoreSlots(0, 1)
	s.TryTake(gateAddr("10.0.0.1"))
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if release, r := s.Take(ctx, gateAddr("10.0.0.1"), false); release != nil || r != SourceStoreConnections {
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
		_, r := s.Take(context.Background(), gateAddr("10.0.0.2"), false)
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
				release, r := s.Take(context.Background(), src, false)
				if r != "" {
					t.Errorf("Take = %q", r)
					return
				}
				s.mu.Lock()
				n, used := int(s.held.bySource[src]), int(s.held.used)
				s.mu.Unlock()
				mu.Lock()
				maxUsed = max(maxUsed, used)
				mu.Unlock()
				if n > 3 {
					t.Errorf("source %s holds %d slots, cap 3", src, n)
				}
				release.Release()
			}
		}()
	}
	wg.Wait()
	if s.InUse() != 0 || maxUsed > 8 {
		t.Fatalf("InUse %d at the end (want 0), at most %d at once (cap 8)", s.InUse(), maxUsed)
	}
}

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// pacedSlots is a StoreSlots with no caps and the dial rate r, on a clock the test moves.
func pacedSlots(r DialRate) (*StoreSlots, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	s := NewStoreSlots(0, 0)
	s.now, s.lookByHand = clk.now, true
	s.SetDialRate(r)
	return s, clk
}

func TestStoreSlotsDialRate(t *testing.T) {
	tests := []struct {
		name  string
		rate  DialRate
		dials []string      // sources that dial first, all granted
		wait  time.Duration // then the clock moves
		src   string
		want  Reason
	}{
		{name: "no rate", dials: []string{"10.0.0.1", "10.0.0.1", "10.0.0.1"}, src: "10.0.0.1"},
		{name: "a source's burst", rate: DialRate{PerSourceRate: 10, PerSourceBurst: 2},
			dials: []string{"10.0.0.1", "10.0.0.1"}, src: "10.0.0.1", want: SourceStoreDialRate},
		{name: "another source's own burst", rate: DialRate{PerSourceRate: 10, PerSourceBurst: 2},
			dials: []string{"10.0.0.1", "10.0.0.1"}, src: "10.0.0.2"},
		{name: "a source's token comes due", rate: DialRate{PerSourceRate: 10, PerSourceBurst: 2},
			dials: []string{"10.0.0.1", "10.0.0.1"}, wait: 100 * time.Millisecond, src: "10.0.0.1"},
		{name: "not yet due", rate: DialRate{PerSourceRate: 10, PerSourceBurst: 2},
			dials: []string{"10.0.0.1", "10.0.0.1"}, wait: 90 * time.Millisecond, src: "10.0.0.1", want: SourceStoreDialRate},
		{name: "the store's burst, over sources", rate: DialRate{Rate: 5, Burst: 3, PerSourceRate: 10, PerSourceBurst: 2},
			dials: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}, src: "10.0.0.4", want: StoreDialRate},
		{name: "the store's token comes due", rate: DialRate{Rate: 5, Burst: 3},
			dials: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}, wait: 200 * time.Millisecond, src: "10.0.0.4"},
		{name: "a source's own rate named first", rate: DialRate{Rate: 5, Burst: 2, PerSourceRate: 10, PerSourceBurst: 2},
			dials: []string{"10.0.0.1", "10.0.0.1"}, src: "10.0.0.1", want: SourceStoreDialRate},
		{name: "a burst below 1 is 1", rate: DialRate{PerSourceRate: 10},
			dials: []string{"10.0.0.1"}, src: "10.0.0.1", want: SourceStoreDialRate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, clk := pacedSlots(tc.rate)
			for _, d := range tc.dials {
				if _, r := s.TryTake(gateAddr(d)); r != "" {
					t.Fatalf("setup: TryTake(%s) = %q", d, r)
				}
			}
			clk.advance(tc.wait)
			if release, r := s.TryTake(gateAddr(tc.src)); r != tc.want || (release == nil) != (tc.want != "") {
				t.Fatalf("TryTake(%s) = %q, want %q", tc.src, r, tc.want)
			}
		})
	}
}

// A slot given back is not a dial token: a source that closes its store connections at once still
// dials at its rate, which is what keeps a churn of one-message connections off the store.
func TestStoreSlotsChurnIsPaced(t *testing.T) {
	s, clk := pacedSlots(DialRate{PerSourceRate: 10, PerSourceBurst: 4})
	granted := 0
	for range 201 { // 201 connections in 2 s, each closed at once
		if release, r := s.TryTake(gateAddr("10.0.0.1")); r == "" {
			granted++
			release.Release()
		}
		clk.advance(10 * time.Millisecond)
	}
	if granted < 4+19 || granted > 4+20 { // the burst, then 10 a second
		t.Fatalf("%d store connections granted to 201 dials in 2 s, want 23 or 24", granted)
	}
}

// queued puts a waiter for src in the queue (held back: the test's clock stands still) and returns
// what it is granted.
func queued(t *testing.T, s *StoreSlots, src string, serving bool) <-chan Reason {
	t.Helper()
	got := make(chan Reason, 1)
	before := s.Waiting()
	go func() {
		release, r := s.Take(context.Background(), gateAddr(src), serving)
		if release != nil {
			release.Release()
		}
		got <- r
	}()
	for s.Waiting() == before {
		time.Sleep(time.Millisecond)
	}
	return got
}

// served is what the waiter got, failing the test if it is still waiting after a serve that should
// have granted it (the grant is made within serve; 10 s is only for its goroutine to report).
func served(t *testing.T, waiter <-chan Reason, who string) {
	t.Helper()
	select {
	case r := <-waiter:
		if r != "" {
			t.Fatalf("%s: %q", who, r)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s was not served", who)
	}
}

// nextToken lets 100 ms pass, a token of a 10-a-second rate, serves the queue and checks that
// waiter got its slot.
func nextToken(t *testing.T, s *StoreSlots, clk *fakeClock, waiter <-chan Reason, who string) {
	t.Helper()
	clk.advance(100 * time.Millisecond)
	s.serve()
	served(t, waiter, who)
}

// When the store's dial tokens are short, the next one goes to a source that serves a job (it holds
// a store connection), then to the source that has dialled least lately (a new host's rank), and
// last to a churning source, whatever the order they came in. A source that says it serves a job
// but holds no store connection (a churner's queued connections completed their messages) is a
// new host.
func TestStoreSlotsQueueOrder(t *testing.T) {
	s, clk := pacedSlots(DialRate{Rate: 10, Burst: 4, PerSourceRate: 10, PerSourceBurst: 4})
	if _, r := s.TryTake(gateAddr("10.0.0.3")); r != "" { // the job's rank at work
		t.Fatal(r)
	}
	for range 3 { // the churner spends its tokens and the store's
		if _, r := s.TryTake(gateAddr("10.0.0.1")); r != "" {
			t.Fatal(r)
		}
	}
	clk.advance(time.Second) // the job's host dialled a while ago; the churner's tokens came back
	for range 4 {
		if _, r := s.TryTake(gateAddr("10.0.0.1")); r != "" {
			t.Fatal(r)
		}
	}
	churner := queued(t, s, "10.0.0.1", false)
	newRank := queued(t, s, "10.0.0.2", true) // serving, it says, and holds nothing
	jobRank := queued(t, s, "10.0.0.3", true)
	for i, who := range []string{"the job's rank", "the new rank", "the churner"} {
		clk.advance(100 * time.Millisecond) // one token of the store's
		s.serve()
		served(t, []<-chan Reason{jobRank, newRank, churner}[i], who)
		if n := s.Waiting(); n != 2-i {
			t.Fatalf("%d waiting after %d tokens, want %d", n, i+1, 2-i)
		}
	}
}

// Sources that stopped dialling once a stall capped the rate, with queues of clients that came
// first, do not keep a new host's rank waiting: of sources that have not dialled lately, the one
// with the fewest waiting goes first. (First come, a new rank beside 15 such churners waited 10 to
// 14 s for its first op against a torch 2.15 store whose resolver stalled.)
func TestStoreSlotsANewRankGoesBeforeQueues(t *testing.T) {
	s, clk := pacedSlots(DialRate{Rate: 10, Burst: 1})
	s.TryTake(gateAddr("10.0.0.50")) // the store's one token
	var churn []<-chan Reason
	for i := range 3 {
		for range 3 {
			churn = append(churn, queued(t, s, fmt.Sprintf("10.0.1.%d", i+1), false))
		}
	}
	newRank := queued(t, s, "10.0.0.9", false)
	nextToken(t, s, clk, newRank, "the new rank")
	if n := s.Waiting(); n != len(churn) {
		t.Fatalf("%d waiting after one token, want the %d churners'", n, len(churn))
	}
	for range churn { // then the churners' queues, in turn
		clk.advance(100 * time.Millisecond)
		s.serve()
	}
	if n := s.Waiting(); n != 0 {
		t.Fatalf("%d still waiting", n)
	}
}

// A churner that holds one live store connection and queues more clients than a host's start
// brings (32) goes after a new host's rank, however long ago it last dialled.
func TestStoreSlotsAQueueLongerThanAHostsStartIsChurn(t *testing.T) {
	s, clk := pacedSlots(DialRate{Rate: 10, Burst: 1})
	s.TryTake(gateAddr("10.0.0.1")) // its live connection, and the store's one token
	clk.advance(2 * time.Second)
	s.TryTake(gateAddr("10.0.0.50"))
	var churn []<-chan Reason
	for range hostStart + 1 {
		churn = append(churn, queued(t, s, "10.0.0.1", true))
	}
	newRank := queued(t, s, "10.0.0.9", false)
	nextToken(t, s, clk, newRank, "the new rank")
	nextToken(t, s, clk, churn[0], "the churner's first")
}

// One live connection of a job does not put a churning source first: past half its dial burst it
// waits behind a new host's rank, as any churner does.
func TestStoreSlotsServingChurnerGoesLast(t *testing.T) {
	s, clk := pacedSlots(DialRate{Rate: 10, Burst: 4, PerSourceRate: 10, PerSourceBurst: 4})
	for range 4 {
		s.TryTake(gateAddr("10.0.0.1"))
	}
	churner := queued(t, s, "10.0.0.1", true)
	newRank := queued(t, s, "10.0.0.2", false)
	nextToken(t, s, clk, newRank, "the new rank")
	nextToken(t, s, clk, churner, "the churner")
}

// Churning sources take turns: the next token goes to the one that dialled longest ago, whichever
// queued first.
func TestStoreSlotsChurnersTakeTurns(t *testing.T) {
	s, clk := pacedSlots(DialRate{Rate: 10, Burst: 2})
	s.TryTake(gateAddr("10.0.0.1"))
	clk.advance(50 * time.Millisecond)
	s.TryTake(gateAddr("10.0.0.2"))
	second := queued(t, s, "10.0.0.2", true)
	first := queued(t, s, "10.0.0.1", false)
	nextToken(t, s, clk, first, "the source that dialled longer ago")
	nextToken(t, s, clk, second, "the other")
}

// A client asking now does not take a token a waiter was due.
func TestStoreSlotsTryTakeDoesNotOvertake(t *testing.T) {
	s, clk := pacedSlots(DialRate{Rate: 10, Burst: 1})
	s.TryTake(gateAddr("10.0.0.1"))
	waiter := queued(t, s, "10.0.0.2", false)
	clk.advance(100 * time.Millisecond)
	if _, r := s.TryTake(gateAddr("10.0.0.3")); r != StoreDialRate {
		t.Fatalf("TryTake took the token the waiter was due: %q", r)
	}
	served(t, waiter, "the waiter")
}

// Take is woken when its token comes due (a timer, on the real clock: the bound is generous).
func TestStoreSlotsTakeWaitsForADialToken(t *testing.T) {
	s := NewStoreSlots(0, 0)
	s.SetDialRate(DialRate{PerSourceRate: 20, PerSourceBurst: 1})
	s.TryTake(gateAddr("10.0.0.1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if release, r := s.Take(ctx, gateAddr("10.0.0.1"), false); r != "" || release == nil {
		t.Fatalf("Take = %q: never woken for the token due in 50 ms", r)
	}
}

func TestStoreSlotsTakeGivesUpOnTheRate(t *testing.T) {
	s, _ := pacedSlots(DialRate{Rate: 1, Burst: 1})
	s.TryTake(gateAddr("10.0.0.1"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if release, r := s.Take(ctx, gateAddr("10.0.0.2"), true); release != nil || r != StoreDialRate {
		t.Fatalf("Take with the rate spent and ctx ended = %q, want %q", r, StoreDialRate)
	}
	if n := s.Waiting(); n != 0 {
		t.Fatalf("%d still waiting after Take gave up", n)
	}
}

// A store connection handed over by another process is open already: it spends no dial token.
func TestStoreSlotsAdoptSpendsNoToken(t *testing.T) {
	s, _ := pacedSlots(DialRate{Rate: 10, Burst: 1, PerSourceRate: 10, PerSourceBurst: 1})
	s.Adopt(gateAddr("10.0.0.1"))
	if _, r := s.TryTake(gateAddr("10.0.0.1")); r != "" {
		t.Fatalf("TryTake after Adopt = %q", r)
	}
}

// Sources that have not dialled within recentDial and whose dial tokens are full again are
// forgotten: a spray of source addresses cannot grow the table without limit.
func TestStoreSlotsForgetsRestedSources(t *testing.T) {
	s, clk := pacedSlots(DialRate{PerSourceRate: 10, PerSourceBurst: 2})
	for i := range 1000 { // 1000 sources in 10 s
		s.TryTake(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}))
		clk.advance(10 * time.Millisecond)
	}
	s.mu.Lock()
	n := len(s.sources)
	s.mu.Unlock()
	if n > 256 { // the 100 of the last second, and a sweep's slack
		t.Fatalf("%d sources remembered after 1000 in 10 s", n)
	}
}

// BenchmarkStartQueue: a job's start of 8,000 ranks from 1,000 hosts queued behind the pacing
// window, each answered as it is granted (each answer serves the queue). The queue's cost per
// answer was every waiter's (a start cost 26 to 30 s of the guard's CPU against a torch 1.13 store);
// it is now each waiting source's, and none while the window is full.
func BenchmarkStartQueue(b *testing.B) {
	const ranks, perHost = 8000, 8
	for b.Loop() {
		s, _ := pacedSlots(DialRate{Paced: true, PerSourceRate: 10, PerSourceBurst: 32})
		granted := make(chan *Slot, ranks)
		for i := range ranks {
			h := i / perHost
			src := netip.AddrFrom4([4]byte{127, 10, byte(h / 250), byte(h%250 + 1)})
			go func() {
				sl, _ := s.Take(context.Background(), src, false)
				granted <- sl
			}()
		}
		for range ranks {
			sl := <-granted
			sl.Asked()
			sl.Answered()
		}
	}
}
