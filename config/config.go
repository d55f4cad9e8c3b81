// Package config loads storeguard's configuration: the embedded default, then
// an optional YAML file, then STOREGUARD_* environment variables, then the
// command-line settings that were given. Viper layers them and unmarshals the
// result; Load validates it once and hands back a plain Config, and nothing
// reads viper after Load returns. To reload, call Load again with the same
// Options and keep the old Config if it fails. The command line itself is
// cmd/storeguard's: this package knows no flags.
package config

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/idpattern"
	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
)

// Config mirrors the keys of docs/design.md; each field's mapstructure tag is
// its key, under its section's.
type Config struct {
	Listen   string `mapstructure:"listen"`
	Upstream string `mapstructure:"upstream"`
	// UpstreamLoopback says which loopback address is dialled for an upstream of 127.x.y.z
	// (storeinfo.Router).
	UpstreamLoopback UpstreamLoopback `mapstructure:"upstream-loopback"`
	MetricsListen    string           `mapstructure:"metrics-listen"` // "" disables metrics
	AuditLog         string           `mapstructure:"audit-log"`      // "" sends audit events to the structured log only
	Flows            Flows            `mapstructure:"flows"`
	// Generation is the raw generation setting (auto, G0.., or a torch
	// release); protocol.ParseGeneration turns it into a protocol setting.
	Generation string  `mapstructure:"generation"`
	Backend    Backend `mapstructure:"backend"`
	Mode       Mode    `mapstructure:"mode"`
	// EventLoops is how many event loops accept and forward connections; 0 = one
	// per CPU the process may use, -1 = none (two goroutines per connection).
	EventLoops int `mapstructure:"event-loops"`

	Limits   Limits   `mapstructure:"limits"`
	Timeouts Timeouts `mapstructure:"timeouts"`
	Access   Access   `mapstructure:"access"`
	TLS      TLS      `mapstructure:"tls"`
	Caps     Caps     `mapstructure:"caps"`
	Ban      Ban      `mapstructure:"ban"`
	Policy   Policy   `mapstructure:"policy"`
	Quota    Quota    `mapstructure:"quota"`
	Scan     Scan     `mapstructure:"scan"`
	Audit    Audit    `mapstructure:"audit"`
	Log      Log      `mapstructure:"log"`
	Replay   Replay   `mapstructure:"replay"`
}

// Limits are the per-message ceilings (limits.*). Byte sizes and counts are
// int64 because they are compared with 64-bit lengths read from the wire.
// Config.LimitsFor turns them into a decoder's, for one store backend.
type Limits struct {
	MaxKeyBytes     int64     `mapstructure:"max-key-bytes"`
	MaxValueBytes   ByteLimit `mapstructure:"max-value-bytes"`
	MaxKeys         int64     `mapstructure:"max-keys"`
	MaxMessageBytes ByteLimit `mapstructure:"max-message-bytes"`
	BlockWatchKey   bool      `mapstructure:"block-watch-key"`
	RejectZeroCount bool      `mapstructure:"reject-zero-count"`
	// MaxPendingReplies is how many requests of one connection may await their replies at once;
	// the next message waits at the guard until a reply came.
	MaxPendingReplies int `mapstructure:"max-pending-replies"`
}

// ByteLimit is a limit in bytes, or AutoLimit: chosen for the store's backend (LimitsFor).
type ByteLimit int64

// AutoLimit is the setting "auto", and ByteLimit's zero value: no limit is 0 bytes.
const AutoLimit ByteLimit = 0

func (b ByteLimit) String() string {
	if b == AutoLimit {
		return "auto"
	}
	return strconv.FormatInt(int64(b), 10)
}

// legacyAutoValueBytes is an auto max-value-bytes for a legacy store, which has no limit of its
// own and whose jobs set values over libuv's: what one source may hold of the buffer budget by
// default (caps.per-source-budget-bytes), lowered where need be to what max-message-bytes (or,
// with that auto, caps.buffer-budget-bytes) holds with a maximal key.
const legacyAutoValueBytes = 64 << 20

// autoValueBytes and autoMessageBytes are the auto limits for a libuv store or one of unknown
// backend: libuv's MAX_PAYLOAD_LEN (it closes the connection at a longer value, so nothing longer
// is worth holding) and the guard's own 32 MiB per message (protocol.DefaultLimits).
var (
	autoValueBytes   = int64(protocol.DefaultLimits().MaxValueBytes)
	autoMessageBytes = int64(protocol.DefaultLimits().MaxMessageBytes)
)

