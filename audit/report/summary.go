package report

import (
	"cmp"
	"errors"
	"io"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

// Caps on what a Summary lists; the counts stay exact.
const (
	MaxMalformedListed = 100 // malformed lines
	MaxScansListed     = 100 // scan notices
	MaxTimelineSources = 50  // sources with a timeline row, from the top of the ranking
	maxProbesPerSource = 8
)

// Filter selects events. Zero fields select everything.
type Filter struct {
	Since  time.Time    // inclusive
	Until  time.Time    // exclusive
	Source netip.Prefix // source.ip within
	// Rule selects events whose event.reason is Rule. Of a sampled_summary it keeps the counts of
	// that rule's kinds (storeguard.suppressed_by "blocked/RULE"); an older one, without kinds, is dropped.
	Rule string
}

func (f Filter) match(e audit.Event) bool {
	switch {
	case !f.Since.IsZero() && e.Timestamp.Before(f.Since):
		return false
	case !f.Until.IsZero() && !e.Timestamp.Before(f.Until):
		return false
	case f.Source.IsValid() && !f.Source.Contains(e.SourceIP):
		return false
	case f.Rule != "" && e.Reason != f.Rule && e.Action != audit.ActionSampledSummary:
		return false
	}
	return true
}

// Summary describes the events a Filter selected: who (Sources), when (Timeline), with what
// (ByRule, Probes, Ops, Fields, Denials, Bans, Scans), and whether anything hostile reached the
// store: the messages that broke a policy rule, by key (Policy), and what flow records and
// would_block events say of each hostile source (Reached). It is the JSON schema of
// `storeguard audit --format json`: fields are added, never renamed or removed. A name that
// storeguard never writes (a log may come from anywhere) is counted as OtherName (knownNames).
//
// Events counts the event lines written: alerts and notices (blocked, would_block, denied, banned,
// scan_detected), not flow records (Connections) nor bookkeeping (sampled_summary, dropped_summary,
// handover). Suppressed adds what sampled_summary events say was sampled away (flow records apart:
// ConnectionsSuppressed); Estimated is their sum. Dropped is what dropped_summary events say a
// stalled sink lost (of every source: not in Estimated). Seen times come from written lines only.
type Summary struct {
	Files      int       `json:"files"`
	Events     uint64    `json:"events"`
	Suppressed uint64    `json:"suppressed"`
	Estimated  uint64    `json:"estimated"`
	Dropped    uint64    `json:"dropped"`
	Handovers  uint64    `json:"handovers"` // handover events: storeguard's own upgrades and restarts, not traffic
	FirstSeen  time.Time `json:"first_seen,omitzero"`
	LastSeen   time.Time `json:"last_seen,omitzero"`

	// Connections: flow records, one per connection (a connection still open at the end of the
	// logs counts once, with verdict open, from its latest interim record).
	Connections           uint64      `json:"connections"`
	ConnectionsSuppressed uint64      `json:"connections_suppressed"` // flow records sampled away
	ConnectionsEstimated  uint64      `json:"connections_estimated"`
	ByVerdict             []ConnCount `json:"by_verdict"` // connections by storeguard.verdict

	ByAction       []Count           `json:"by_action"`   // events by event.action; they add up to Events
	ByRule         []RuleStats       `json:"by_rule"`     // blocked and would_block events by rule
	Denials        []ReasonStats     `json:"denials"`     // refusals by reason: denied events, refused connections
	Bans           []ReasonStats     `json:"bans"`        // banned events by reason
	Probes         []ProbeStats      `json:"probes"`      // storeguard.probe of connections and of blocked first messages
	Ops            []Count           `json:"ops"`         // the op of each blocked or would_block message
	HostileOps     []Count           `json:"hostile_ops"` // messages of connections that did not pass, by op (flow records)
	Fields         []Count           `json:"fields"`      // the field each blocked or would_block message broke a limit with (no policy rule's)
	TotalScans     int               `json:"total_scans"`
	Scans          []ScanNotice      `json:"scans"`  // the first MaxScansListed scan_detected notices, oldest first
	Policy         PolicyStats       `json:"policy"` // policy rules' events by rule, action, key and detail, worst first
	Reached        Reached           `json:"reached_store"`
	PerHour        []HourCount       `json:"per_hour"`
	Timeline       Timeline          `json:"timeline"`
	TotalSources   int               `json:"total_sources"`
	JobSources     int               `json:"job_sources"`     // role job
	HostileSources int               `json:"hostile_sources"` // role hostile or mixed
	Sources        []SourceStats     `json:"sources"`         // hostile first, then most estimated events; see Top
	Malformed      int               `json:"malformed"`
	MalformedAt    []audit.LineError `json:"malformed_at,omitempty"` // the first MaxMalformedListed

	all []SourceStats // every source, for Top's findings
}

// Count is the number of written events with one key.
type Count struct {
	Key    string `json:"key"`
	Events uint64 `json:"events"`
}

// ConnCount is the number of connections with one verdict: written flow records, and those
// sampled away.
type ConnCount struct {
	Key         string `json:"key"`
	Connections uint64 `json:"connections"`
	Suppressed  uint64 `json:"suppressed"`
	Estimated   uint64 `json:"estimated"`
}

// RuleStats are the blocked and would_block events of one rule. A policy rule's message is
// well-formed: it has no Declared (its First has the key and detail instead).
type RuleStats struct {
	Key        string `json:"key"`         // the rule (event.reason)
	Events     uint64 `json:"events"`      // written
	Suppressed uint64 `json:"suppressed"`  // sampled away (sampled_summary's storeguard.suppressed_by)
	Estimated  uint64 `json:"estimated"`   // Events + Suppressed
	WouldBlock uint64 `json:"would_block"` // of Estimated, let through in monitor mode
	Sources    int    `json:"sources"`
	// The largest storeguard.declared of the rule's written events, with its field and limit.
	Field    string         `json:"field,omitempty"`
	Declared *audit.BigUint `json:"declared,omitempty"`
	Limit    *audit.BigUint `json:"limit,omitempty"`
	First    Sighting       `json:"first"` // the earliest written event
}

// ReasonStats count refusals or bans with one reason.
type ReasonStats struct {
	Key         string `json:"key"`
	Events      uint64 `json:"events"`      // written denied (or banned) events
	Suppressed  uint64 `json:"suppressed"`  // such events sampled away
	Connections uint64 `json:"connections"` // refused connections (flow records)
	Sources     int    `json:"sources"`
}

// Refusals is how many connections were refused: serve writes a denied event and a refused flow
// record of each, an older serve the event only.
func (r ReasonStats) Refusals() uint64 { return max(r.Events+r.Suppressed, r.Connections) }

// ProbeStats count one probe (storeguard.probe): the connections that began with it (flow
// records that did not pass) and the blocked or would_block events of a stream's first message.
type ProbeStats struct {
	Key         string   `json:"key"`
	Connections uint64   `json:"connections"`
	Events      uint64   `json:"events"`
	Sources     int      `json:"sources"`
	First       Sighting `json:"first"`
}

// Sighting is the earliest record of a kind that holds first bytes (the earliest of all, when none
// does): when, from where, and the bytes it began with; of a policy rule, the key and what broke
// the rule (escaped as PolicyEntry's are).
type Sighting struct {
	Time       time.Time      `json:"time,omitzero"`
	IP         netip.Addr     `json:"ip,omitzero"`
	Probe      string         `json:"probe,omitempty"`
	FirstBytes audit.HexBytes `json:"first_bytes,omitempty"`
	Key        string         `json:"key,omitempty"`
	Detail     string         `json:"detail,omitempty"`
}

func (s *Sighting) see(e *audit.Event) {
	had, has := len(s.FirstBytes) > 0, len(e.FirstBytes) > 0
	if s.Time.IsZero() || has && !had || has == had && e.Timestamp.Before(s.Time) {
		*s = Sighting{Time: e.Timestamp.UTC(), IP: e.SourceIP, Probe: e.Probe, FirstBytes: e.FirstBytes,
			Key: shownText(e.Key), Detail: shownText(e.Detail)}
	}
}

// ScanNotice is one scan_detected event.
type ScanNotice struct {
	Time        time.Time         `json:"time"`
	Start       time.Time         `json:"start,omitzero"` // of the window the connections fell in
	IP          netip.Addr        `json:"ip,omitzero"`
	Connections uint64            `json:"connections"`
	Ports       []uint16          `json:"ports,omitempty"`
	Probes      []string          `json:"probes,omitempty"`
	Verdicts    map[string]uint64 `json:"verdicts,omitempty"`
}

// HourCount is the number of written events in the hour (UTC) from Hour.
type HourCount struct {
	Hour   time.Time `json:"hour"`
	Events uint64    `json:"events"`
}

// Source roles.
const (
	RoleJob     = "job"     // connections that passed, no violation: a job's ranks
	RoleHostile = "hostile" // violations, bans, scans, refusals or connections that sent nothing valid; none passed
	RoleMixed   = "mixed"   // a job's address that also sent violations (NAT: a scanner behind it)
	RoleUnknown = "unknown" // nothing to tell by (connections still open, say)
)

// Reached-store verdicts, worst first.
const (
	ReachedWouldBlock = "would_block" // monitor mode let hostile messages through
	ReachedForwarded  = "forwarded"   // bytes of connections that did not pass reached the store
	ReachedUnknown    = "unknown"     // no flow records: what came before a block is not recorded
	ReachedNothing    = "nothing"     // 0 B forwarded
	ReachedNone       = "none"        // no hostile source (headline only)
)

// SourceStats are one source's counts: Exact events written, Suppressed by sampling.
type SourceStats struct {
	IP         netip.Addr `json:"ip"`
	Role       string     `json:"role"` // job, hostile, mixed or unknown
	Exact      uint64     `json:"exact"`
	Suppressed uint64     `json:"suppressed"`
	Estimated  uint64     `json:"estimated"`
	FirstSeen  time.Time  `json:"first_seen,omitzero"`
	LastSeen   time.Time  `json:"last_seen,omitzero"`

	Connections           uint64            `json:"connections"`            // flow records
	ConnectionsSuppressed uint64            `json:"connections_suppressed"` // sampled away
	ByVerdict             map[string]uint64 `json:"by_verdict,omitempty"`   // connections, sampled ones included
	// What the source's connections that did not pass (still open ones too, unless the source
	// also ran a job) sent on to the store: bytes, how many connections forwarded any, and
	// their complete messages, by op.
	StoreBytes       uint64            `json:"store_bytes"`
	StoreConnections uint64            `json:"store_connections"`
	Messages         uint64            `json:"messages"`
	Ops              map[string]uint64 `json:"ops,omitempty"`
	Rules            map[string]uint64 `json:"rules,omitempty"`             // blocked and would_block events, sampled ones included
	WouldBlock       uint64            `json:"would_block"`                 // hostile messages let through in monitor mode
	WouldBlockRules  map[string]uint64 `json:"would_block_rules,omitempty"` // of Rules, the would_block events
	Unrecorded       uint64            `json:"unrecorded"`                  // connections sampled away that may have forwarded bytes
	Probes           []string          `json:"probes,omitempty"`
	Reached          string            `json:"reached,omitempty"` // hostile and mixed sources: would_block, forwarded, unknown or nothing
}

// Summarizer accumulates a Summary from events and logs.
type Summarizer struct {
	filter   Filter
	sum      Summary
	lines    uint64
	byAction map[string]uint64
	perHour  map[time.Time]uint64
	rules    map[string]*ruleAcc
	denials  map[string]*reasonAcc
	bans     map[string]*reasonAcc
	probes   map[string]*probeAcc
	ops      map[string]uint64
	hostOps  map[string]uint64
	fields   map[string]uint64
	verdicts map[audit.Verdict]*[2]uint64 // written, suppressed
	sources  map[netip.Addr]*source
	open     map[flowKey]audit.Event // the latest interim record of each connection still open
	tl       timeline
	policy   policySummarizer
}

type ruleAcc struct {
	stats   RuleStats
	sources map[netip.Addr]struct{}
}

type reasonAcc struct {
	stats   ReasonStats
	sources map[netip.Addr]struct{}
}

type probeAcc struct {
	stats   ProbeStats
	sources map[netip.Addr]struct{}
}

// source accumulates one source.
type source struct {
	stats        SourceStats
	strong, weak uint64 // evidence of hostility: violations, bans, scans / refusals, empty or truncated connections
	passed       uint64 // connections that passed
	openBytes    uint64 // store bytes, messages and forwarding connections of connections still open
	openMessages uint64
	openConns    uint64
}

// flowKey tells one connection's flow records apart from another's.
type flowKey struct {
	observer string
	conn     uint64
	src      netip.AddrPort
	start    int64
}

func NewSummarizer(f Filter) *Summarizer {
	return &Summarizer{
		filter:   f,
		byAction: make(map[string]uint64),
		perHour:  make(map[time.Time]uint64),
		rules:    make(map[string]*ruleAcc),
		denials:  make(map[string]*reasonAcc),
		bans:     make(map[string]*reasonAcc),
		probes:   make(map[string]*probeAcc),
		ops:      make(map[string]uint64),
		hostOps:  make(map[string]uint64),
		fields:   make(map[string]uint64),
		verdicts: make(map[audit.Verdict]*[2]uint64),
		sources:  make(map[netip.Addr]*source),
		open:     make(map[flowKey]audit.Event),
		tl:       newTimeline(),
	}
}

// Summarize reads the audit logs at paths, in order. Malformed lines and
// unreadable tails are counted in the Summary; only a file that cannot be
// opened is an error.
func Summarize(paths []string, f Filter) (Summary, error) {
	z := NewSummarizer(f)
	for _, p := range paths {
		if err := z.ReadFile(p); err != nil {
			return Summary{}, err
		}
	}
	return z.Summary(), nil
}

// ReadFile adds the events of the log at path.
func (z *Summarizer) ReadFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	z.Read(path, f)
	return nil
}

