package admission

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// gateClock is a settable clock for the gate.
type gateClock struct {
	mu sync.Mutex
	t  time.Time
}

func newGateClock() *gateClock {
	return &gateClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *gateClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *gateClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func gateAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func gatePrefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// gateMustAdmit admits src or fails the test.
func gateMustAdmit(t *testing.T, g *Gate, src string) func() {
	t.Helper()
	release, reason := g.Admit(gateAddr(src), false)
	if reason != "" || release == nil {
		t.Fatalf("Admit(%s) = %q, want admitted", src, reason)
	}
	return release
}

func TestGateRefuseReasons(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		setup []string // sources admitted (and held) first
		bans  []string // sources banned first
		src   string
		want  Reason
	}{
		{name: "admitted", cfg: Config{}, src: "10.0.0.1", want: ""},
		{name: "denied", cfg: Config{Deny: gatePrefixes("10.0.0.0/8")}, src: "10.1.2.3", want: Denied},
		{name: "deny wins over allow", cfg: Config{Allow: gatePrefixes("10.0.0.0/8"), Deny: gatePrefixes("10.1.0.0/16")}, src: "10.1.2.3", want: Denied},
		{name: "not allowed", cfg: Config{Allow: gatePrefixes("10.0.0.0/8")}, src: "192.168.0.1", want: NotAllowed},
		{name: "allowed", cfg: Config{Allow: gatePrefixes("10.0.0.0/8", "192.168.0.0/16")}, src: "192.168.0.1", want: ""},
		{name: "ipv6 allowed", cfg: Config{Allow: gatePrefixes("fd00::/8")}, src: "fd00::1", want: ""},
		{name: "banned", cfg: Config{BanViolations: 1, BanWindow: time.Minute, BanDuration: time.Minute}, bans: []string{"10.0.0.1"}, src: "10.0.0.1", want: Banned},
		{name: "ban is per source", cfg: Config{BanViolations: 1, BanWindow: time.Minute, BanDuration: time.Minute}, bans: []string{"10.0.0.2"}, src: "10.0.0.1", want: ""},
		{name: "ban before global cap", cfg: Config{MaxConnections: 1, BanViolations: 1, BanWindow: time.Minute, BanDuration: time.Minute}, setup: []string{"10.0.0.2"}, bans: []string{"10.0.0.1"}, src: "10.0.0.1", want: Banned},
		{name: "max connections", cfg: Config{MaxConnections: 2}, setup: []string{"10.0.0.2", "10.0.0.3"}, src: "10.0.0.1", want: MaxConnections},
		{name: "global cap before per source", cfg: Config{MaxConnections: 1, PerSourceConnections: 1}, setup: []string{"10.0.0.1"}, src: "10.0.0.1", want: MaxConnections},
		{name: "source connections", cfg: Config{PerSourceConnections: 2}, setup: []string{"10.0.0.1", "10.0.0.1", "10.0.0.2"}, src: "10.0.0.1", want: SourceConnections},
		{name: "source connections other source", cfg: Config{PerSourceConnections: 2}, setup: []string{"10.0.0.1", "10.0.0.1"}, src: "10.0.0.2", want: ""},
		{name: "source rate", cfg: Config{PerSourceRate: 1, PerSourceBurst: 2}, setup: []string{"10.0.0.1", "10.0.0.1"}, src: "10.0.0.1", want: SourceRate},
		{name: "source rate burst 0 is 1", cfg: Config{PerSourceRate: 1}, setup: []string{"10.0.0.1"}, src: "10.0.0.1", want: SourceRate},
		{name: "per source cap before rate", cfg: Config{PerSourceConnections: 1, PerSourceRate: 1, PerSourceBurst: 1}, setup: []string{"10.0.0.1"}, src: "10.0.0.1", want: SourceConnections},
		{name: "mapped ipv6 denied", cfg: Config{Deny: gatePrefixes("10.0.0.0/8")}, src: "::ffff:10.0.0.1", want: Denied},
		{name: "mapped ipv6 allowed", cfg: Config{Allow: gatePrefixes("10.0.0.0/8")}, src: "::ffff:10.0.0.1", want: ""},
		{name: "mapped prefix in config", cfg: Config{Deny: gatePrefixes("::ffff:10.0.0.0/104")}, src: "10.0.0.1", want: Denied},
		{name: "mapped source shares per source state", cfg: Config{PerSourceConnections: 1}, setup: []string{"10.0.0.1"}, src: "::ffff:10.0.0.1", want: SourceConnections},
		{name: "prefix connections", cfg: Config{PerPrefixConnections: 2, IPv4Prefix: 24}, setup: []string{"10.0.0.2", "10.0.0.3"}, src: "10.0.0.1", want: PrefixConnections},
		{name: "prefix connections other network", cfg: Config{PerPrefixConnections: 2, IPv4Prefix: 24}, setup: []string{"10.0.0.2", "10.0.0.3"}, src: "10.0.1.1", want: ""},
		{name: "ipv6 prefix connections", cfg: Config{PerPrefixConnections: 2, IPv6Prefix: 64}, setup: []string{"2001:db8::1", "2001:db8::2"}, src: "2001:db8::ffff:1", want: PrefixConnections},
		{name: "ipv6 other /64", cfg: Config{PerPrefixConnections: 2, IPv6Prefix: 64}, setup: []string{"2001:db8::1", "2001:db8::2"}, src: "2001:db8:0:1::1", want: ""},
		{name: "no prefix bits is the address", cfg: Config{PerPrefixConnections: 1}, setup: []string{"10.0.0.2"}, src: "10.0.0.1", want: ""},
		{name: "link-local is its own network", cfg: Config{PerPrefixConnections: 1, IPv6Prefix: 64}, setup: []string{"fe80::1"}, src: "fe80::2", want: ""},
		{name: "global cap before prefix", cfg: Config{MaxConnections: 1, PerPrefixConnections: 1, IPv4Prefix: 24}, setup: []string{"10.0.0.2"}, src: "10.0.0.1", want: MaxConnections},
		{name: "prefix before per source", cfg: Config{PerPrefixConnections: 1, IPv4Prefix: 24, PerSourceConnections: 1}, setup: []string{"10.0.0.1"}, src: "10.0.0.1", want: PrefixConnections},
		{name: "banned, not serving", cfg: Config{BanViolations: 1, BanWindow: time.Minute, BanDuration: time.Minute, ServingRate: 1, ServingBurst: 4}, bans: []string{"10.0.0.1"}, src: "10.0.0.1", want: Banned},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := New(tt.cfg, newGateClock().Now)
			for _, s := range tt.setup {
				gateMustAdmit(t, g, s)
			}
			for _, s := range tt.bans {
				if !g.Violation(gateAddr(s)).IsValid() {
					t.Fatalf("Violation(%s) did not ban", s)
				}
			}
			release, got := g.Admit(gateAddr(tt.src), false)
			if got != tt.want {
				t.Fatalf("Admit(%s) = %q, want %q", tt.src, got, tt.want)
			}
			if (release != nil) != (got == "") {
				t.Fatalf("release nil = %v for reason %q", release == nil, got)
			}
			wantActive := len(tt.setup)
			if got == "" {
				wantActive++
			}
			if a := g.Stats().Active; a != wantActive {
				t.Fatalf("Active = %d, want %d", a, wantActive)
			}
		})
	}
}

