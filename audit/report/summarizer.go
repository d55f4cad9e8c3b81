package report

import (
	"cmp"
	"errors"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
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
	// handshakes: refused TLS handshakes (denied events and refused flows of a tls_ reason) by
	// reason, counted by address: a refused handshake's client proved no identity.
	handshakes map[string]*reasonAcc
	probes     map[string]*probeAcc
	ops        map[string]uint64
	hostOps    map[string]uint64
	fields     map[string]uint64
	verdicts   map[audit.Verdict]*[2]uint64 // written, suppressed
	sources    map[sourceKey]*source
	open       map[flowKey]audit.Event // the latest interim record of each connection still open
	tl         timeline
	policy     policySummarizer
}

type ruleAcc struct {
	stats   RuleStats
	sources map[sourceKey]struct{}
}

type reasonAcc struct {
	stats   ReasonStats
	sources map[sourceKey]struct{}
	ips     []netip.Addr // refused handshakes: the first MaxHandshakeIPs addresses
}

type probeAcc struct {
	stats   ProbeStats
	sources map[sourceKey]struct{}
}

// sourceKey is what a row of the sources is of: an identity a TLS handshake proved
// (storeguard.identity), with every address it came from, or else an address.
type sourceKey struct {
	ip netip.Addr // zero for an identity
	id string
}

func keyOf(e *audit.Event) sourceKey {
	if id := e.PeerIdentity(); id != "" {
		return sourceKey{id: id}
	}
	return sourceKey{ip: e.SourceIP}
}