// Timeouts (timeouts.*). Zero means off where docs/design.md says so.
type Timeouts struct {
	UpstreamDial time.Duration `mapstructure:"upstream-dial"`
	Message      time.Duration `mapstructure:"message"`
	FirstMessage time.Duration `mapstructure:"first-message"` // 0 = off
	Idle         time.Duration `mapstructure:"idle"`          // 0 = off
	ReplyRead    time.Duration `mapstructure:"reply-read"`
	Drain        time.Duration `mapstructure:"drain"`
}

// Access lists source prefixes (access.*). Prefixes are masked and never
// IPv4-mapped IPv6, so compare them with netip.Addr.Unmap()ed addresses.
// DenyIdentities are idpattern patterns: a connection whose TLS handshake proved a matching
// identity is refused (admission.IdentityDenied).
type Access struct {
	Allow          []netip.Prefix `mapstructure:"allow"` // empty = everyone
	Deny           []netip.Prefix `mapstructure:"deny"`
	DenyIdentities []string       `mapstructure:"deny-identities"`
}

// Caps limit connection admission and the connections the guard makes to the store (caps.*).
type Caps struct {
	// MaxConnections caps the client connections open at once; auto: half the guard's descriptor
	// limit less a reserve (admission.ConnectionsFor).
	MaxConnections       AutoCount `mapstructure:"max-connections"`
	PerSourceConnections int       `mapstructure:"per-source-connections"` // 0 = unlimited
	PerSourceRate        float64   `mapstructure:"per-source-rate"`        // new connections/s; 0 = unlimited
	PerSourceBurst       int       `mapstructure:"per-source-burst"`
	// PerIdentityConnections caps the connections open at once of one identity a TLS handshake
	// proved (admission.IdentityConnections). 0 = unlimited.
	PerIdentityConnections int `mapstructure:"per-identity-connections"`
	// PerSourceSilent is how many connections that have sent nothing a source keeps, beyond one
	// per connection of its that completed a valid message, once MaxConnections is reached: past
	// that, a new connection takes the place of one of them.
	PerSourceSilent int `mapstructure:"per-source-silent"`
	// PerPrefixConnections caps the connections open at once from one network: an IPv4 /IPv4Prefix
	// or an IPv6 /IPv6Prefix (the network an IPv6 ban covers too). 0 = unlimited; auto: half of
	// MaxConnections.
	PerPrefixConnections AutoCount `mapstructure:"per-prefix-connections"`
	IPv4Prefix           int       `mapstructure:"ipv4-prefix"`
	IPv6Prefix           int       `mapstructure:"ipv6-prefix"`
	// MaxStoreConnections caps the connections to the store, in all: auto reads the store's
	// descriptor limit when it runs on this host (storeinfo/limit.go); 0 = unlimited.
	MaxStoreConnections       AutoCount `mapstructure:"max-store-connections"`
	PerSourceStoreConnections int       `mapstructure:"per-source-store-connections"` // 0 = unlimited
	BufferBudgetBytes         int64     `mapstructure:"buffer-budget-bytes"`
	PerSourceBudgetBytes      int64     `mapstructure:"per-source-budget-bytes"` // 0 = no per-source share
	ReplyBufferBytes          int64     `mapstructure:"reply-buffer-bytes"`      // per connection

	// New connections to the store: in all, auto (paced by the store's answers, StoreDialSlow) or
	// a second (0 = unlimited) and at once; per source, a second and at once (docs/design.md, Store
	// connections).
	StoreDialRate           AutoRate      `mapstructure:"store-dial-rate"`
	StoreDialBurst          int           `mapstructure:"store-dial-burst"`
	StoreDialSlow           time.Duration `mapstructure:"store-dial-slow"`
	PerSourceStoreDialRate  float64       `mapstructure:"per-source-store-dial-rate"`
	PerSourceStoreDialBurst int           `mapstructure:"per-source-store-dial-burst"`
}

// AutoCount is a count that may be "auto": worked out at run time.
type AutoCount struct {
	Auto bool
	N    int // when not Auto
}

func (a AutoCount) String() string {
	if a.Auto {
		return "auto"
	}
	return strconv.Itoa(a.N)
}

// AutoRate is a rate a second that may be "auto": paced at run time.
type AutoRate struct {
	Auto bool
	Rate float64 // when not Auto
}

