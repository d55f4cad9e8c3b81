package verdict

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rule    protocol.Rule
		monitor bool
		want    Outcome
		bans    bool
	}{
		{"enforce", protocol.RuleMessageTooLarge, false, Outcome{audit.ActionBlocked, audit.VerdictBlocked}, true},
		{"monitor", protocol.RuleMessageTooLarge, true, Outcome{audit.ActionWouldBlock, audit.VerdictWouldBlock}, false},
		// cut short: blocked in either mode (nothing of it was forwarded), never a step towards a ban
		{"truncated, enforce", protocol.RuleTruncatedMessage, false, Outcome{audit.ActionBlocked, audit.VerdictTruncated}, false},
		{"truncated, monitor", protocol.RuleTruncatedMessage, true, Outcome{audit.ActionBlocked, audit.VerdictTruncated}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Of(&protocol.Violation{Rule: tc.rule}, tc.monitor)
			if o != tc.want || o.Bans() != tc.bans || o.Closes() != tc.bans {
				t.Errorf("Of = %+v, bans %v, closes %v; want %+v, bans %v", o, o.Bans(), o.Closes(), tc.want, tc.bans)
			}
		})
	}
}

func TestDefault(t *testing.T) {
	if v := Default(0); v != audit.VerdictEmpty {
		t.Errorf("nothing sent: %s", v)
	}
	if v := Default(1); v != audit.VerdictPassed {
		t.Errorf("one byte sent: %s", v)
	}
}

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

func TestFlowsFilter(t *testing.T) {
	src := netip.MustParseAddrPort("10.0.0.1:5000")
	for _, tc := range []struct {
		flows   config.Flows
		verdict audit.Verdict
		written bool
	}{
		{config.FlowsAll, audit.VerdictPassed, true},
		{config.FlowsAll, audit.VerdictOpen, true},
		{config.FlowsSuspicious, audit.VerdictPassed, false},
		{config.FlowsSuspicious, audit.VerdictOpen, false},
		{config.FlowsSuspicious, audit.VerdictEmpty, true},
		{config.FlowsSuspicious, audit.VerdictRefused, true},
		{config.FlowsOff, audit.VerdictBlocked, false},
	} {
		var got []audit.Event
		fl := NewFlows(func(e audit.Event) { got = append(got, e) }, 0)
		cfg := config.Config{Flows: tc.flows}
		fl.Write(&audit.Flow{Src: src, Verdict: tc.verdict}, &cfg, NewSources(nil, nil))
		if written := len(got) == 1; written != tc.written {
			t.Errorf("flows %s, verdict %s: written %v", tc.flows, tc.verdict, written)
		}
	}
}

// The detector counts ended flows only, not a job's empty ones, and starts anew when scan.*
// changes.
func TestFlowsScan(t *testing.T) {
	src := netip.MustParseAddrPort("10.0.0.1:5000")
	fl := NewFlows(func(audit.Event) {}, 0)
	sources := NewSources(nil, nil)
	cfg := config.Config{Flows: config.FlowsOff, Scan: config.Scan{Threshold: 3, Window: time.Minute}}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	write := func(v audit.Verdict) bool {
		at = at.Add(time.Second)
		_, ok := fl.Write(&audit.Flow{Src: src, Start: at, End: at, Verdict: v}, &cfg, sources)
		return ok
	}
	for range 5 {
		if write(audit.VerdictOpen) {
			t.Fatal("an open flow counted")
		}
	}
	sources.Talk(src.Addr())
	for range 5 {
		if write(audit.VerdictEmpty) {
			t.Fatal("a job's empty flows made a scan")
		}
	}
	sources.Untalk(src.Addr())
	cfg.Scan.Threshold = 2 // a new detector: what the old one knew of the job goes with it
	if write(audit.VerdictEmpty) || !write(audit.VerdictEmpty) {
		t.Error("no notice at the new threshold")
	}
}

func TestPeeks(t *testing.T) {
	var p Peeks
	for i := range admission.MaxPeeks {
		if !p.Take() {
			t.Fatalf("take %d refused", i)
		}
	}
	if p.Take() {
		t.Fatal("took one past admission.MaxPeeks")
	}
	p.Done()
	if !p.Take() {
		t.Fatal("a peek given back was not taken again")
	}
	for _, tc := range []struct {
		reason admission.Reason
		peek   time.Duration
		want   bool
	}{
		{admission.Banned, time.Second, true},
		{admission.BanThrottled, time.Second, true},
		{admission.Banned, 0, false},
		{admission.MaxConnections, time.Second, false},
	} {
		if got := Peeked(tc.reason, tc.peek); got != tc.want {
			t.Errorf("Peeked(%s, %v) = %v", tc.reason, tc.peek, got)
		}
	}
}

func TestPeek(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := NewPeek(start, time.Second)
	if p.Until() != start.Add(time.Second) || len(p.Bytes()) != 0 {
		t.Fatalf("until %v, %d bytes", p.Until(), len(p.Bytes()))
	}
	// The first bytes: admission.PeekRest more at most.
	if p.Read([]byte("ab"), start.Add(10*time.Millisecond)) || p.Until() != start.Add(10*time.Millisecond+admission.PeekRest) {
		t.Fatalf("after the first bytes: until %v", p.Until())
	}
	// Later bytes move nothing.
	if p.Took(0, start.Add(20*time.Millisecond)) || p.Read([]byte("c"), start.Add(50*time.Millisecond)) ||
		p.Until() != start.Add(10*time.Millisecond+admission.PeekRest) {
		t.Fatalf("later bytes moved the end to %v", p.Until())
	}
	if !p.Read(make([]byte, 100), start.Add(60*time.Millisecond)) || len(p.Bytes()) != admission.PeekBytes ||
		string(p.Bytes()[:3]) != "abc" || len(p.Room()) != 0 {
		t.Fatalf("full: %d bytes %q", len(p.Bytes()), p.Bytes())
	}
	// First bytes after PeekRest would have ended leave ban.peek's end.
	late := NewPeek(start, 50*time.Millisecond)
	if late.Took(1, start.Add(40*time.Millisecond)) || late.Until() != start.Add(50*time.Millisecond) {
		t.Errorf("late first bytes: until %v", late.Until())
	}
	var none *Peek
	if none.Bytes() != nil {
		t.Error("a connection not read has bytes")
	}
}