func TestGateReleaseFreesSlot(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want Reason // reason while the slot is held
	}{
		{name: "global", cfg: Config{MaxConnections: 1}, want: MaxConnections},
		{name: "per source", cfg: Config{PerSourceConnections: 1}, want: SourceConnections},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := New(tt.cfg, newGateClock().Now)
			release := gateMustAdmit(t, g, "10.0.0.1")
			if _, r := g.Admit(gateAddr("10.0.0.1"), false); r != tt.want {
				t.Fatalf("second Admit = %q, want %q", r, tt.want)
			}
			release()
			release() // must not free a second slot
			if a := g.Stats().Active; a != 0 {
				t.Fatalf("Active after release = %d, want 0", a)
			}
			release2 := gateMustAdmit(t, g, "10.0.0.1")
			if _, r := g.Admit(gateAddr("10.0.0.1"), false); r != tt.want {
				t.Fatalf("Admit after double release = %q, want %q (double free)", r, tt.want)
			}
			release2()
			if a := g.Stats().Active; a != 0 {
				t.Fatalf("Active = %d, want 0", a)
			}
		})
	}
}

func TestGateRateRefill(t *testing.T) {
	clk := newGateClock()
	g := New(Config{PerSourceRate: 2, PerSourceBurst: 3}, clk.Now)
	src := "10.0.0.1"
	steps := []struct {
		advance time.Duration
		want    []Reason // successive admissions at this time
	}{
		{0, []Reason{"", "", "", SourceRate}},          // burst of 3
		{250 * time.Millisecond, []Reason{SourceRate}}, // half a token
		{250 * time.Millisecond, []Reason{"", SourceRate}},
		{time.Second, []Reason{"", "", SourceRate}},
		{time.Hour, []Reason{"", "", "", SourceRate}}, // capped at burst
	}
	for i, st := range steps {
		clk.Advance(st.advance)
		for j, want := range st.want {
			release, got := g.Admit(gateAddr(src), false)
			if got != want {
				t.Fatalf("step %d admit %d: got %q, want %q", i, j, got, want)
			}
			if release != nil {
				release() // the rate limits new connections, not live ones
			}
		}
	}
	// Another source has its own bucket.
	gateMustAdmit(t, g, "10.0.0.2")
}