// Read adds the events of one log; name labels its malformed lines.
func (z *Summarizer) Read(name string, r io.Reader) {
	z.sum.Files++
	for e, err := range audit.Events(r) {
		z.lines++
		var lerr *audit.LineError
		if errors.As(err, &lerr) {
			z.sum.Malformed++
			if len(z.sum.MalformedAt) < MaxMalformedListed {
				lerr.File = name
				z.sum.MalformedAt = append(z.sum.MalformedAt, *lerr)
			}
			continue
		}
		z.Add(e)
	}
}

// Lines is how many lines Read has read so far, malformed ones and those the filter left out
// included: the progress of a long read.
func (z *Summarizer) Lines() uint64 { return z.lines }

// Add counts one event if the filter selects it. Names storeguard does not write count as
// OtherName (knownNames).
func (z *Summarizer) Add(e audit.Event) {
	e = knownNames(e)
	if !z.filter.match(e) {
		return
	}
	switch e.Action {
	case audit.ActionDroppedSummary:
		z.sum.Dropped += e.Suppressed
		return
	case audit.ActionHandover:
		z.sum.Handovers++
		return
	}
	if e.Action == audit.ActionSampledSummary {
		z.addSuppressed(&e)
		return
	}
	src := z.source(e.SourceIP)
	switch e.Action {
	case audit.ActionFlow:
		z.addFlow(src, &e)
		return
	}
	z.sum.Events++
	src.stats.Exact++
	z.byAction[string(e.Action)]++
	z.perHour[e.Timestamp.UTC().Truncate(time.Hour)]++
	widen(&z.sum.FirstSeen, &z.sum.LastSeen, e.Timestamp)
	widen(&src.stats.FirstSeen, &src.stats.LastSeen, e.Timestamp)
	z.tl.add(e.SourceIP, e.Timestamp, seriesEvents, 1)

	switch e.Action {
	case audit.ActionBlocked, audit.ActionWouldBlock:
		r := z.rule(e.Reason)
		r.stats.Events++
		r.sources[e.SourceIP] = struct{}{}
		r.stats.First.see(&e)
		if e.Op != "" {
			z.ops[e.Op]++
		}
		if protocol.IsPolicyRule(protocol.Rule(e.Reason)) {
			z.policy.add(&e) // a valid message: its declared length broke no limit
		} else {
			if e.Declared != nil && (r.stats.Declared == nil || *e.Declared > *r.stats.Declared) {
				r.stats.Field, r.stats.Declared, r.stats.Limit = e.Field, e.Declared, e.Limit
			}
			if e.Field != "" {
				z.fields[e.Field]++
			}
		}
		if e.Probe != "" {
			p := z.probe(e.Probe)
			p.stats.Events++
			p.sources[e.SourceIP] = struct{}{}
			p.stats.First.see(&e)
			src.addProbe(e.Probe)
		}
		src.violation(e.Action, e.Reason, 1)
		if e.Action == audit.ActionWouldBlock {
			r.stats.WouldBlock++
		}
	case audit.ActionDenied:
		d := reasonOf(z.denials, e.Reason)
		d.stats.Events++
		d.sources[e.SourceIP] = struct{}{}
		src.weak++
	case audit.ActionBanned:
		b := reasonOf(z.bans, e.Reason)
		b.stats.Events++
		b.sources[e.SourceIP] = struct{}{}
		src.strong++
	case audit.ActionScan:
		z.sum.TotalScans++
		if len(z.sum.Scans) < MaxScansListed {
			z.sum.Scans = append(z.sum.Scans, ScanNotice{
				Time: e.Timestamp.UTC(), Start: e.Start.UTC(), IP: e.SourceIP, Connections: deref(e.ScanConnections),
				Ports: e.ScanPorts, Probes: e.ScanProbes, Verdicts: e.ScanVerdicts,
			})
		}
		src.strong++
	}
}

