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

	"github.com/storeguard/storeguard/idpattern"
)

// Reason says why a connection was refused; "" means admitted. It is a
// bounded metrics label (connections_refused_total{reason}).
type Reason string

const (
	Denied            Reason = "denied"             // source in access.deny
	NotAllowed        Reason = "not_allowed"        // access.allow non-empty and source not in it
	Banned            Reason = "banned"             // source is serving a ban
	BanThrottled      Reason = "ban_throttled"      // banned, serving a job, and past ban.serving-rate
	MaxConnections    Reason = "max_connections"    // global cap
	PrefixConnections Reason = "prefix_connections" // per-network concurrent cap (an IPv4 /24, an IPv6 /64)
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
	// PerPrefixConnections caps the connections open at once from one network: a source's first
	// IPv4Prefix (IPv6Prefix) bits. The IPv6 prefix is also the network an IPv6 ban covers
	// (Violation). 0 bits, or the address's length, is the address alone. 0 = no cap.
	PerPrefixConnections int
	IPv4Prefix           int
	IPv6Prefix           int
	BanViolations        int // violations within BanWindow that start a ban; 0 = bans off
	BanWindow            time.Duration
	BanDuration          time.Duration
	BanExempt            []netip.Prefix // never banned; their violations are not counted
	// ServingRate is how many new connections a second a banned source may still open while it
	// serves a job (Admit's serving), up to ServingBurst at once; 0 = none.
	ServingRate  float64
	ServingBurst int

	// Identities (AdmitIdentity): a connection whose TLS handshake proved an identity matching
	// DenyIdentities is refused; at most PerIdentityConnections of one identity are open at once
	// (0 = unlimited). A proven connection's violations ban its identity at its address
	// (ProvenViolation), never the address.
	DenyIdentities         idpattern.Set
	PerIdentityConnections int
}

// Stats is a snapshot for the connections_active and bans_active gauges.
type Stats struct {
	Active     int // admitted connections not yet released
	Sources    int // sources with per-source state
	Identities int // identities with connections counted (AdmitIdentity)
	ActiveBans int // sources, IPv6 networks and identities at addresses banned right now
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
	nets       map[netip.Prefix]*netState
	bannedNets map[netip.Prefix]*netState // IPv6 networks whose ban has not been seen to expire
	maxSources int                        // bounds sources, and nets and identities apart
	lastFull   time.Duration              // when a full table last triggered a sweep
	sweptFull  bool                       // lastFull is set

	identities map[string]*identityState
	// proven: identities at addresses, whose violations (ProvenViolation) ban them there;
	// bannedProven those whose ban has not been seen to expire.
	proven       map[provenKey]*sourceState
	bannedProven map[provenKey]*sourceState
	provenBans   atomic.Int32 // len(bannedProven), read unlocked by AdmitIdentity
}

// sourceState is what the gate remembers about one source address.
type sourceState struct {
	conns    int
	tokens   float64       // rate bucket; meaningful once filled is set
	refilled time.Duration // when tokens was last brought up to date
	filled   bool
	ban
	// violations holds the times of the most recent violations, oldest first,
	// at most K of them and none older than the window: the ban window slides.
	violations []time.Duration
	// serving is the bucket of new connections a banned source serving a job may open
	// (ServingRate), for the ban that began at servingBan.
	serving    float64
	servingAt  time.Duration
	servingBan time.Duration
	servingSet bool
}

// netState is what the gate remembers about one network (Config.IPv4Prefix, IPv6Prefix): its open
// connections and, for IPv6, its violations and ban. An IPv6 host or customer is given a whole /64,
// so a prober that moves from address to address within it is one source for bans.
type netState struct {
	conns int
	ban
	violations []netViolation // as sourceState.violations, with whose each was
}