func TestGateBan(t *testing.T) {
	const window, duration = time.Minute, 10 * time.Minute
	cfg := Config{BanViolations: 3, BanWindow: window, BanDuration: duration}
	tests := []struct {
		name    string
		gaps    []time.Duration // clock advance before each violation
		wantBan int             // index of the violation that starts the ban; -1 = none
	}{
		{name: "K at once", gaps: []time.Duration{0, 0, 0}, wantBan: 2},
		{name: "K within window", gaps: []time.Duration{0, 20 * time.Second, 39 * time.Second}, wantBan: 2},
		{name: "K spread beyond window", gaps: []time.Duration{0, 30 * time.Second, 30 * time.Second}, wantBan: -1},
		{name: "window slides", gaps: []time.Duration{0, 40 * time.Second, 40 * time.Second, 10 * time.Second}, wantBan: 3},
		{name: "steady below rate", gaps: []time.Duration{0, 31 * time.Second, 31 * time.Second, 31 * time.Second, 31 * time.Second}, wantBan: -1},
		{name: "fewer than K", gaps: []time.Duration{0, 0}, wantBan: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newGateClock()
			g := New(cfg, clk.Now)
			src := gateAddr("10.0.0.1")
			got := -1
			for i, gap := range tt.gaps {
				clk.Advance(gap)
				if g.Violation(src).IsValid() {
					if got != -1 {
						t.Fatalf("violation %d started a second ban", i)
					}
					got = i
				}
			}
			if got != tt.wantBan {
				t.Fatalf("ban started at violation %d, want %d", got, tt.wantBan)
			}
			_, reason := g.Admit(src, false)
			if banned := got != -1; banned != (reason == Banned) {
				t.Fatalf("Admit = %q with banned = %v", reason, banned)
			}
		})
	}
}

func TestGateBanExpiry(t *testing.T) {
	clk := newGateClock()
	g := New(Config{BanViolations: 2, BanWindow: time.Minute, BanDuration: 10 * time.Minute}, clk.Now)
	src := gateAddr("::ffff:10.0.0.1") // banned through its mapped form
	g.Violation(src)
	if !g.Violation(gateAddr("10.0.0.1")).IsValid() {
		t.Fatal("second violation did not ban")
	}
	if s := g.Stats(); s.ActiveBans != 1 {
		t.Fatalf("ActiveBans = %d, want 1", s.ActiveBans)
	}
	if g.Violation(src).IsValid() || g.Violation(src).IsValid() {
		t.Fatal("violations while banned started another ban")
	}
	clk.Advance(10*time.Minute - time.Nanosecond)
	if _, r := g.Admit(src, false); r != Banned {
		t.Fatalf("Admit just before expiry = %q, want banned", r)
	}
	clk.Advance(time.Nanosecond)
	if s := g.Stats(); s.ActiveBans != 0 {
		t.Fatalf("ActiveBans after expiry = %d, want 0", s.ActiveBans)
	}
	release := gateMustAdmit(t, g, "10.0.0.1")
	release()
	// The count starts afresh after a ban: one violation is not enough.
	if g.Violation(src).IsValid() {
		t.Fatal("first violation after the ban banned again")
	}
	if !g.Violation(src).IsValid() {
		t.Fatal("K violations after the ban did not ban")
	}
}