// addSuppressed counts what a sampled_summary says was sampled away, by kind when it says so.
// A Rule filter keeps that rule's kinds only; the source is not counted when none is left.
func (z *Summarizer) addSuppressed(e *audit.Event) {
	if len(e.SuppressedBy) == 0 {
		if z.filter.Rule == "" {
			z.suppressEvents(z.source(e.SourceIP), e.Suppressed)
		}
		return
	}
	var inKinds uint64
	for kind, n := range e.SuppressedBy {
		inKinds += n
		action, reason, _ := strings.Cut(kind, "/")
		reason, _, _ = strings.Cut(reason, "/") // the writer's kind may end in a probe: blocked/key_too_long/rdp_x224
		if z.filter.Rule != "" && (reason != z.filter.Rule || audit.Action(action) == audit.ActionFlow) {
			continue
		}
		src := z.source(e.SourceIP)
		switch audit.Action(action) {
		case audit.ActionFlow:
			z.verdict(audit.Verdict(reason))[1] += n
			src.stats.ConnectionsSuppressed += n
			src.verdictSuppressed(audit.Verdict(reason), n)
			z.sum.ConnectionsSuppressed += n
			continue
		case audit.ActionBlocked, audit.ActionWouldBlock:
			r := z.rule(reason)
			r.stats.Suppressed += n
			if audit.Action(action) == audit.ActionWouldBlock {
				r.stats.WouldBlock += n
			}
			if protocol.IsPolicyRule(protocol.Rule(reason)) {
				z.policy.suppressed(audit.Action(action), n)
			}
			src.violation(audit.Action(action), reason, n)
		case audit.ActionDenied:
			reasonOf(z.denials, reason).stats.Suppressed += n
			src.weak += n
		}
		z.suppressEvents(src, n)
	}
	if e.Suppressed > inKinds && z.filter.Rule == "" {
		z.suppressEvents(z.source(e.SourceIP), e.Suppressed-inKinds)
	}
}

