package admission

import (
	"testing"
	"time"
)

// banCfg is the embedded defaults' ban policy.
func banCfg() Config {
	return Config{BanViolations: 5, BanWindow: time.Minute, BanDuration: 10 * time.Minute, IPv4Prefix: 24, IPv6Prefix: 64,
		PerSourceConnections: 512, PerSourceRate: 200, PerSourceBurst: 512, ServingRate: 1, ServingBurst: 16,
		BanExempt: gatePrefixes("127.0.0.0/8", "::1/128")}
}

// A worker's address banned by plaintext (a local user's probes, anything behind its NAT): its
// proven connections are still admitted, its plaintext ones are not.
func TestProofBeatsAnAddressBan(t *testing.T) {
	g := New(banCfg(), newGateClock().Now)
	for range 5 {
		g.Violation(worker0)
	}
	if _, r := g.Admit(worker0, false); r != Banned {
		t.Fatalf("plaintext from the banned address: %q, want %q", r, Banned)
	}
	release, r := g.AdmitToProve(worker0, false)
	if r != "" {
		t.Fatalf("a connection that must prove itself, from the banned address: %q", r)
	}
	defer release()
	idRelease, r := g.AdmitIdentity(worker0, false, worker)
	if r != "" {
		t.Fatalf("the proven identity at the banned address: %q", r)
	}
	idRelease()
}

// Two addresses of a /64 ban the /64; a worker elsewhere in it proves its identity and is in.
func TestProofBeatsANetworkBan(t *testing.T) {
	g := New(banCfg(), newGateClock().Now)
	a, b, w := gateAddr("2001:db8:7::a"), gateAddr("2001:db8:7::b"), gateAddr("2001:db8:7::77")
	var banned bool
	for range 4 {
		banned = g.Violation(a).IsValid() || banned
		banned = g.Violation(b).IsValid() || banned
	}
	if !banned {
		t.Fatal("8 violations from two addresses of a /64 banned nothing")
	}
	if _, r := g.Admit(w, false); r != Banned {
		t.Fatalf("plaintext from the /64: %q, want %q", r, Banned)
	}
	release, r := g.AdmitToProve(w, false)
	if r != "" {
		t.Fatalf("the worker's TLS connection from the banned /64: %q", r)
	}
	release()
}

// Proven connections' violations ban the identity at that address: not the address (its
// plaintext is judged apart), not the identity elsewhere (a job's hosts share it).
func TestProvenViolationsBanTheIdentityAtItsAddress(t *testing.T) {
	clk := newGateClock()
	g := New(banCfg(), clk.Now)
	other := gateAddr("10.0.0.10")
	for i := range 5 {
		if banned := g.ProvenViolation(worker0, worker); banned != (i == 4) {
			t.Fatalf("violation %d: banned %v", i+1, banned)
		}
	}
	if _, r := g.AdmitIdentity(worker0, false, worker); r != IdentityBanned {
		t.Fatalf("the banned identity at its address: %q, want %q", r, IdentityBanned)
	}
	if _, r := g.AdmitIdentity(worker0, false, stranger); r != "" {
		t.Fatalf("another identity at that address: %q", r)
	}
	if _, r := g.AdmitIdentity(other, false, worker); r != "" {
		t.Fatalf("the identity on another host of the job: %q", r)
	}
	if _, r := g.Admit(worker0, false); r != "" {
		t.Fatalf("the address, for plaintext: %q", r)
	}
	if g.ProvenViolation(worker0, worker) {
		t.Fatal("a violation during the ban started another")
	}
	if st := g.Stats(); st.ActiveBans != 1 {
		t.Fatalf("stats %+v, want 1 ban", st)
	}
	// Serving a job, the host gets ServingRate new connections of it a second, none at the start.
	if _, r := g.AdmitIdentity(worker0, true, worker); r != BanThrottled {
		t.Fatalf("serving, at the ban's start: %q, want %q", r, BanThrottled)
	}
	clk.Advance(2 * time.Second)
	for i, want := range []Reason{"", "", BanThrottled} {
		if _, r := g.AdmitIdentity(worker0, true, worker); r != want {
			t.Fatalf("serving, 2 s in, connection %d: %q, want %q", i+1, r, want)
		}
	}
	clk.Advance(10 * time.Minute)
	if _, r := g.AdmitIdentity(worker0, false, worker); r != "" {
		t.Fatalf("after the ban: %q", r)
	}
	g.Sweep()
	if st := g.Stats(); st.ActiveBans != 0 || len(g.proven) != 0 {
		t.Fatalf("after the ban and a sweep: stats %+v, %d proven states", st, len(g.proven))
	}
}

func TestProvenViolationsOfExemptOrUnprovenBanNothing(t *testing.T) {
	g := New(banCfg(), newGateClock().Now)
	for range 10 {
		if g.ProvenViolation(gateAddr("127.0.0.1"), worker) || g.ProvenViolation(worker0, "") {
			t.Fatal("an exempt address or an empty identity was banned")
		}
	}
	cfg := banCfg()
	cfg.BanViolations = 0
	g.Update(cfg)
	for range 10 {
		if g.ProvenViolation(worker0, worker) {
			t.Fatal("bans off, and a ban")
		}
	}
}

func TestProvenStateCarried(t *testing.T) {
	clk := newGateClock()
	old := New(banCfg(), clk.Now)
	for range 5 {
		old.ProvenViolation(worker0, worker)
	}
	old.ProvenViolation(worker0, stranger)
	next := New(banCfg(), clk.Now)
	next.RestoreProven(old.ProvenStates())
	if _, r := next.AdmitIdentity(worker0, false, worker); r != IdentityBanned {
		t.Fatalf("the ban did not carry over: %q", r)
	}
	for range 3 {
		next.ProvenViolation(worker0, stranger)
	}
	if !next.ProvenViolation(worker0, stranger) {
		t.Fatal("the carried violation did not count: the fifth was not a ban")
	}
	if len(next.State()) != 0 {
		t.Fatalf("identities' state leaked into the addresses': %+v", next.State())
	}
}

func TestProvenTableBounded(t *testing.T) {
	g := New(banCfg(), newGateClock().Now)
	g.maxSources = 4
	for i := range 8 {
		g.ProvenViolation(gateAddr("10.0.1."+string(rune('1'+i))), worker)
	}
	if len(g.proven) > 4 {
		t.Fatalf("%d proven states in a table of 4", len(g.proven))
	}
}