func TestGateBanResetsCount(t *testing.T) {
	// A ban shorter than the window: the violations that led to it must not
	// count again once it ends.
	clk := newGateClock()
	g := New(Config{BanViolations: 2, BanWindow: 10 * time.Minute, BanDuration: time.Minute}, clk.Now)
	src := gateAddr("10.0.0.1")
	g.Violation(src)
	if !g.Violation(src).IsValid() {
		t.Fatal("K violations did not ban")
	}
	clk.Advance(time.Minute)
	if g.Violation(src).IsValid() {
		t.Fatal("first violation after the ban banned again")
	}
}

func TestGateBansOff(t *testing.T) {
	g := New(Config{}, newGateClock().Now)
	for range 100 {
		if g.Violation(gateAddr("10.0.0.1")).IsValid() {
			t.Fatal("ban with BanViolations 0")
		}
	}
	if s := g.Stats(); s.Sources != 0 || s.ActiveBans != 0 {
		t.Fatalf("Stats = %+v, want no state with bans off", s)
	}
}

func TestGateBanExempt(t *testing.T) {
	cfg := Config{BanViolations: 1, BanWindow: time.Minute, BanDuration: time.Minute,
		BanExempt: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::ffff:10.9.0.0/112")}}
	g := New(cfg, newGateClock().Now)
	for _, a := range []string{"127.0.0.1", "127.3.2.1", "10.9.1.2", "::ffff:10.9.1.2"} {
		for range 10 {
			if g.Violation(gateAddr(a)).IsValid() {
				t.Fatalf("%s banned though exempt", a)
			}
		}
		if _, reason := g.Admit(gateAddr(a), false); reason != "" {
			t.Fatalf("%s refused: %s", a, reason)
		}
	}
	if !g.Violation(gateAddr("10.10.0.1")).IsValid() {
		t.Fatal("a source outside the exempt prefixes was not banned")
	}
}

func TestGateUpdate(t *testing.T) {
	g := New(Config{Allow: gatePrefixes("10.0.0.0/8"), MaxConnections: 2}, newGateClock().Now)
	live1 := gateMustAdmit(t, g, "10.0.0.1")
	live2 := gateMustAdmit(t, g, "10.0.0.2")

	g.Update(Config{Allow: gatePrefixes("192.168.0.0/16"), Deny: gatePrefixes("192.168.9.0/24"), MaxConnections: 3})
	steps := []struct {
		src  string
		want Reason
	}{
		{"10.0.0.3", NotAllowed},
		{"192.168.9.1", Denied},
		{"192.168.1.1", ""}, // the new cap of 3 counts the live connections
		{"192.168.1.2", MaxConnections},
	}
	for _, s := range steps {
		if _, r := g.Admit(gateAddr(s.src), false); r != s.want {
			t.Fatalf("Admit(%s) after Update = %q, want %q", s.src, r, s.want)
		}
	}
	// Live connections admitted under the old policy are kept and released normally.
	live1()
	live2()
	if a := g.Stats().Active; a != 1 {
		t.Fatalf("Active = %d, want 1", a)
	}

	// Per-source limits switched on by Update do not underflow on release of
	// connections admitted before it.
	g2 := New(Config{}, newGateClock().Now)
	old := gateMustAdmit(t, g2, "10.0.0.1")
	g2.Update(Config{PerSourceConnections: 1})
	cur := gateMustAdmit(t, g2, "10.0.0.1")
	old()
	if _, r := g2.Admit(gateAddr("10.0.0.1"), false); r != SourceConnections {
		t.Fatalf("Admit = %q, want %q: the pre-Update release freed a per-source slot", r, SourceConnections)
	}
	cur()
	gateMustAdmit(t, g2, "10.0.0.1")
}

func TestGateSourceTable(t *testing.T) {
	clk := newGateClock()
	g := New(Config{PerSourceConnections: 10, PerSourceRate: 1, PerSourceBurst: 1}, clk.Now)
	g.maxSources = 3
	live := gateMustAdmit(t, g, "10.0.0.1")
	gateMustAdmit(t, g, "10.0.0.2")() // released, but its bucket is empty
	gateMustAdmit(t, g, "10.0.0.3")()

	if _, r := g.Admit(gateAddr("10.0.0.4"), false); r != SourceTable {
		t.Fatalf("Admit with a full table = %q, want %q", r, SourceTable)
	}
	// Known sources are still admitted when the table is full.
	clk.Advance(time.Second)
	gateMustAdmit(t, g, "10.0.0.1")

	// Once buckets refill, the sweep triggered by a full table makes room;
	// the source with live connections is kept.
	gateMustAdmit(t, g, "10.0.0.4")
	if s := g.Stats(); s.Sources != 2 {
		t.Fatalf("Sources = %d, want 2 (10.0.0.1 live, 10.0.0.4 new)", s.Sources)
	}
	if _, r := g.Admit(gateAddr("10.0.0.1"), false); r != SourceRate {
		t.Fatalf("swept-but-live source lost its bucket: Admit = %q", r)
	}
	live()

	// A violation from a new source is dropped, not stored, when the table is full.
	g2 := New(Config{PerSourceConnections: 1, BanViolations: 1, BanWindow: time.Minute, BanDuration: time.Minute}, clk.Now)
	g2.maxSources = 1
	gateMustAdmit(t, g2, "10.0.0.1")
	if g2.Violation(gateAddr("10.0.0.2")).IsValid() {
		t.Fatal("violation stored in a full table")
	}
	if s := g2.Stats(); s.Sources != 1 {
		t.Fatalf("Sources = %d, want 1", s.Sources)
	}
}

func TestGateSweep(t *testing.T) {
	clk := newGateClock()
	g := New(Config{
		PerSourceConnections: 10, PerSourceRate: 1, PerSourceBurst: 2,
		BanViolations: 2, BanWindow: time.Minute, BanDuration: 10 * time.Minute,
	}, clk.Now)
	live := gateMustAdmit(t, g, "10.0.0.1") // live connection
	gateMustAdmit(t, g, "10.0.0.2")()       // bucket not full for a second
	g.Violation(gateAddr("10.0.0.3"))       // violation in the window
	g.Violation(gateAddr("10.0.0.4"))       // banned
	g.Violation(gateAddr("10.0.0.4"))

	steps := []struct {
		advance time.Duration
		want    Stats
	}{
		{0, Stats{Active: 1, Sources: 4, ActiveBans: 1}},
		{time.Second, Stats{Active: 1, Sources: 3, ActiveBans: 1}},      // .2 refilled
		{time.Minute, Stats{Active: 1, Sources: 2, ActiveBans: 1}},      // .3's violation left the window
		{10 * time.Minute, Stats{Active: 1, Sources: 1, ActiveBans: 0}}, // .4's ban expired
	}
	for i, s := range steps {
		clk.Advance(s.advance)
		g.Sweep()
		if got := g.Stats(); got != s.want {
			t.Fatalf("step %d: Stats = %+v, want %+v", i, got, s.want)
		}
	}
	live()
	g.Sweep()
	if got := g.Stats(); got != (Stats{}) {
		t.Fatalf("Stats after last release = %+v, want zero", got)
	}
}

func TestGateConcurrent(t *testing.T) {
	const workers, iters, maxConns = 64, 500, 40
	g := New(Config{MaxConnections: maxConns, PerSourceConnections: 3}, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	held := 0 // admitted and not yet released, counted by the test
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := netip.AddrFrom4([4]byte{10, 0, byte(w / 8), 1}) // 8 workers a source
			if w%2 == 1 {
				src = netip.AddrFrom16(src.As16()) // mapped form of the same source
			}
			for i := range iters {
				release, reason := g.Admit(src, false)
				if reason != "" {
					continue
				}
				mu.Lock()
				held++
				if held > maxConns {
					t.Errorf("%d connections held, cap %d", held, maxConns)
				}
				mu.Unlock()
				if i%7 == 0 {
					g.Violation(src) // bans are off: must not disturb the counts
					g.Sweep()
				}
				mu.Lock()
				held--
				mu.Unlock()
				release()
				if i%3 == 0 {
					release()
				}
			}
		}()
	}
	wg.Wait()
	if s := g.Stats(); s.Active != 0 {
		t.Fatalf("Active = %d after all releases, want 0", s.Active)
	}
	for src, st := range g.sources {
		if st.conns != 0 {
			t.Fatalf("source %v has %d conns after all releases", src, st.conns)
		}
	}
	g.Sweep()
	if s := g.Stats(); s.Sources != 0 {
		t.Fatalf("Sources = %d after Sweep, want 0", s.Sources)
	}
}