func (z *Summarizer) suppressEvents(src *source, n uint64) {
	z.sum.Suppressed += n
	src.stats.Suppressed += n
}

// addFlow counts a flow record. A connection's interim records are replaced by the next one, so
// that it counts once, by its latest record.
func (z *Summarizer) addFlow(src *source, e *audit.Event) {
	key := flowKey{e.ObserverHostname, e.ConnID, netip.AddrPortFrom(e.SourceIP, e.SourcePort), e.Start.UnixNano()}
	if prev, ok := z.open[key]; ok {
		delete(z.open, key)
		z.countFlow(src, &prev, minusOne)
	}
	z.countFlow(src, e, 1)
	if e.Verdict == audit.VerdictOpen {
		z.open[key] = *e
	}
	for _, t := range []time.Time{e.Start, e.Timestamp} {
		if !t.IsZero() {
			widen(&z.sum.FirstSeen, &z.sum.LastSeen, t)
			widen(&src.stats.FirstSeen, &src.stats.LastSeen, t)
		}
	}
}

const minusOne = ^uint64(0) // d in countFlow: unsigned arithmetic wraps, so x += d*n subtracts n

// countFlow adds (d = 1) or takes back (d = minusOne) one flow record. Only interim records are
// taken back, so what only a finished connection adds (probes, sightings) needs no undoing.
func (z *Summarizer) countFlow(src *source, e *audit.Event, d uint64) {
	z.verdict(e.Verdict)[0] += d
	src.verdictWritten(e.Verdict, d)
	z.sum.Connections += d
	src.stats.Connections += d
	z.tl.add(e.SourceIP, cmp.Or(e.Start, e.Timestamp), seriesConnections, d)
	storeBytes, messages := deref(e.StoreBytes), deref(e.Messages)
	switch e.Verdict {
	case audit.VerdictPassed:
		src.passed += d
		return
	case audit.VerdictOpen:
		src.openBytes += d * storeBytes
		src.openMessages += d * messages
		if storeBytes > 0 {
			src.openConns += d
		}
		return
	}
	src.stats.StoreBytes += storeBytes
	if storeBytes > 0 {
		src.stats.StoreConnections++
	}
	src.stats.Messages += messages
	for op, n := range e.Ops {
		z.hostOps[op] += n
		if src.stats.Ops == nil {
			src.stats.Ops = make(map[string]uint64)
		}
		src.stats.Ops[op] += n
	}
	switch e.Verdict {
	case audit.VerdictBlocked, audit.VerdictWouldBlock:
		src.strong++
	case audit.VerdictRefused:
		r := reasonOf(z.denials, e.Reason)
		r.stats.Connections++
		r.sources[e.SourceIP] = struct{}{}
		src.weak++
	default:
		src.weak++
	}
	if e.Probe != "" {
		p := z.probe(e.Probe)
		p.stats.Connections++
		p.sources[e.SourceIP] = struct{}{}
		p.stats.First.see(e)
		src.addProbe(e.Probe)
	}
}