func (a AutoRate) String() string {
	if a.Auto {
		return "auto"
	}
	return strconv.FormatFloat(a.Rate, 'g', -1, 64)
}

// Ban (ban.*): Violations within Window ban a source (an IPv6 one's network, caps.ipv6-prefix,
// when they come from more than one of its addresses) for Duration. A source in Exempt is never
// banned: its violating connections are still refused one by one. A banned source with a
// connection that is serving a job (it completed a valid message and is still open) may open
// ServingRate new connections a second, up to ServingBurst at once; its live ones stay.
type Ban struct {
	Violations   int            `mapstructure:"violations"` // 0 = bans off
	Window       time.Duration  `mapstructure:"window"`
	Duration     time.Duration  `mapstructure:"duration"`
	Exempt       []netip.Prefix `mapstructure:"exempt"`
	Peek         time.Duration  `mapstructure:"peek"`          // how long a banned source's first bytes are read for
	ServingRate  float64        `mapstructure:"serving-rate"`  // 0 = a banned source is refused even while it serves a job
	ServingBurst int            `mapstructure:"serving-burst"` // at least 1 when ServingRate is set
}

// Scan (scan.*): Threshold connections of one source that send nothing or only invalid bytes within
// Window make a scan notice. Threshold 0 turns notices off.
type Scan struct {
	Threshold int           `mapstructure:"threshold"`
	Window    time.Duration `mapstructure:"window"`
}

// UpstreamLoopback is upstream-loopback: auto dials [::1] for an IPv4 loopback upstream when the
// store listens only on IPv6's wildcard (torch's default), whose lookup of its peer's name /etc/hosts
// answers; as-written dials upstream as it is written.
type UpstreamLoopback string

const (
	UpstreamLoopbackAuto      UpstreamLoopback = "auto"
	UpstreamLoopbackAsWritten UpstreamLoopback = "as-written"
)

// Flows says which flow records the audit log gets (flows).
type Flows string

const (
	FlowsAll        Flows = "all"
	FlowsSuspicious Flows = "suspicious" // all but passed and interim ones
	FlowsOff        Flows = "off"
)

// Audit configures the audit-log file and its per-source sampling (audit.*).
type Audit struct {
	MaxBytes   int64 `mapstructure:"max-bytes"`
	MaxBackups int   `mapstructure:"max-backups"`
	// The flow records of passed and open connections go to a file set of their own,
	// audit.FlowsPath(audit-log), rotated by these, so that they never rotate a security event out.
	FlowsMaxBytes   int64         `mapstructure:"flows-max-bytes"`
	FlowsMaxBackups int           `mapstructure:"flows-max-backups"`
	SampleFirst     int           `mapstructure:"sample-first"`
	SampleEvery     int           `mapstructure:"sample-every"`
	SampleWindow    time.Duration `mapstructure:"sample-window"`
	FlowInterim     time.Duration `mapstructure:"flow-interim"` // 0 = no interim flow records
}

// Log configures the structured log (log.*).
type Log struct {
	Level  slog.Level `mapstructure:"level"` // debug, info, warn or error
	Format LogFormat  `mapstructure:"format"`
}

// Replay configures storeguard replay (replay.*).
type Replay struct {
	Ports []uint16 `mapstructure:"ports"`
}

// Backend is the store's server backend (backend).
type Backend string

const (
	BackendAuto   Backend = "auto"
	BackendLegacy Backend = "legacy"
	BackendLibUV  Backend = "libuv"
)

// Mode says what happens to a violation (mode).
type Mode string

const (
	ModeEnforce Mode = "enforce" // close the connection, forward nothing
	ModeMonitor Mode = "monitor" // record would_block and forward
)

// LogFormat is the structured log's encoding (log.format).
type LogFormat string

const (
	LogJSON LogFormat = "json"
	LogText LogFormat = "text"
)

// FieldError is one problem with one key. Load joins all of them with
// errors.Join; walk the result with errors.As or an Unwrap() []error check.
type FieldError struct {
	Key    string // dotted key, with [i] for a list element: "access.allow[1]"
	Msg    string // what is wrong, including the offending value
	Origin string // where the value came from: "FILE:LINE", "env NAME", "flag --name"; "" if unknown
}

func (e *FieldError) Error() string {
	if e.Origin == "" {
		return e.Key + ": " + e.Msg
	}
	return e.Key + ": " + e.Msg + " (" + e.Origin + ")"
}

func fieldErr(key, format string, args ...any) *FieldError {
	return &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)}
}

