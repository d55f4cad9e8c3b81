// Package admission decides which connections the guard admits: access lists, connection caps,
// per-source rates and bans; and how many connections it may make to the store (StoreSlots). It has
// no sockets: the proxy asks it on each accept and each store connection, and tells it of each
// violation.
package admission

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Reason says why a connection was refused; "" means admitted. It is a
// bounded metrics label (connections_refused_total{reason}).
type Reason string

const (
	Denied            Reason = "denied"             // source in access.deny
	NotAllowed        Reason = "not_allowed"        // access.allow non-empty and source not in it
	Banned            Reason = "banned"             // source is serving a ban
	MaxConnections    Reason = "max_connections"    // global cap
	SourceConnections Reason = "source_connections" // per-source concurrent cap
	SourceRate        Reason = "source_rate"        // per-source new connections per second
	SourceTable       Reason = "source_table_full"  // no room to track a new source
)

// Config is the admission policy: access.*, caps.* and ban.* of the config.
type Config struct {
	Allow, Deny          []netip.Prefix // empty Allow = everyone
	MaxConnections       int            // 0 = unlimited
	PerSourceConnections int            // 0 = unlimited
	PerSourceRate        float64        // new connections/s per source, token bucket; 0 = unlimited
	PerSourceBurst       int            // bucket size; below 1 is taken as 1 when the rate is set
	BanViolations        int            // violations within BanWindow that start a ban; 0 = bans off
	BanWindow            time.Duration
	BanDuration          time.Duration
	BanExempt            []netip.Prefix // never banned; their violations are not counted
}

// Stats is a snapshot for the connections_active and bans_active gauges.
type Stats struct {
	Active     int // admitted connections not yet released
	Sources    int // sources with per-source state
	ActiveBans int // sources banned right now
}

const (
	// defaultMaxSources bounds the per-source table, so a client spraying
	// source addresses (an IPv6 /64 is enough) cannot grow it without limit.
	defaultMaxSources = 1 << 18
	// maxBanViolations bounds the per-source violation log (8 bytes an entry).
	// Larger configured values are treated as this.
	maxBanViolations = 1024
	// fullSweepInterval rate-limits the sweep a full table triggers in Admit:
	// a sweep is O(sources) under the lock, and a table that stays full must
	// not make every accept pay for one.
	fullSweepInterval = time.Second
)

// Gate decides which connections the proxy admits. It is safe for concurrent
// use. Times are kept as durations since the Gate was made, read from the
// injected clock, so a wall-clock step cannot lift a ban early.
type Gate struct {
	now   func() time.Time
	epoch time.Time
	cfg   atomic.Pointer[Config] // normalized; swapped whole by Update

	mu         sync.Mutex
	active     int
	sources    map[netip.Addr]*sourceState
	banned     map[netip.Addr]*sourceState // sources whose ban has not been seen to expire
	maxSources int
	lastFull   time.Duration // when a full table last triggered a sweep
	sweptFull  bool          // lastFull is set
}

// sourceState is what the gate remembers about one source address.
type sourceState struct {
	conns       int
	tokens      float64       // rate bucket; meaningful once filled is set
	refilled    time.Duration // when tokens was last brought up to date
	filled      bool
	bannedUntil time.Duration // banned while now < bannedUntil; 0 = not banned
	// violations holds the times of the most recent violations, oldest first,
	// at most K of them and none older than the window: the ban window slides.
	violations []time.Duration
}

// New returns a Gate enforcing cfg. now is the clock; nil means time.Now.
func New(cfg Config, now func() time.Time) *Gate {
	if now == nil {
		now = time.Now
	}
	g := &Gate{
		now:        now,
		epoch:      now(),
		sources:    make(map[netip.Addr]*sourceState),
		banned:     make(map[netip.Addr]*sourceState),
		maxSources: defaultMaxSources,
	}
	g.Update(cfg)
	return g
}