func (z *Summarizer) source(ip netip.Addr) *source {
	src := z.sources[ip]
	if src == nil {
		src = &source{stats: SourceStats{IP: ip}}
		z.sources[ip] = src
	}
	return src
}

func (z *Summarizer) rule(key string) *ruleAcc {
	r := z.rules[key]
	if r == nil {
		r = &ruleAcc{stats: RuleStats{Key: key}, sources: make(map[netip.Addr]struct{})}
		z.rules[key] = r
	}
	return r
}

func (z *Summarizer) probe(key string) *probeAcc {
	p := z.probes[key]
	if p == nil {
		p = &probeAcc{stats: ProbeStats{Key: key}, sources: make(map[netip.Addr]struct{})}
		z.probes[key] = p
	}
	return p
}

func (z *Summarizer) verdict(v audit.Verdict) *[2]uint64 {
	c := z.verdicts[v]
	if c == nil {
		c = new([2]uint64)
		z.verdicts[v] = c
	}
	return c
}

func reasonOf(m map[string]*reasonAcc, key string) *reasonAcc {
	r := m[key]
	if r == nil {
		r = &reasonAcc{stats: ReasonStats{Key: key}, sources: make(map[netip.Addr]struct{})}
		m[key] = r
	}
	return r
}

// violation counts n blocked or would_block events of a rule. A stream that ended mid-message is
// no evidence of hostility on its own: a rank killed mid-message ends so.
func (src *source) violation(a audit.Action, rule string, n uint64) {
	if src.stats.Rules == nil {
		src.stats.Rules = make(map[string]uint64)
	}
	src.stats.Rules[rule] += n
	if a == audit.ActionWouldBlock {
		src.stats.WouldBlock += n
		if src.stats.WouldBlockRules == nil {
			src.stats.WouldBlockRules = make(map[string]uint64)
		}
		src.stats.WouldBlockRules[rule] += n
	}
	if rule == "truncated_message" {
		src.weak += n
	} else {
		src.strong += n
	}
}