func BenchmarkGateAdmit(b *testing.B) {
	cfg := Config{
		Allow:                gatePrefixes("10.0.0.0/8", "192.168.0.0/16", "fd00::/8"),
		Deny:                 gatePrefixes("10.255.0.0/16"),
		MaxConnections:       20000,
		PerSourceConnections: 1024,
		PerSourceRate:        1e9, // never the limit here: measure the bookkeeping
		PerSourceBurst:       1 << 20,
		BanViolations:        5, BanWindow: time.Minute, BanDuration: 10 * time.Minute,
	}
	b.Run("one source", func(b *testing.B) {
		g := New(cfg, nil)
		src := gateAddr("10.0.0.1")
		b.ReportAllocs()
		for b.Loop() {
			release, reason := g.Admit(src, false)
			if reason != "" {
				b.Fatal(reason)
			}
			release()
		}
	})
	b.Run("1024 sources parallel", func(b *testing.B) {
		g := New(cfg, nil)
		var srcs [1024]netip.Addr
		for i := range srcs {
			srcs[i] = netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				release, reason := g.Admit(srcs[i%len(srcs)], false)
				if reason != "" {
					panic(fmt.Sprint(reason))
				}
				release()
				i++
			}
		})
	})
	b.Run("refused denied", func(b *testing.B) {
		g := New(cfg, nil)
		src := gateAddr("10.255.0.1")
		b.ReportAllocs()
		for b.Loop() {
			if _, reason := g.Admit(src, false); reason != Denied {
				b.Fatal(reason)
			}
		}
	})
}

