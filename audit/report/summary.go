package report

import (
	"net/netip"
	"time"

	"github.com/storeguard/storeguard/audit"
)

// Caps on what a Summary lists; the counts stay exact.
const (
	MaxMalformedListed = 100 // malformed lines
	MaxScansListed     = 100 // scan notices
	MaxTimelineSources = 50  // sources with a timeline row, from the top of the ranking
	maxProbesPerSource = 8
	MaxIdentityIPs     = 16 // addresses listed of an identity (SourceStats.IPs)
	MaxHandshakeIPs    = 16 // addresses listed of a refused handshake's reason (HandshakeStats.IPs)
	// maxIdentityIPsTracked bounds what is remembered of an identity's addresses, to list the
	// lowest MaxIdentityIPs of them; IPCount counts them all.
	maxIdentityIPsTracked = 256
)

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

	ByAction []Count       `json:"by_action"` // events by event.action; they add up to Events
	ByRule   []RuleStats   `json:"by_rule"`   // blocked and would_block events by rule
	Denials  []ReasonStats `json:"denials"`   // refusals by reason: denied events, refused connections
	Bans     []ReasonStats `json:"bans"`      // banned events by reason
	// Handshakes: refused TLS handshakes by reason (tls_unknown_ca, ...): the denied events and
	// refused connections of Denials whose reason is a handshake's, with their addresses.
	Handshakes     []HandshakeStats  `json:"handshakes,omitempty"`
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

// HandshakeStats count the refused TLS handshakes of one reason, by the addresses they came from
// (a refused handshake proved no identity).
type HandshakeStats struct {
	Key         string       `json:"key"` // event.reason: tls_unknown_ca, tls_no_certificate, ...
	Events      uint64       `json:"events"`
	Suppressed  uint64       `json:"suppressed"`
	Connections uint64       `json:"connections"`
	Sources     int          `json:"sources"` // addresses
	IPs         []netip.Addr `json:"ips"`     // the first MaxHandshakeIPs of them, in order
}

// Refusals is how many handshakes were refused (ReasonStats.Refusals).
func (h HandshakeStats) Refusals() uint64 { return max(h.Events+h.Suppressed, h.Connections) }

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
	// ReachedPickles: connections of a hostile or mixed source that passed stored pickles (values a
	// reader may unpickle); what they were is listed.
	ReachedPickles = "pickles"
	ReachedUnknown = "unknown" // no flow records: what came before a block is not recorded
	ReachedNothing = "nothing" // 0 B forwarded
	ReachedNone    = "none"    // no hostile source (headline only)
)

// MaxPickleKeys bounds SourceStats.PickleKeys.
const MaxPickleKeys = 8

// SourceStats are one source's counts: Exact events written, Suppressed by sampling. A source is
// an identity a TLS handshake proved (Identity: storeguard.identity), over every address it came
// from (IP: the first; IPs), or else an address, for what came without an identity. Sampled-away
// events are counted per address (sampling is).
type SourceStats struct {
	IP         netip.Addr   `json:"ip"`
	Identity   string       `json:"identity,omitempty"`
	IPs        []netip.Addr `json:"ips,omitempty"`      // an identity's addresses: the lowest MaxIdentityIPs
	IPCount    int          `json:"ip_count,omitempty"` // an identity's addresses, all of them
	Role       string       `json:"role"`               // job, hostile, mixed or unknown
	Exact      uint64       `json:"exact"`
	Suppressed uint64       `json:"suppressed"`
	Estimated  uint64       `json:"estimated"`
	FirstSeen  time.Time    `json:"first_seen,omitzero"`
	LastSeen   time.Time    `json:"last_seen,omitzero"`

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
	// What the source's connections that passed forwarded to the store (flow records, open ones
	// apart), and of every connection of its, the values written that were complete pickles (raw,
	// base64) and passed the policy, with the first MaxPickleKeys keys they went to.
	PassedStoreBytes       uint64   `json:"passed_store_bytes"`
	PassedStoreConnections uint64   `json:"passed_store_connections"`
	Pickles                uint64   `json:"pickles"`
	Base64Pickles          uint64   `json:"base64_pickles"`
	PickleKeys             []string `json:"pickle_keys,omitempty"`
	Reached                string   `json:"reached,omitempty"` // hostile and mixed sources: would_block, forwarded, unknown or nothing
}