// Default returns the configuration in the embedded default.yaml.
func Default() Config {
	c := defaultConfig
	// Slices are shared with defaultConfig; copy so callers may append.
	c.Access.Allow = append([]netip.Prefix(nil), c.Access.Allow...)
	c.Access.Deny = append([]netip.Prefix(nil), c.Access.Deny...)
	c.Access.DenyIdentities = append([]string(nil), c.Access.DenyIdentities...)
	c.Ban.Exempt = append([]netip.Prefix(nil), c.Ban.Exempt...)
	c.Replay.Ports = append([]uint16(nil), c.Replay.Ports...)
	c.Policy.DenyGlobals = append([]string(nil), c.Policy.DenyGlobals...)
	return c
}

// logLevels are the log.level names, in the order they are listed in errors.
var logLevels = []struct {
	name  string
	level slog.Level
}{{"debug", slog.LevelDebug}, {"info", slog.LevelInfo}, {"warn", slog.LevelWarn}, {"error", slog.LevelError}}

func levelName(l slog.Level) (string, bool) {
	for _, ll := range logLevels {
		if ll.level == l {
			return ll.name, true
		}
	}
	return "", false
}

// Policy configures the policy stage (policy.*): the default rules' modes, more globals to deny,
// and a policy file, read by Rules (Load checks it, and a reload reads it again).
type Policy struct {
	RendezvousState string   `mapstructure:"rendezvous-state"`
	PickleGlobals   string   `mapstructure:"pickle-globals"`
	ValueSplit      string   `mapstructure:"value-split"`
	ReplySize       string   `mapstructure:"reply-size"`
	WriteOnce       string   `mapstructure:"write-once"`
	DenyGlobals     []string `mapstructure:"deny-globals"`
	File            string   `mapstructure:"file"`
}

// TLS is mutual TLS between guards (tls.*): who must handshake, with what, and who is allowed.
type TLS struct {
	Mode             string         `mapstructure:"mode"` // off | on
	CertFile         string         `mapstructure:"cert-file"`
	KeyFile          string         `mapstructure:"key-file"`
	CAFile           string         `mapstructure:"ca-file"`
	SPIFFESocket     string         `mapstructure:"spiffe-socket"`
	Allow            []string       `mapstructure:"allow"` // idpattern patterns; empty = any certificate chaining to the CA
	PlaintextSources []netip.Prefix `mapstructure:"plaintext-sources"`
	HandshakeTimeout time.Duration  `mapstructure:"handshake-timeout"`
	// KeyExchange: the key exchange groups, most preferred first (identity.ParseGroups); empty
	// = crypto/tls's own, a post-quantum hybrid first.
	KeyExchange []string `mapstructure:"key-exchange"`
	// Resumption: session tickets for client guards that have talked to this one before
	// (identity.TicketKeys).
	Resumption bool `mapstructure:"resumption"`
	// PeerSet: "family table set", the nftables sets (set, and set+"6" for IPv6) kept filled with
	// the addresses of hosts that hold a connection whose handshake passed (nftset); "" = none.
	PeerSet string `mapstructure:"peer-set"`
	// PeerSetTimeout: how long an address stays in PeerSet after its last connection ends (it is
	// refreshed every quarter of it while one is open).
	PeerSetTimeout time.Duration `mapstructure:"peer-set-timeout"`
}

// On reports whether mutual TLS is on.
func (t TLS) On() bool { return t.Mode == "on" }

// Plaintext reports whether src may speak plaintext: always with TLS off.
func (t TLS) Plaintext(src netip.Addr) bool {
	if !t.On() {
		return true
	}
	for _, p := range t.PlaintextSources {
		if p.Contains(src) {
			return true
		}
	}
	return false
}

// Quota caps what clients make the store hold (quota.*): bytes and keys, per source and in all.
type Quota struct {
	Mode                string `mapstructure:"mode"`
	StoreBytes          int64  `mapstructure:"store-bytes"`
	PerSourceStoreBytes int64  `mapstructure:"per-source-store-bytes"`
	StoreKeys           int64  `mapstructure:"store-keys"`
	PerSourceStoreKeys  int64  `mapstructure:"per-source-store-keys"`
}