// A banned source that serves a job (a rank's live connection completed a valid message) is
// throttled, not refused: the bucket is empty when the ban begins, so the prober that earned it
// gains nothing at once, and fills at ServingRate up to ServingBurst, so that a job's host can
// open its ranks' connections again once the probing stops. Without ServingRate it is refused.
func TestGateBanServing(t *testing.T) {
	cfg := Config{BanViolations: 2, BanWindow: time.Minute, BanDuration: 10 * time.Minute, ServingRate: 2, ServingBurst: 4}
	clk := newGateClock()
	g := New(cfg, clk.Now)
	src := gateAddr("10.0.0.1")
	g.Violation(src)
	if p := g.Violation(src); p != netip.MustParsePrefix("10.0.0.1/32") {
		t.Fatalf("ban %v, want 10.0.0.1/32", p)
	}
	admitted := func() (n int) {
		for range 20 {
			release, r := g.Admit(src, true)
			switch r {
			case "":
				release()
				n++
			case BanThrottled:
			default:
				t.Fatalf("Admit(serving) = %q, want admitted or %q", r, BanThrottled)
			}
		}
		return n
	}
	if n := admitted(); n != 0 {
		t.Fatalf("%d admitted at the ban's start, want 0", n)
	}
	clk.Advance(time.Second)
	if n := admitted(); n != 2 {
		t.Fatalf("%d admitted 1 s into the ban, want 2 (ServingRate)", n)
	}
	clk.Advance(time.Minute)
	if n := admitted(); n != 4 {
		t.Fatalf("%d admitted a minute later, want 4 (ServingBurst)", n)
	}
	if _, r := g.Admit(src, false); r != Banned {
		t.Fatalf("Admit(not serving) = %q, want %q", r, Banned)
	}
	g.Update(Config{BanViolations: 2, BanWindow: time.Minute, BanDuration: 10 * time.Minute})
	clk.Advance(time.Minute)
	if _, r := g.Admit(src, true); r != Banned {
		t.Fatalf("Admit(serving) without ServingRate = %q, want %q", r, Banned)
	}
	clk.Advance(10 * time.Minute)
	gateMustAdmit(t, g, "10.0.0.1")
}