type netViolation struct {
	at   time.Duration
	addr netip.Addr
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
		nets:       make(map[netip.Prefix]*netState),
		bannedNets: make(map[netip.Prefix]*netState),
		maxSources: defaultMaxSources,

		identities:   make(map[string]*identityState),
		proven:       make(map[provenKey]*sourceState),
		bannedProven: make(map[provenKey]*sourceState),
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
	if cfg.ServingRate > 0 && cfg.ServingBurst < 1 {
		cfg.ServingBurst = 1
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

// netOf is the network src belongs to under cfg (IPv4Prefix, IPv6Prefix). A link-local IPv6
// address is its own: every host on a link shares fe80::/64.
func (cfg *Config) netOf(src netip.Addr) netip.Prefix {
	bits := cfg.IPv4Prefix
	if src.Is6() {
		bits = cfg.IPv6Prefix
		if src.IsLinkLocalUnicast() {
			bits = 0
		}
	}
	if bits <= 0 || bits > src.BitLen() {
		bits = src.BitLen()
	}
	p, _ := src.WithZone("").Prefix(bits)
	return p
}

// Admit decides whether a connection from src may proceed. When admitted
// (reason ""), release must be called when the connection ends; calling it
// again does nothing. When refused, release is nil.
//
// serving says that src has a live connection that completed a valid message: a job's rank is
// there (behind NAT, a scanner and a job share the address). A banned source that serves a job is
// not refused outright: it may open ServingRate new connections a second (a rank restarting).
//
// Checks run in this order: deny, allow, ban, global cap, per-network cap,
// per-source concurrent cap, per-source rate, the banned source's serving rate.
// A refused connection takes no rate token.
func (g *Gate) Admit(src netip.Addr, serving bool) (release func(), reason Reason) {
	return g.admit(src, serving, true, false)
}

// AdmitInPlace admits src as Admit does (as AdmitToProve does if toProve), but past
// MaxConnections: the caller closes another connection to make room, whose release comes when it
// has ended.
func (g *Gate) AdmitInPlace(src netip.Addr, serving, toProve bool) (release func(), reason Reason) {
	return g.admit(src, serving, false, toProve)
}

// admit admits as Admit does; capped: MaxConnections applies (AdmitInPlace); toProve: a ban does
// not refuse (AdmitToProve).
func (g *Gate) admit(src netip.Addr, serving, capped, toProve bool) (release func(), reason Reason) {
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
	prefix := cfg.netOf(src)
	nt := g.nets[prefix]
	banStart, banned := g.banLocked(src, st, prefix, nt, now)
	banned = banned && !toProve
	if banned && (!serving || cfg.ServingRate <= 0) {
		return nil, Banned
	}
	if capped && cfg.MaxConnections > 0 && g.active >= cfg.MaxConnections {
		return nil, MaxConnections
	}
	if nt == nil && cfg.PerPrefixConnections > 0 {
		if nt = g.newNetLocked(prefix, cfg, now); nt == nil {
			return nil, SourceTable
		}
	}
	if cfg.PerPrefixConnections > 0 && nt.conns >= cfg.PerPrefixConnections {
		return nil, PrefixConnections
	}
	if st == nil && (perSource || banned) {
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
	}
	if banned {
		st.refillServing(cfg, banStart, now)
		if st.serving < 1 {
			return nil, BanThrottled
		}
		st.serving--
	}
	if cfg.PerSourceRate > 0 {
		st.tokens--
	}
	g.active++
	// Counted here, st and nt stay in their tables (Sweep keeps them while they have
	// connections) until release uncounts them.
	if st != nil {
		st.conns++
	}
	if nt != nil {
		nt.conns++
	}
	return g.releaser(st, nt), ""
}

// releaser is what gives back a connection counted in g.active, st and nt (nil: no such state),
// once.
func (g *Gate) releaser(st *sourceState, nt *netState) func() {
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
		if nt != nil {
			nt.conns--
		}
		g.mu.Unlock()
	}
}

// banLocked reports whether src is banned at now, by a ban of its own or of its IPv6 network, and
// when the ban in effect began (the later one, if both are).
func (g *Gate) banLocked(src netip.Addr, st *sourceState, prefix netip.Prefix, nt *netState, now time.Duration) (
	start time.Duration, banned bool) {
	if st != nil && g.bannedLocked(src, st, now) {
		start, banned = st.bannedAt, true
	}
	if nt != nil && g.netBannedLocked(prefix, nt, now) && (!banned || nt.bannedAt > start) {
		start, banned = nt.bannedAt, true
	}
	return start, banned
}

// Violation records a protocol violation by src and reports the network it banned, if it started
// a ban (an invalid Prefix if not): BanViolations violations within the last BanWindow (a sliding
// window) ban src's address. An IPv6 source's violations count for its network (IPv6Prefix) too:
// BanViolations of them from more than one address ban the whole network, so that moving from
// address to address buys a prober nothing; one address that alone reaches the count is banned
// alone (a scanner on a cluster's subnet leaves the other hosts be). Violations by a source
// already banned are not counted, and the count starts afresh when the ban ends.
//
// A source serving a job is banned like any other: Admit then lets its job open new connections
// at ServingRate, and its live connections are never touched.
func (g *Gate) Violation(src netip.Addr) (banned netip.Prefix) {
	src = src.Unmap()
	cfg := g.cfg.Load()
	k := cfg.BanViolations
	if k <= 0 || containsAddr(cfg.BanExempt, src) {
		return netip.Prefix{}
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.since()
	st := g.sources[src]
	if st == nil {
		// A full table loses this violation rather than grow; the source's
		// connections are still capped by everything else.
		if st = g.newSourceLocked(src, cfg, now); st == nil {
			return netip.Prefix{}
		}
	}
	if g.bannedLocked(src, st, now) {
		return netip.Prefix{}
	}
	var nt *netState
	prefix := cfg.netOf(src)
	if src.Is6() && prefix.Bits() < src.BitLen() {
		if nt = g.nets[prefix]; nt == nil {
			nt = g.newNetLocked(prefix, cfg, now)
		}
		if nt != nil && g.netBannedLocked(prefix, nt, now) {
			return netip.Prefix{}
		}
	}
	own := st.violation(cfg, now)
	if nt != nil && nt.violation(cfg, now, src) {
		nt.violations = nil
		nt.bannedAt, nt.bannedUntil = now, banEnd(cfg, now)
		g.bannedNets[prefix] = nt
		return prefix
	}
	if !own {
		return netip.Prefix{}
	}
	st.violations = nil
	st.bannedAt, st.bannedUntil = now, banEnd(cfg, now)
	g.banned[src] = st
	return netip.PrefixFrom(src, src.BitLen())
}

// banEnd is when a ban that begins at now ends.
func banEnd(cfg *Config, now time.Duration) time.Duration {
	if cfg.BanDuration <= 0 { // a zero duration from an unvalidated config
		return now + 1
	}
	return now + cfg.BanDuration
}

// violation logs a violation at now and reports whether the log holds BanViolations of them.
func (st *sourceState) violation(cfg *Config, now time.Duration) bool {
	return violationLog(&st.violations, cfg, now)
}

// violationLog adds a violation at now to a log of violation times, oldest first, after dropping
// those that slid out of the window, and reports whether it holds BanViolations of them.
func violationLog(log *[]time.Duration, cfg *Config, now time.Duration) bool {
	k := cfg.BanViolations
	pruneViolations(log, cfg, now)
	if len(*log) >= k { // k shrank in an Update
		*log = append((*log)[:0], (*log)[len(*log)-k+1:]...)
	}
	*log = append(*log, now)
	return len(*log) >= k
}

// violation logs src's violation at now and reports whether the log holds BanViolations of them,
// from more than one address.
func (nt *netState) violation(cfg *Config, now time.Duration, src netip.Addr) bool {
	k := cfg.BanViolations
	i := 0
	for i < len(nt.violations) && now-nt.violations[i].at >= cfg.BanWindow {
		i++
	}
	nt.violations = nt.violations[i:]
	if len(nt.violations) >= k {
		nt.violations = append(nt.violations[:0], nt.violations[len(nt.violations)-k+1:]...)
	}
	nt.violations = append(nt.violations, netViolation{at: now, addr: src})
	if len(nt.violations) < k {
		return false
	}
	for _, v := range nt.violations {
		if v.addr != src {
			return true
		}
	}
	return false
}

// Stats returns a snapshot of the gate's counters.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.since()
	s := Stats{Active: g.active, Sources: len(g.sources), Identities: len(g.identities)}
	for _, st := range g.banned {
		if now < st.bannedUntil {
			s.ActiveBans++
		}
	}
	for _, nt := range g.bannedNets {
		if now < nt.bannedUntil {
			s.ActiveBans++
		}
	}
	for _, st := range g.bannedProven {
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
		g.bannedLocked(src, st, now) // clears a ban that has run out
		if st.idle(cfg, now) {
			delete(g.sources, src)
		}
	}
	for prefix, nt := range g.nets {
		g.netBannedLocked(prefix, nt, now)
		if nt.idle(cfg, now) {
			delete(g.nets, prefix)
		}
	}
	for id, is := range g.identities {
		if is.conns == 0 {
			delete(g.identities, id)
		}
	}
	g.sweepProvenLocked(cfg, now)
}

// newSourceLocked adds state for src, sweeping first if the table is full.
// It returns nil if there is still no room.
func (g *Gate) newSourceLocked(src netip.Addr, cfg *Config, now time.Duration) *sourceState {
	if !g.roomLocked(func() int { return len(g.sources) }, cfg, now) {
		return nil
	}
	st := &sourceState{}
	g.sources[src] = st
	return st
}

// roomLocked reports whether a table of size() entries may take one more, sweeping first if it is
// full, at most once a fullSweepInterval.
func (g *Gate) roomLocked(size func() int, cfg *Config, now time.Duration) bool {
	if size() < g.maxSources {
		return true
	}
	if g.sweptFull && now-g.lastFull < fullSweepInterval && now >= g.lastFull {
		return false
	}
	g.sweptFull, g.lastFull = true, now
	g.sweepLocked(cfg, now)
	return size() < g.maxSources
}

// newNetLocked adds state for prefix, as newSourceLocked does for a source.
func (g *Gate) newNetLocked(prefix netip.Prefix, cfg *Config, now time.Duration) *netState {
	if !g.roomLocked(func() int { return len(g.nets) }, cfg, now) {
		return nil
	}
	nt := &netState{}
	g.nets[prefix] = nt
	return nt
}

// ban is a source's or a network's ban.
type ban struct {
	bannedUntil time.Duration // banned while now < bannedUntil; 0 = not banned
	bannedAt    time.Duration // when the ban began
}

// inForce reports whether b bans at now, clearing a ban that has run out and taking its holder
// key out of banned (the gate's banned or bannedNets).
func inForce[K comparable, V any](b *ban, banned map[K]V, key K, now time.Duration) bool {
	if b.bannedUntil == 0 {
		return false
	}
	if now < b.bannedUntil {
		return true
	}
	b.bannedUntil = 0
	delete(banned, key)
	return false
}

// netBannedLocked is bannedLocked for a network.
func (g *Gate) netBannedLocked(prefix netip.Prefix, nt *netState, now time.Duration) bool {
	return inForce(&nt.ban, g.bannedNets, prefix, now)
}

// bannedLocked reports whether st is banned at now, clearing a ban that has run out.
func (g *Gate) bannedLocked(src netip.Addr, st *sourceState, now time.Duration) bool {
	return inForce(&st.ban, g.banned, src, now)
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

// refillServing brings the bucket of a banned source that serves a job up to now, for the ban that
// began at ban: empty at the ban's start, so that a ban gives its prober no burst, and full
// (ServingBurst) after ServingBurst / ServingRate seconds, for a job's host that restarts its ranks
// once the scan has passed.
func (st *sourceState) refillServing(cfg *Config, ban, now time.Duration) {
	if !st.servingSet || st.servingBan != ban {
		st.servingSet, st.servingBan, st.serving, st.servingAt = true, ban, 0, ban
	}
	if elapsed := now - st.servingAt; elapsed > 0 {
		st.serving += elapsed.Seconds() * cfg.ServingRate
	}
	st.serving = min(st.serving, float64(cfg.ServingBurst))
	st.servingAt = now
}

// pruneViolations drops violations that have slid out of the window.
func pruneViolations(log *[]time.Duration, cfg *Config, now time.Duration) {
	i := 0
	for i < len(*log) && now-(*log)[i] >= cfg.BanWindow {
		i++
	}
	if i == len(*log) {
		*log = nil // let go of the backing array
		return
	}
	*log = (*log)[i:]
}

func (nt *netState) idle(cfg *Config, now time.Duration) bool {
	if nt.conns > 0 || nt.bannedUntil != 0 {
		return false
	}
	n := len(nt.violations)
	return n == 0 || now-nt.violations[n-1].at >= cfg.BanWindow
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