func (src *source) verdictWritten(v audit.Verdict, d uint64) {
	if src.stats.ByVerdict == nil {
		src.stats.ByVerdict = make(map[string]uint64)
	}
	src.stats.ByVerdict[string(v)] += d
	if src.stats.ByVerdict[string(v)] == 0 {
		delete(src.stats.ByVerdict, string(v))
	}
}

// verdictSuppressed counts n flow records sampled away: they are evidence as written ones are,
// but what they forwarded is not known unless nothing could be (empty, refused).
func (src *source) verdictSuppressed(v audit.Verdict, n uint64) {
	src.verdictWritten(v, n)
	switch v {
	case audit.VerdictPassed, audit.VerdictOpen:
	case audit.VerdictEmpty, audit.VerdictRefused:
		src.weak += n
	case audit.VerdictTruncated:
		src.weak += n
		src.stats.Unrecorded += n
	default:
		src.strong += n
		src.stats.Unrecorded += n
	}
}

func (src *source) addProbe(p string) {
	if !slices.Contains(src.stats.Probes, p) && len(src.stats.Probes) < maxProbesPerSource {
		src.stats.Probes = append(src.stats.Probes, p)
	}
}

// role tells a job's address from a hostile one.
func (src *source) role() string {
	switch {
	case src.passed > 0 && src.strong > 0:
		return RoleMixed
	case src.passed > 0:
		return RoleJob
	case src.strong > 0 || src.weak > 0:
		return RoleHostile
	}
	return RoleUnknown
}