// An IPv6 source's violations count for its /64: 20 addresses of one /64 make one ban, of the
// whole /64; one address that alone reaches ban.violations is banned alone (a scanner on a
// cluster's subnet), and the next address of its /64 to violate bans the /64. IPv4 stays per
// address: 20 addresses of a /24 with one violation each ban nothing.
func TestGateIPv6BansPer64(t *testing.T) {
	cfg := Config{BanViolations: 5, BanWindow: time.Minute, BanDuration: 10 * time.Minute, IPv4Prefix: 24, IPv6Prefix: 64}
	addr := func(net string, i int) netip.Addr { return gateAddr(fmt.Sprintf("%s%x", net, 0x100+i)) }
	net := netip.MustParsePrefix("2001:db8:0:7::/64")

	t.Run("one violation from each of 20 addresses", func(t *testing.T) {
		g := New(cfg, newGateClock().Now)
		var bans []netip.Prefix
		for i := range 20 {
			if p := g.Violation(addr("2001:db8:0:7::", i)); p.IsValid() {
				bans = append(bans, p)
			}
		}
		if len(bans) != 1 || bans[0] != net {
			t.Fatalf("bans %v, want one, of %v", bans, net)
		}
		for _, a := range []netip.Addr{addr("2001:db8:0:7::", 0), addr("2001:db8:0:7::", 19), gateAddr("2001:db8:0:7:ffff::1")} {
			if _, r := g.Admit(a, false); r != Banned {
				t.Errorf("Admit(%s) = %q, want banned with its /64", a, r)
			}
		}
		gateMustAdmit(t, g, "2001:db8:0:8::1")
		if s := g.Stats(); s.ActiveBans != 1 {
			t.Errorf("ActiveBans %d, want 1", s.ActiveBans)
		}
	})

	t.Run("one address, then the next", func(t *testing.T) {
		g := New(cfg, newGateClock().Now)
		a, b := addr("2001:db8:0:7::", 1), addr("2001:db8:0:7::", 2)
		var bans []netip.Prefix
		for range 5 {
			if p := g.Violation(a); p.IsValid() {
				bans = append(bans, p)
			}
		}
		if len(bans) != 1 || bans[0] != netip.PrefixFrom(a, 128) {
			t.Fatalf("bans %v, want %v alone", bans, a)
		}
		gateMustAdmit(t, g, b.String()) // its neighbours are not banned for it
		if p := g.Violation(b); p != net {
			t.Fatalf("the next address's violation banned %v, want %v", p, net)
		}
		if _, r := g.Admit(addr("2001:db8:0:7::", 3), false); r != Banned {
			t.Fatalf("Admit = %q, want banned with its /64", r)
		}
		if s := g.Stats(); s.ActiveBans != 2 {
			t.Errorf("ActiveBans %d, want 2", s.ActiveBans)
		}
	})

	t.Run("ipv4 per address", func(t *testing.T) {
		g := New(cfg, newGateClock().Now)
		for i := range 20 {
			if p := g.Violation(gateAddr(fmt.Sprintf("10.0.0.%d", i+1))); p.IsValid() {
				t.Fatalf("an IPv4 violation banned %v", p)
			}
		}
	})

	t.Run("link-local per address", func(t *testing.T) {
		g := New(cfg, newGateClock().Now)
		for i := range 20 {
			if p := g.Violation(addr("fe80::", i)); p.IsValid() {
				t.Fatalf("a link-local violation banned %v", p)
			}
		}
	})

	t.Run("a serving address of a banned /64 is throttled", func(t *testing.T) {
		c := cfg
		c.ServingRate, c.ServingBurst = 1, 1
		clk := newGateClock()
		g := New(c, clk.Now)
		for i := range 5 {
			g.Violation(addr("2001:db8:0:7::", i))
		}
		job := addr("2001:db8:0:7::", 100)
		clk.Advance(time.Second)
		if _, r := g.Admit(job, false); r != Banned {
			t.Fatalf("Admit(not serving) = %q, want banned", r)
		}
		release, r := g.Admit(job, true)
		if r != "" {
			t.Fatalf("Admit(serving) = %q, want admitted", r)
		}
		release()
		if _, r := g.Admit(job, true); r != BanThrottled {
			t.Fatalf("Admit(serving) again = %q, want %q", r, BanThrottled)
		}
	})

	t.Run("the ban ends", func(t *testing.T) {
		clk := newGateClock()
		g := New(cfg, clk.Now)
		for i := range 5 {
			g.Violation(addr("2001:db8:0:7::", i))
		}
		clk.Advance(10 * time.Minute)
		gateMustAdmit(t, g, addr("2001:db8:0:7::", 0).String())
		g.Sweep()
		if s := g.Stats(); s.ActiveBans != 0 {
			t.Errorf("ActiveBans %d after the ban, want 0", s.ActiveBans)
		}
	})
}

