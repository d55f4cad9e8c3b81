package admission

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/idpattern"
)

const (
	worker   = "spiffe://job.example/ns/train/sa/worker"
	stranger = "spiffe://job.example/ns/other/sa/x"
)

var worker0 = netip.MustParseAddr("10.0.0.9") // a job's host

func mustSet(t *testing.T, patterns ...string) idpattern.Set {
	t.Helper()
	s, err := idpattern.ParseSet(patterns)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// access.deny-identities is checked against every name of the certificate, as tls.allow is: a
// certificate whose identity is a SPIFFE ID and which also names a denied DNS host was admitted.
func TestAdmitIdentityDeniesAnyName(t *testing.T) {
	g := New(Config{DenyIdentities: mustSet(t, "dns:*.evil.example", "spiffe://job.example/ns/other/**")}, nil)
	for _, names := range [][]string{{worker, "dns:a.evil.example"}, {worker, "dns:ok.example", stranger}} {
		if release, got := g.AdmitIdentity(worker0, false, worker, names...); got != IdentityDenied || release != nil {
			t.Errorf("AdmitIdentity(%q, %q) = %q, want %q", worker, names, got, IdentityDenied)
		}
	}
	if release, got := g.AdmitIdentity(worker0, false, worker, worker, "dns:ok.example"); got != "" {
		t.Errorf("no name denied: %q", got)
	} else {
		release()
	}
}

func TestAdmitIdentityDenyAndCap(t *testing.T) {
	g := New(Config{DenyIdentities: mustSet(t, "spiffe://job.example/ns/other/**", "dns:*.evil.example"),
		PerIdentityConnections: 2}, nil)
	for id, want := range map[string]Reason{stranger: IdentityDenied, "dns:a.evil.example": IdentityDenied,
		"dns:a.b.evil.example": "", worker: "", "": ""} {
		release, got := g.AdmitIdentity(worker0, false, id)
		if got != want || (got == "") != (release != nil) {
			t.Errorf("AdmitIdentity(%q) = %q (release %v), want %q", id, got, release != nil, want)
		}
		if release != nil {
			release()
		}
	}
	r1, _ := g.AdmitIdentity(worker0, false, worker)
	r2, _ := g.AdmitIdentity(worker0, false, worker)
	if _, got := g.AdmitIdentity(worker0, false, worker); got != IdentityConnections {
		t.Fatalf("third connection of %s: %q, want %q", worker, got, IdentityConnections)
	}
	if r, got := g.AdmitIdentity(worker0, false, "dns:w1.job.example"); got != "" { // another identity has its own cap
		t.Fatalf("another identity: %q", got)
	} else {
		r()
	}
	r1()
	r1() // twice: no effect
	if r3, got := g.AdmitIdentity(worker0, false, worker); got != "" {
		t.Fatalf("after a release: %q", got)
	} else {
		r3()
	}
	if _, got := g.AdmitIdentity(worker0, false, worker); got != "" {
		t.Fatalf("after the second release of one connection the cap was off by one: %q", got)
	}
	if _, got := g.AdmitIdentity(worker0, false, worker); got != IdentityConnections {
		t.Fatalf("a double release freed two slots: %q", got)
	}
	r2()
}

// TestViolationsBanSourcesNotIdentities: a source's violations ban the source; the identity it
// proved is still admitted from the job's other hosts (they often share one identity).
func TestViolationsBanSourcesNotIdentities(t *testing.T) {
	g := New(Config{BanViolations: 3, BanWindow: time.Minute, BanDuration: 10 * time.Minute, PerIdentityConnections: 4}, newGateClock().Now)
	bad, other := gateAddr("10.0.0.1"), gateAddr("10.0.1.1")
	var banned netip.Prefix
	for range 3 {
		banned = g.Violation(bad)
	}
	if banned != netip.MustParsePrefix("10.0.0.1/32") {
		t.Fatalf("3 violations banned %v", banned)
	}
	if _, r := g.Admit(bad, false); r != Banned {
		t.Fatalf("Admit(the violating source) = %q, want banned", r)
	}
	release, r := g.Admit(other, false)
	if r != "" {
		t.Fatalf("Admit(another host of the job) = %q", r)
	}
	defer release()
	idRelease, r := g.AdmitIdentity(worker0, false, worker)
	if r != "" {
		t.Fatalf("AdmitIdentity(the identity the banned source proved) = %q", r)
	}
	idRelease()
	if st := g.Stats(); st.ActiveBans != 1 {
		t.Fatalf("stats %+v, want the source's ban alone", st)
	}
}

// TestFailedHandshakesBanTheSource: the proxy counts each failed handshake as Violation(src);
// nothing keeps them from banning a source but ban.exempt, and bans off.
func TestFailedHandshakesBanTheSource(t *testing.T) {
	cfg := Config{BanViolations: 5, BanWindow: time.Minute, BanDuration: 10 * time.Minute,
		BanExempt: gatePrefixes("127.0.0.0/8", "::1/128"), PerSourceConnections: 512, PerSourceRate: 200, PerSourceBurst: 512,
		DenyIdentities: mustSet(t, "cn:*"), PerIdentityConnections: 1}
	for _, tt := range []struct {
		src    string
		banned bool
	}{{"198.51.100.4", true}, {"2001:db8::4", true}, {"::ffff:198.51.100.5", true}, {"127.0.0.1", false}, {"::1", false}} {
		g := New(cfg, newGateClock().Now)
		src := gateAddr(tt.src)
		var got netip.Prefix
		for range 5 {
			if p := g.Violation(src); p.IsValid() {
				got = p
			}
		}
		if got.IsValid() != tt.banned {
			t.Errorf("%s: 5 failed handshakes banned %v, want banned %v", tt.src, got, tt.banned)
		}
		if _, r := g.Admit(src, false); (r == Banned) != tt.banned {
			t.Errorf("%s: Admit = %q after 5 failed handshakes", tt.src, r)
		}
	}
}

// TestIdentityStateCarried: identities carry nothing across a hand-over but their connections,
// which the next process adopts; an earlier build's identity ban (an entry with an Identity and
// no address) is dropped.
func TestIdentityStateCarried(t *testing.T) {
	clk := newGateClock()
	cfg := Config{BanViolations: 2, BanWindow: time.Minute, BanDuration: 10 * time.Minute, PerIdentityConnections: 1}
	var old []SourceState
	if err := json.Unmarshal([]byte(`[{"Addr":"","Net":"","Identity":"`+worker+`","BannedUntil":"2099-01-01T00:00:00Z"}]`), &old); err != nil {
		t.Fatal(err)
	}
	next := New(cfg, clk.Now)
	next.Restore(old)
	if release, r := next.AdmitIdentity(worker0, false, worker); r != "" {
		t.Fatalf("an earlier build's identity ban carried over: %q", r)
	} else {
		release()
	}
	if st := next.State(); len(st) != 0 {
		t.Fatalf("state %+v, want none", st)
	}
	adopted := next.AdoptIdentity("dns:w.job.example")
	if _, r := next.AdmitIdentity(worker0, false, "dns:w.job.example"); r != IdentityConnections {
		t.Fatalf("an adopted connection was not counted against the cap: %q", r)
	}
	adopted()
	if release, r := next.AdmitIdentity(worker0, false, "dns:w.job.example"); r != "" {
		t.Fatalf("after the adopted connection's release: %q", r)
	} else {
		release()
	}
}

func TestIdentityTableBounded(t *testing.T) {
	g := New(Config{BanViolations: 3, BanWindow: time.Minute, BanDuration: time.Minute, PerIdentityConnections: 4}, nil)
	g.maxSources = 8
	var releases []func()
	for i := range 8 {
		release, r := g.AdmitIdentity(worker0, false, fmt.Sprintf("dns:w%d.job.example", i))
		if r != "" {
			t.Fatalf("identity %d: %q", i, r)
		}
		releases = append(releases, release)
	}
	if _, r := g.AdmitIdentity(worker0, false, "dns:w8.job.example"); r != IdentityTable {
		t.Fatalf("a ninth identity in a table of 8 with live connections: %q, want %q", r, IdentityTable)
	}
	for _, r := range releases {
		r()
	}
	g.lastFull -= fullSweepInterval // let the full table sweep again
	g.sweptFull = false
	if release, r := g.AdmitIdentity(worker0, false, "dns:w8.job.example"); r != "" {
		t.Fatalf("after the others ended: %q", r)
	} else {
		release()
	}
}

// TestAdmitIdentityFastPath: with no per-identity cap
// AdmitIdentity takes no lock and allocates nothing; the address path is untouched.
func TestAdmitIdentityFastPath(t *testing.T) {
	g := New(Config{BanViolations: 5, BanWindow: time.Minute, BanDuration: time.Minute}, nil)
	g.mu.Lock() // held: a path that locks would deadlock
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, r := g.AdmitIdentity(worker0, false, worker); r != "" {
			t.Errorf("AdmitIdentity = %q", r)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("AdmitIdentity waited for the gate's lock")
	}
	g.mu.Unlock()
	if n := testing.AllocsPerRun(100, func() { g.AdmitIdentity(worker0, false, worker) }); n != 0 {
		t.Errorf("AdmitIdentity allocates %v times on its fast path", n)
	}
}

func TestIdentityConcurrent(t *testing.T) {
	g := New(Config{BanViolations: 2, BanWindow: time.Millisecond, BanDuration: time.Nanosecond, PerIdentityConnections: 3}, nil)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			id := fmt.Sprintf("dns:w%d.job.example", i%2)
			for range 500 {
				if release, r := g.AdmitIdentity(worker0, false, id); r == "" {
					g.Violation(gateAddr("192.0.2.1"))
					release()
				}
				g.Sweep()
			}
		})
	}
	wg.Wait()
	for i := range 2 {
		id := fmt.Sprintf("dns:w%d.job.example", i)
		var rs []func()
		for range 3 {
			release, r := g.AdmitIdentity(worker0, false, id)
			if r != "" {
				t.Fatalf("%s after every release: %q (a connection leaked)", id, r)
			}
			rs = append(rs, release)
		}
		for _, r := range rs {
			r()
		}
	}
}