// source accumulates one source: an address, or an identity (stats.Identity) with its addresses.
type source struct {
	stats        SourceStats
	ips          []netip.Addr // an identity's, in the order seen: at most maxIdentityIPsTracked
	strong, weak uint64       // evidence of hostility: violations, bans, scans / refusals, empty or truncated connections
	passed       uint64       // connections that passed
	openBytes    uint64       // store bytes, messages and forwarding connections of connections still open
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
		filter:     f,
		byAction:   make(map[string]uint64),
		perHour:    make(map[time.Time]uint64),
		rules:      make(map[string]*ruleAcc),
		denials:    make(map[string]*reasonAcc),
		bans:       make(map[string]*reasonAcc),
		handshakes: make(map[string]*reasonAcc),
		probes:     make(map[string]*probeAcc),
		ops:        make(map[string]uint64),
		hostOps:    make(map[string]uint64),
		fields:     make(map[string]uint64),
		verdicts:   make(map[audit.Verdict]*[2]uint64),
		sources:    make(map[sourceKey]*source),
		open:       make(map[flowKey]audit.Event),
		tl:         newTimeline(),
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
	src := z.sourceOf(&e)
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
	z.tl.add(keyOf(&e), e.Timestamp, seriesEvents, 1)

	switch e.Action {
	case audit.ActionBlocked, audit.ActionWouldBlock:
		r := z.rule(e.Reason)
		r.stats.Events++
		r.sources[keyOf(&e)] = struct{}{}
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
			p.sources[keyOf(&e)] = struct{}{}
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
		d.sources[keyOf(&e)] = struct{}{}
		if audit.IsTLSReason(e.Reason) {
			h := reasonOf(z.handshakes, e.Reason)
			h.stats.Events++
			h.see(&e)
		}
		src.weak++
	case audit.ActionBanned:
		b := reasonOf(z.bans, e.Reason)
		b.stats.Events++
		b.sources[keyOf(&e)] = struct{}{}
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
	if !e.Start.IsZero() && z.filter.Rule == "" { // the first and last event it counts (older writers: none)
		src := z.source(e.SourceIP)
		for _, t := range []time.Time{e.Start, cmp.Or(e.End, e.Start)} {
			widen(&src.stats.FirstSeen, &src.stats.LastSeen, t)
			widen(&z.sum.FirstSeen, &z.sum.LastSeen, t)
		}
	}
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
			if audit.IsTLSReason(reason) {
				reasonOf(z.handshakes, reason).stats.Suppressed += n
			}
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
	z.tl.add(keyOf(e), cmp.Or(e.Start, e.Timestamp), seriesConnections, d)
	storeBytes, messages := deref(e.StoreBytes), deref(e.Messages)
	src.stats.Pickles += d * e.Pickles
	src.stats.Base64Pickles += d * e.Base64Pickles
	if d == 1 {
		src.addPickleKeys(e.PickleKeys)
	}
	switch e.Verdict {
	case audit.VerdictPassed:
		src.passed += d
		src.stats.PassedStoreBytes += d * storeBytes
		if storeBytes > 0 {
			src.stats.PassedStoreConnections += d
		}
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
		r.sources[keyOf(e)] = struct{}{}
		if audit.IsTLSReason(e.Reason) {
			h := reasonOf(z.handshakes, e.Reason)
			h.stats.Connections++
			h.see(e)
		}
		src.weak++
	default:
		src.weak++
	}
	if e.Probe != "" {
		p := z.probe(e.Probe)
		p.stats.Connections++
		p.sources[keyOf(e)] = struct{}{}
		p.stats.First.see(e)
		src.addProbe(e.Probe)
	}
}

// source is the row of an address, for what has no identity (sampled_summary: sampling is per
// address).
func (z *Summarizer) source(ip netip.Addr) *source {
	return z.sourceFor(sourceKey{ip: ip}, ip)
}

// sourceOf is the row of e's identity, or of its address without one.
func (z *Summarizer) sourceOf(e *audit.Event) *source {
	return z.sourceFor(keyOf(e), e.SourceIP)
}

func (z *Summarizer) sourceFor(k sourceKey, ip netip.Addr) *source {
	src := z.sources[k]
	if src == nil {
		src = &source{stats: SourceStats{IP: ip, Identity: k.id}}
		z.sources[k] = src
	}
	if k.id != "" {
		src.addIP(ip)
	}
	return src
}

// addIP notes an address an identity came from; the first MaxIdentityIPs are listed, all counted.
func (src *source) addIP(ip netip.Addr) {
	if !ip.IsValid() || slices.Contains(src.ips, ip) {
		return
	}
	if len(src.ips) < maxIdentityIPsTracked {
		src.ips = append(src.ips, ip)
	}
	src.stats.IPCount++
}

func (z *Summarizer) rule(key string) *ruleAcc {
	r := z.rules[key]
	if r == nil {
		r = &ruleAcc{stats: RuleStats{Key: key}, sources: make(map[sourceKey]struct{})}
		z.rules[key] = r
	}
	return r
}

func (z *Summarizer) probe(key string) *probeAcc {
	p := z.probes[key]
	if p == nil {
		p = &probeAcc{stats: ProbeStats{Key: key}, sources: make(map[sourceKey]struct{})}
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
		r = &reasonAcc{stats: ReasonStats{Key: key}, sources: make(map[sourceKey]struct{})}
		m[key] = r
	}
	return r
}

// see counts a refused handshake's address (its sources by address, the first MaxHandshakeIPs listed).
func (r *reasonAcc) see(e *audit.Event) {
	k := sourceKey{ip: e.SourceIP}
	if _, ok := r.sources[k]; ok {
		return
	}
	r.sources[k] = struct{}{}
	if len(r.ips) < MaxHandshakeIPs {
		r.ips = append(r.ips, e.SourceIP)
	}
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

// addPickleKeys adds keys to the source's first MaxPickleKeys (escaped: a log is untrusted).
func (src *source) addPickleKeys(keys []string) {
	for _, k := range keys {
		if len(src.stats.PickleKeys) >= MaxPickleKeys {
			return
		}
		k = printable(k)
		if !slices.Contains(src.stats.PickleKeys, k) {
			src.stats.PickleKeys = append(src.stats.PickleKeys, k)
		}
	}
}

func (src *source) addProbe(p string) {
	if !slices.Contains(src.stats.Probes, p) && len(src.stats.Probes) < maxProbesPerSource {
		src.stats.Probes = append(src.stats.Probes, p)
	}
}

// see keeps the earliest sighting, one with first bytes before any without (Sighting).
func (s *Sighting) see(e *audit.Event) {
	had, has := len(s.FirstBytes) > 0, len(e.FirstBytes) > 0
	if s.Time.IsZero() || has && !had || has == had && e.Timestamp.Before(s.Time) {
		*s = Sighting{Time: e.Timestamp.UTC(), IP: e.SourceIP, Probe: e.Probe, FirstBytes: e.FirstBytes,
			Key: shownText(e.Key), Detail: shownText(e.Detail)}
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