// Update swaps in a new policy. It applies to admissions and violations from
// now on; live connections are kept, and their release still frees the slots
// they took.
func (g *Gate) Update(cfg Config) {
	cfg.Allow = normalizePrefixes(cfg.Allow)
	cfg.Deny = normalizePrefixes(cfg.Deny)
	cfg.BanExempt = normalizePrefixes(cfg.BanExempt)
	if cfg.PerSourceRate > 0 && cfg.PerSourceBurst < 1 {
		cfg.PerSourceBurst = 1
	}
	if cfg.BanViolations > maxBanViolations {
		cfg.BanViolations = maxBanViolations
	}
	g.cfg.Store(&cfg)
}

// normalizePrefixes masks each prefix and rewrites IPv4-mapped IPv6 prefixes
// (::ffff:10.0.0.0/104) as IPv4, to match the unmapped addresses Admit tests.
// Invalid prefixes are dropped: they would match nothing anyway.
func normalizePrefixes(in []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		if !p.IsValid() {
			continue
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out
}

func containsAddr(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Admit decides whether a connection from src may proceed. When admitted
// (reason ""), release must be called when the connection ends; calling it
// again does nothing. When refused, release is nil.
//
// Checks run in this order: deny, allow, ban, global cap, per-source
// concurrent cap, per-source rate. A refused connection takes no rate token.
func (g *Gate) Admit(src netip.Addr) (release func(), reason Reason) {
	src = src.Unmap()
	cfg := g.cfg.Load()
	// The access lists never change under a snapshot, so match them unlocked.
	if containsAddr(cfg.Deny, src) {
		return nil, Denied
	}
	if len(cfg.Allow) > 0 && !containsAddr(cfg.Allow, src) {
		return nil, NotAllowed
	}
	perSource := cfg.PerSourceConnections > 0 || cfg.PerSourceRate > 0

	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.since()
	st := g.sources[src]
	if st != nil && g.bannedLocked(src, st, now) {
		return nil, Banned
	}
	if cfg.MaxConnections > 0 && g.active >= cfg.MaxConnections {
		return nil, MaxConnections
	}
	if st == nil && perSource {
		if st = g.newSourceLocked(src, cfg, now); st == nil {
			return nil, SourceTable
		}
	}
	if cfg.PerSourceConnections > 0 && st.conns >= cfg.PerSourceConnections {
		return nil, SourceConnections
	}
	if cfg.PerSourceRate > 0 {
		st.refill(cfg, now)
		if st.tokens < 1 {
			return nil, SourceRate
		}
		st.tokens--
	}
	g.active++
	if st != nil {
		// Counted here, st stays in the table (Sweep keeps sources with
		// connections) until release uncounts it.
		st.conns++
	}
	return g.releaser(st), ""
}

// releaser is what gives back a connection counted in g.active and st (nil: no per-source state),
// once.
func (g *Gate) releaser(st *sourceState) func() {
	var released atomic.Bool
	return func() {
		if !released.CompareAndSwap(false, true) {
			return
		}
		g.mu.Lock()
		g.active--
		if st != nil {
			st.conns--
		}
		g.mu.Unlock()
	}
}

// Violation records a protocol violation by src and reports whether it
// started a ban: BanViolations violations within the last BanWindow (a sliding
// window). Violations by a source already banned are not counted, and the
// count starts afresh when the ban ends.
func (g *Gate) Violation(src netip.Addr) (banned bool) {
	src = src.Unmap()
	cfg := g.cfg.Load()
	k := cfg.BanViolations
	if k <= 0 || containsAddr(cfg.BanExempt, src) {
		return false
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.since()
	st := g.sources[src]
	if st == nil {
		// A full table loses this violation rather than grow; the source's
		// connections are still capped by everything else.
		if st = g.newSourceLocked(src, cfg, now); st == nil {
			return false
		}
	}
	if g.bannedLocked(src, st, now) {
		return false
	}
	st.pruneViolations(cfg, now)
	if len(st.violations) >= k { // k shrank in an Update
		st.violations = append(st.violations[:0], st.violations[len(st.violations)-k+1:]...)
	}
	st.violations = append(st.violations, now)
	if len(st.violations) < k {
		return false
	}
	st.violations = nil
	st.bannedUntil = now + cfg.BanDuration
	if st.bannedUntil <= 0 { // a zero duration from an unvalidated config
		st.bannedUntil = now + 1
	}
	g.banned[src] = st
	return true
}

// Stats returns a snapshot of the gate's counters.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.since()
	s := Stats{Active: g.active, Sources: len(g.sources)}
	for _, st := range g.banned {
		if now < st.bannedUntil {
			s.ActiveBans++
		}
	}
	return s
}

// Sweep drops per-source state that carries nothing: no live connections, a
// full rate bucket, no ban, and no violation inside the window. The proxy
// calls it periodically; Admit also calls it when the table is full.
func (g *Gate) Sweep() {
	cfg := g.cfg.Load()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sweepLocked(cfg, g.since())
}

func (g *Gate) sweepLocked(cfg *Config, now time.Duration) {
	for src, st := range g.sources {
		if st.bannedUntil != 0 && now >= st.bannedUntil {
			st.bannedUntil = 0
			delete(g.banned, src)
		}
		if st.idle(cfg, now) {
			delete(g.sources, src)
		}
	}
}

// newSourceLocked adds state for src, sweeping first if the table is full.
// It returns nil if there is still no room.
func (g *Gate) newSourceLocked(src netip.Addr, cfg *Config, now time.Duration) *sourceState {
	if len(g.sources) >= g.maxSources {
		if g.sweptFull && now-g.lastFull < fullSweepInterval && now >= g.lastFull {
			return nil
		}
		g.sweptFull, g.lastFull = true, now
		g.sweepLocked(cfg, now)
		if len(g.sources) >= g.maxSources {
			return nil
		}
	}
	st := &sourceState{}
	g.sources[src] = st
	return st
}

// bannedLocked reports whether st is banned at now, clearing a ban that has
// run out.
func (g *Gate) bannedLocked(src netip.Addr, st *sourceState, now time.Duration) bool {
	if st.bannedUntil == 0 {
		return false
	}
	if now < st.bannedUntil {
		return true
	}
	st.bannedUntil = 0
	delete(g.banned, src)
	return false
}

func (g *Gate) since() time.Duration { return g.now().Sub(g.epoch) }

// refill brings the token bucket up to now. A new bucket starts full.
func (st *sourceState) refill(cfg *Config, now time.Duration) {
	burst := float64(cfg.PerSourceBurst)
	if !st.filled {
		st.filled, st.tokens, st.refilled = true, burst, now
		return
	}
	if elapsed := now - st.refilled; elapsed > 0 {
		st.tokens += elapsed.Seconds() * cfg.PerSourceRate
	}
	if st.tokens > burst { // also clamps after a burst lowered by Update
		st.tokens = burst
	}
	st.refilled = now
}

// pruneViolations drops violations that have slid out of the window.
func (st *sourceState) pruneViolations(cfg *Config, now time.Duration) {
	i := 0
	for i < len(st.violations) && now-st.violations[i] >= cfg.BanWindow {
		i++
	}
	if i == len(st.violations) {
		st.violations = nil // let go of the backing array
		return
	}
	st.violations = st.violations[i:]
}

func (st *sourceState) idle(cfg *Config, now time.Duration) bool {
	if st.conns > 0 || st.bannedUntil != 0 {
		return false
	}
	if n := len(st.violations); n > 0 && now-st.violations[n-1] < cfg.BanWindow {
		return false
	}
	if cfg.PerSourceRate > 0 && st.filled {
		st.refill(cfg, now)
		if st.tokens < float64(cfg.PerSourceBurst) {
			return false
		}
	}
	return true
}