func widen(first, last *time.Time, t time.Time) {
	if first.IsZero() || t.Before(*first) {
		*first = t
	}
	if last.IsZero() || t.After(*last) {
		*last = t
	}
}

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

// Summary returns the totals so far, sorted.
func (z *Summarizer) Summary() Summary {
	s := z.sum
	s.MalformedAt = slices.Clone(s.MalformedAt)
	s.Scans = slices.Clone(s.Scans)
	s.Estimated = s.Events + s.Suppressed
	s.ConnectionsEstimated = s.Connections + s.ConnectionsSuppressed
	s.FirstSeen, s.LastSeen = s.FirstSeen.UTC(), s.LastSeen.UTC()
	s.ByAction = sortedCounts(z.byAction)
	s.Ops, s.HostileOps, s.Fields = sortedCounts(z.ops), sortedCounts(z.hostOps), sortedCounts(z.fields)

	s.ByVerdict = make([]ConnCount, 0, len(z.verdicts))
	for v, c := range z.verdicts {
		if c[0]+c[1] > 0 {
			s.ByVerdict = append(s.ByVerdict, ConnCount{string(v), c[0], c[1], c[0] + c[1]})
		}
	}
	slices.SortFunc(s.ByVerdict, func(a, b ConnCount) int {
		return cmp.Or(cmp.Compare(b.Estimated, a.Estimated), cmp.Compare(a.Key, b.Key))
	})
	s.ByRule = make([]RuleStats, 0, len(z.rules))
	for _, r := range z.rules {
		st := r.stats
		st.Estimated, st.Sources = st.Events+st.Suppressed, len(r.sources)
		s.ByRule = append(s.ByRule, st)
	}
	slices.SortFunc(s.ByRule, func(a, b RuleStats) int {
		return cmp.Or(cmp.Compare(b.Estimated, a.Estimated), cmp.Compare(b.Events, a.Events), cmp.Compare(a.Key, b.Key))
	})
	s.Denials, s.Bans = reasonStats(z.denials), reasonStats(z.bans)
	s.Policy = z.policy.summary()
	s.Probes = make([]ProbeStats, 0, len(z.probes))
	for _, p := range z.probes {
		st := p.stats
		st.Sources = len(p.sources)
		s.Probes = append(s.Probes, st)
	}
	slices.SortFunc(s.Probes, func(a, b ProbeStats) int {
		return cmp.Or(cmp.Compare(b.Connections+b.Events, a.Connections+a.Events), cmp.Compare(a.Key, b.Key))
	})

	s.PerHour = make([]HourCount, 0, len(z.perHour))
	for h, n := range z.perHour {
		s.PerHour = append(s.PerHour, HourCount{h, n})
	}
	slices.SortFunc(s.PerHour, func(a, b HourCount) int { return a.Hour.Compare(b.Hour) })

	s.Sources = make([]SourceStats, 0, len(z.sources))
	for _, src := range z.sources {
		st := src.stats
		st.ByVerdict, st.Ops, st.Rules = maps.Clone(st.ByVerdict), maps.Clone(st.Ops), maps.Clone(st.Rules)
		st.WouldBlockRules = maps.Clone(st.WouldBlockRules)
		st.Probes = slices.Clone(st.Probes)
		st.Estimated = st.Exact + st.Suppressed
		st.FirstSeen, st.LastSeen = st.FirstSeen.UTC(), st.LastSeen.UTC()
		st.Role = src.role()
		switch st.Role {
		case RoleHostile:
			// A hostile source's open connection is no job's.
			st.StoreBytes, st.Messages, st.StoreConnections = st.StoreBytes+src.openBytes, st.Messages+src.openMessages, st.StoreConnections+src.openConns
			fallthrough
		case RoleMixed:
			st.Reached = reachedOf(&st)
			s.HostileSources++
		case RoleJob:
			s.JobSources++
		}
		s.Sources = append(s.Sources, st)
	}
	slices.SortFunc(s.Sources, func(a, b SourceStats) int {
		return cmp.Or(cmp.Compare(roleRank(a.Role), roleRank(b.Role)), cmp.Compare(b.activity(), a.activity()),
			cmp.Compare(b.Exact, a.Exact), a.IP.Compare(b.IP))
	})
	s.TotalSources = len(s.Sources)
	s.Timeline = z.tl.summary(s.Sources[:min(len(s.Sources), MaxTimelineSources)])
	s.all = s.Sources
	s.Reached = reached(s.all, 0)
	return s
}