// Rules compiles the policy stage of c, reading its policy file, with the store quota: nil when
// every rule and the quota are off and no file is given.
func (c Config) Rules() (*policy.Policy, error) {
	pc := policy.Defaults()
	var err error
	if pc.RendezvousState, err = policy.ParseMode(c.Policy.RendezvousState); err != nil {
		return nil, &FieldError{Key: "policy.rendezvous-state", Msg: err.Error()}
	}
	if pc.PickleGlobals, err = policy.ParseMode(c.Policy.PickleGlobals); err != nil {
		return nil, &FieldError{Key: "policy.pickle-globals", Msg: err.Error()}
	}
	if pc.ValueSplit, err = policy.ParseMode(c.Policy.ValueSplit); err != nil {
		return nil, &FieldError{Key: "policy.value-split", Msg: err.Error()}
	}
	if pc.ReplySize, err = policy.ParseMode(c.Policy.ReplySize); err != nil {
		return nil, &FieldError{Key: "policy.reply-size", Msg: err.Error()}
	}
	pc.MaxReplyBytes = int64(c.LoosestLimits().MaxMessageBytes)
	if pc.WriteOnce, err = policy.ParseMode(c.Policy.WriteOnce); err != nil {
		return nil, &FieldError{Key: "policy.write-once", Msg: err.Error()}
	}
	pc.DenyGlobals = c.Policy.DenyGlobals
	if c.Policy.File != "" {
		if pc.Rules, err = policy.LoadFile(c.Policy.File); err != nil {
			return nil, &FieldError{Key: "policy.file", Msg: err.Error()}
		}
	}
	if pc.Quota.Mode, err = policy.ParseMode(c.Quota.Mode); err != nil {
		return nil, &FieldError{Key: "quota.mode", Msg: err.Error()}
	}
	q := c.Quota
	pc.Quota.SourceBytes, pc.Quota.TotalBytes = q.PerSourceStoreBytes, q.StoreBytes
	pc.Quota.SourceKeys, pc.Quota.TotalKeys = q.PerSourceStoreKeys, q.StoreKeys
	if pc.RendezvousState == policy.Off && pc.PickleGlobals == policy.Off && pc.WriteOnce == policy.Off &&
		pc.ValueSplit == policy.Off && pc.ReplySize == policy.Off && pc.Quota.Mode == policy.Off && len(pc.Rules) == 0 {
		return nil, nil
	}
	p, err := policy.New(pc)
	if err != nil {
		key := "policy.deny-globals"
		if strings.HasPrefix(err.Error(), "rules[") {
			key = "policy.file"
		}
		return nil, &FieldError{Key: key, Msg: err.Error()}
	}
	return p, nil
}

// Deadlines returns serve's per-stream time limits (timeouts.message, timeouts.first-message).
func (c Config) Deadlines() protocol.Deadlines {
	return protocol.Deadlines{Message: c.Timeouts.Message, FirstMessage: c.Timeouts.FirstMessage}
}

// Admission returns the admission policy of c (access.*, caps.*, ban.*), as serve and replay
// give it to admission.Gate. c is valid (Load): an access.deny-identities pattern that does not
// parse would have been an error there.
func (c Config) Admission() admission.Config {
	denyIDs, _ := idpattern.ParseSet(c.Access.DenyIdentities)
	return c.admission(denyIDs)
}

// admission is Admission with access.deny-identities parsed (denyIDs).
func (c Config) admission(denyIDs idpattern.Set) admission.Config {
	maxConns, perPrefix := c.Caps.Connections()
	return admission.Config{
		DenyIdentities: denyIDs, PerIdentityConnections: c.Caps.PerIdentityConnections,
		Allow: c.Access.Allow, Deny: c.Access.Deny,
		MaxConnections: maxConns, PerSourceConnections: c.Caps.PerSourceConnections,
		PerSourceRate: c.Caps.PerSourceRate, PerSourceBurst: c.Caps.PerSourceBurst,
		PerPrefixConnections: perPrefix, IPv4Prefix: c.Caps.IPv4Prefix, IPv6Prefix: c.Caps.IPv6Prefix,
		BanViolations: c.Ban.Violations, BanWindow: c.Ban.Window, BanDuration: c.Ban.Duration, BanExempt: c.Ban.Exempt,
		ServingRate: c.Ban.ServingRate, ServingBurst: c.Ban.ServingBurst,
	}
}

// runtimeReserve is what caps.max-connections: auto leaves of a memory limit, besides the buffer
// budget, to the runtime and everything but connections.
const runtimeReserve = 64 << 20