// A network's ban and violations go to the next process with the rest of the gate (an upgrade in
// place): the /64 stays banned, and its violations still count.
func TestGateStateCarriesNetworks(t *testing.T) {
	cfg := Config{BanViolations: 3, BanWindow: time.Minute, BanDuration: 10 * time.Minute, IPv6Prefix: 64}
	clk := newGateClock()
	g := New(cfg, clk.Now)
	for _, a := range []string{"2001:db8::1", "2001:db8::2", "2001:db8::3"} {
		g.Violation(gateAddr(a))
	}
	g.Violation(gateAddr("2001:db8:1::1"))
	g.Violation(gateAddr("2001:db8:1::2"))

	next := New(cfg, clk.Now)
	next.Restore(g.State())
	if _, r := next.Admit(gateAddr("2001:db8::99"), false); r != Banned {
		t.Fatalf("Admit = %q after the hand-over, want banned", r)
	}
	if p := next.Violation(gateAddr("2001:db8:1::3")); p != netip.MustParsePrefix("2001:db8:1::/64") {
		t.Fatalf("third violation of the other /64 banned %v, want it", p)
	}
}

// The per-network count follows its connections: a release frees a slot of the network.
func TestGatePrefixRelease(t *testing.T) {
	g := New(Config{PerPrefixConnections: 2, IPv4Prefix: 24}, newGateClock().Now)
	a := gateMustAdmit(t, g, "10.0.0.1")
	gateMustAdmit(t, g, "10.0.0.2")
	if _, r := g.Admit(gateAddr("10.0.0.3"), false); r != PrefixConnections {
		t.Fatalf("Admit = %q, want %q", r, PrefixConnections)
	}
	a()
	a()
	gateMustAdmit(t, g, "10.0.0.3")
	if _, r := g.Admit(gateAddr("10.0.0.4"), false); r != PrefixConnections {
		t.Fatalf("Admit = %q after one release, want %q", r, PrefixConnections)
	}
}

// AdmitInPlace admits past MaxConnections (the caller closes another connection to make room), but
// every other check still applies.
func TestGateAdmitInPlace(t *testing.T) {
	g := New(Config{MaxConnections: 1, PerSourceConnections: 1}, newGateClock().Now)
	gateMustAdmit(t, g, "10.0.0.1")
	if _, r := g.Admit(gateAddr("10.0.0.2"), false); r != MaxConnections {
		t.Fatalf("Admit = %q, want %q", r, MaxConnections)
	}
	release, r := g.AdmitInPlace(gateAddr("10.0.0.2"), false, false)
	if r != "" {
		t.Fatalf("AdmitInPlace = %q, want admitted", r)
	}
	if a := g.Stats().Active; a != 2 {
		t.Fatalf("Active = %d, want 2 until the other connection's release", a)
	}
	if _, r := g.AdmitInPlace(gateAddr("10.0.0.2"), false, false); r != SourceConnections {
		t.Fatalf("AdmitInPlace = %q, want %q", r, SourceConnections)
	}
	release()
}