// activity ranks sources: events and connections, sampled ones included.
func (st *SourceStats) activity() uint64 {
	return st.Estimated + st.Connections + st.ConnectionsSuppressed
}

func roleRank(role string) int {
	switch role {
	case RoleHostile, RoleMixed:
		return 0
	case RoleUnknown:
		return 1
	}
	return 2
}

// reachedOf is what became of a hostile or mixed source's traffic.
func reachedOf(st *SourceStats) string {
	switch {
	case st.WouldBlock > 0 || st.ByVerdict[string(audit.VerdictWouldBlock)] > 0:
		return ReachedWouldBlock
	case st.StoreBytes > 0:
		return ReachedForwarded
	case st.Connections == 0 && st.Rules != nil:
		return ReachedUnknown // blocked events and no flow records: a log from before them
	}
	return ReachedNothing
}

func reasonStats(m map[string]*reasonAcc) []ReasonStats {
	out := make([]ReasonStats, 0, len(m))
	for _, r := range m {
		st := r.stats
		st.Sources = len(r.sources)
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b ReasonStats) int {
		return cmp.Or(cmp.Compare(b.Events+b.Suppressed+b.Connections, a.Events+a.Suppressed+a.Connections), cmp.Compare(a.Key, b.Key))
	})
	return out
}

func sortedCounts(m map[string]uint64) []Count {
	out := make([]Count, 0, len(m))
	for k, n := range m {
		out = append(out, Count{k, n})
	}
	slices.SortFunc(out, func(a, b Count) int {
		return cmp.Or(cmp.Compare(b.Events, a.Events), cmp.Compare(a.Key, b.Key))
	})
	return out
}

// Top keeps the n first sources of the ranking (hostile first, then most events and connections) and
// their timelines; n <= 0 keeps all. Reached's findings name the sources kept, and every source
// that let anything through.
func (s Summary) Top(n int) Summary {
	all := s.all
	if all == nil {
		all = s.Sources
	}
	s.Reached = reached(all, n)
	if n > 0 && len(s.Sources) > n {
		s.Sources = s.Sources[:n:n]
		kept := s.Timeline.Sources[:0:0]
		for _, st := range s.Timeline.Sources {
			if slices.ContainsFunc(s.Sources, func(src SourceStats) bool { return src.IP == st.IP }) {
				kept = append(kept, st)
			}
		}
		s.Timeline.Sources = kept
	}
	return s
}