// Connections returns caps.max-connections and caps.per-prefix-connections, auto worked out from
// this process's descriptor limit and, under a cgroup's memory limit, from that.
func (cp Caps) Connections() (maxConns, perPrefix int) {
	maxConns, perPrefix = cp.MaxConnections.N, cp.PerPrefixConnections.N
	if cp.MaxConnections.Auto {
		maxConns = admission.ConnectionsFor(admission.FileLimit())
		if m := admission.ConnectionsInMemory(admission.MemoryLimit(), cp.BufferBudgetBytes+runtimeReserve); m > 0 {
			maxConns = min(maxConns, m)
		}
	}
	if cp.PerPrefixConnections.Auto {
		perPrefix = admission.PrefixConnectionsFor(maxConns)
	}
	return maxConns, perPrefix
}

// DialRate returns how fast serve may connect to the store (caps.*store-dial-*), as
// admission.StoreSlots paces it.
func (c Config) DialRate() admission.DialRate {
	return admission.DialRate{Paced: c.Caps.StoreDialRate.Auto, Slow: c.Caps.StoreDialSlow,
		Rate: c.Caps.StoreDialRate.Rate, Burst: c.Caps.StoreDialBurst,
		PerSourceRate: c.Caps.PerSourceStoreDialRate, PerSourceBurst: c.Caps.PerSourceStoreDialBurst}
}

// Decoder returns the protocol decoder settings of c: generation, backend and limits. LegacyGen is
// left for the caller (the proxy learns it from the store; replay assumes G0). The limits are the
// configured backend's; with backend auto they are those of a store of unknown backend (the
// stricter, LimitsFor), except that a G0 or G1 store is always legacy. The proxy in auto mode
// sets them again for the backend it learns.
func (c Config) Decoder() (protocol.Config, error) {
	gen, err := protocol.ParseGeneration(c.Generation)
	if err != nil {
		return protocol.Config{}, &FieldError{Key: "generation", Msg: err.Error()}
	}
	backend, err := protocol.ParseBackend(string(c.Backend))
	if err != nil {
		return protocol.Config{}, &FieldError{Key: "backend", Msg: err.Error()}
	}
	store := backend
	if store == protocol.BackendAny && !gen.Auto && !gen.Gen.Validated() {
		store = protocol.BackendLegacy
	}
	lim := c.LimitsFor(store)
	if err := lim.Validate(); err != nil {
		return protocol.Config{}, &FieldError{Key: "limits", Msg: err.Error()}
	}
	return protocol.Config{Gen: gen, Backend: backend, Limits: lim}, nil
}

// LoosestLimits are the highest limits a guard configured as c applies, whatever the store's
// backend turns out to be: the configured backend's, or else a legacy store's (auto limits are
// never lower there). storeguard probe sends lengths just over them.
func (c Config) LoosestLimits() protocol.Limits {
	if b, _ := protocol.ParseBackend(string(c.Backend)); b == protocol.BackendLibuv {
		return c.LimitsFor(b)
	}
	return c.LimitsFor(protocol.BackendLegacy)
}

// LimitsFor returns the decoder limits for a store on backend b (protocol.BackendAny: not known).
// An auto max-value-bytes is libuv's 8 MiB unless the store is known to be legacy; an auto
// max-message-bytes is 32 MiB, or a maximal SET if that is larger. An unknown backend gets the
// stricter: a libuv store closes the connection at a longer value, a legacy one is still served
// (its values are only limited lower than they could be).
func (c Config) LimitsFor(b protocol.Backend) protocol.Limits {
	l := c.Limits
	value := int64(l.MaxValueBytes)
	if l.MaxValueBytes == AutoLimit {
		value = autoValueBytes
		if b == protocol.BackendLegacy {
			room := int64(l.MaxMessageBytes)
			if l.MaxMessageBytes == AutoLimit {
				room = c.Caps.BufferBudgetBytes
			}
			value = max(autoValueBytes, min(legacyAutoValueBytes, room-l.MaxKeyBytes-compareSetOverhead))
		}
	}
	message := int64(l.MaxMessageBytes)
	if l.MaxMessageBytes == AutoLimit {
		message = max(autoMessageBytes, l.MaxKeyBytes+value+compareSetOverhead)
	}
	return protocol.Limits{
		MaxKeyBytes:     uint64(l.MaxKeyBytes),
		MaxValueBytes:   uint64(value),
		MaxKeys:         uint64(l.MaxKeys),
		MaxMessageBytes: uint64(message),
		BlockWatchKey:   l.BlockWatchKey,
		RejectZeroCount: l.RejectZeroCount,
	}
}
