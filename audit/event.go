// Package audit owns the storeguard audit event: its JSON Lines format, a
// writer that rotates files and samples per source, and a reader of what it
// wrote. The report on a log (storeguard audit) is package audit/report.
package audit

import (
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/storeguard/storeguard/probename"
	"github.com/storeguard/storeguard/protocol"
)

// Action is the value of event.action.
type Action string

const (
	ActionBlocked        Action = "blocked"
	ActionWouldBlock     Action = "would_block" // monitor mode: a violation let through
	ActionDenied         Action = "denied"      // connection refused by policy (CIDR, cap, rate)
	ActionBanned         Action = "banned"
	ActionSampledSummary Action = "sampled_summary"
	// ActionDroppedSummary: the sink stalled and a Queue dropped storeguard.suppressed events
	// (of any source) before this one.
	ActionDroppedSummary Action = "dropped_summary"
	// ActionHandover: a new storeguard process took the connections over (event.reason: upgrade, or
	// restart after the forwarding process died); storeguard.connections says how many.
	ActionHandover Action = "handover"
	// ActionFlow: one connection's flow record (flow.go), at its end or, for a long one, an interim
	// record (event.type info) while it lasts.
	ActionFlow Action = "flow"
	// ActionScan: a source crossed the scan threshold: many connections that sent nothing or only
	// invalid bytes within a window (storeguard.scan.*).
	ActionScan Action = "scan_detected"
)

// Mode is the value of storeguard.mode.
type Mode string

const (
	ModeEnforce Mode = "enforce"
	ModeMonitor Mode = "monitor"
	ModeReplay  Mode = "replay"
)

// MaxFirstBytes caps storeguard.first_bytes; the writer clips longer slices.
const MaxFirstBytes = protocol.MaxFirstBytes

// Event is one audit record, written as one JSON object per line, with the field names of the
// Elastic Common Schema (ECSVersion) and storeguard's own under storeguard.* (docs/audit-events.md).
//
// Absent fields are omitted. Numbers that may legitimately be 0 (an offset,
// the first message, a declared length of 0, bytes seen before a timeout) are
// pointers: nil means absent, non-nil is always written, 0 included. Set them
// with new, e.g. Offset: new(uint64(12)). Ports, ConnID (ids start at 1) and
// Suppressed are never meaningfully 0 and use omitempty. Declared and Limit can exceed 2^53 (a
// length read off the wire): they are written as decimal strings (BigUint).
//
// The writer fills the bookkeeping (ecs.version, event.kind, category, type, outcome, severity,
// module, dataset, rule.*, observer.*, host.*, network.transport and protocol) from Action,
// Reason and its Options (Classify); a producer sets only what it knows of the traffic.
type Event struct {
	Timestamp time.Time `json:"@timestamp"` // RFC3339Nano; the writer fills it from its clock when zero
	ECS       string    `json:"ecs.version,omitempty"`
	ID        string    `json:"event.id"` // the writer fills it when empty
	Action    Action    `json:"event.action"`
	Reason    string    `json:"event.reason,omitempty"` // rule id (protocol.Rule) or denial reason
	Kind      string    `json:"event.kind,omitempty"`
	Category  []string  `json:"event.category,omitempty"`
	Type      []string  `json:"event.type,omitempty"`
	Outcome   string    `json:"event.outcome,omitempty"`
	Severity  int       `json:"event.severity,omitempty"`
	Module    string    `json:"event.module,omitempty"`
	Dataset   string    `json:"event.dataset,omitempty"`
	Start     time.Time `json:"event.start,omitzero"`
	End       time.Time `json:"event.end,omitzero"`
	Duration  *int64    `json:"event.duration,omitempty"` // nanoseconds, as ECS has it

	RuleName     string `json:"rule.name,omitempty"`
	RuleCategory string `json:"rule.category,omitempty"`
	RuleRuleset  string `json:"rule.ruleset,omitempty"`

	SourceIP    netip.Addr `json:"source.ip,omitzero"`
	SourcePort  uint16     `json:"source.port,omitempty"`
	SourceBytes *uint64    `json:"source.bytes,omitempty"` // flows: bytes the client sent
	DestIP      netip.Addr `json:"destination.ip,omitzero"`
	DestPort    uint16     `json:"destination.port,omitempty"`
	DestBytes   *uint64    `json:"destination.bytes,omitempty"` // flows: bytes the store sent back
	Transport   string     `json:"network.transport,omitempty"`
	Protocol    string     `json:"network.protocol,omitempty"`
	NetBytes    *uint64    `json:"network.bytes,omitempty"`
	CommunityID string     `json:"network.community_id,omitempty"`

	// *TLS writes its tls.* fields and storeguard.identity here; nil (TLS off, a plaintext
	// connection) writes none.
	*TLS

	ObserverHostname string `json:"observer.hostname,omitempty"`
	ObserverType     string `json:"observer.type,omitempty"`
	ObserverProduct  string `json:"observer.product,omitempty"`
	ObserverVendor   string `json:"observer.vendor,omitempty"`
	ObserverVersion  string `json:"observer.version,omitempty"`
	HostHostname     string `json:"host.hostname,omitempty"`
	HostName         string `json:"host.name,omitempty"`

	ConnID       uint64   `json:"storeguard.conn_id,omitempty"`
	Generation   string   `json:"storeguard.generation,omitempty"`
	Op           string   `json:"storeguard.op,omitempty"`
	Field        string   `json:"storeguard.field,omitempty"`
	Offset       *uint64  `json:"storeguard.offset,omitempty"`
	MessageIndex *uint64  `json:"storeguard.message_index,omitempty"`
	Declared     *BigUint `json:"storeguard.declared,omitempty"`
	Limit        *BigUint `json:"storeguard.limit,omitempty"`
	FirstBytes   HexBytes `json:"storeguard.first_bytes,omitempty"`
	Probe        string   `json:"storeguard.probe,omitempty"` // probename.Name of the first bytes
	// Policy rules (protocol.IsPolicyRule): the key, escaped (protocol.ShowKey), and what broke
	// the rule (the global a pickle imports, the policy file's rule).
	Key        string  `json:"storeguard.key,omitempty"`
	Detail     string  `json:"storeguard.detail,omitempty"`
	BytesSeen  *uint64 `json:"storeguard.bytes_seen,omitempty"`
	Mode       Mode    `json:"storeguard.mode,omitempty"`
	Suppressed uint64  `json:"storeguard.suppressed,omitempty"` // only on sampled_summary and dropped_summary
	// SuppressedBy: on sampled_summary, the events sampled away by action and reason ("blocked/key_too_long").
	SuppressedBy map[string]uint64 `json:"storeguard.suppressed_by,omitempty"`
	Connections  *uint64           `json:"storeguard.connections,omitempty"` // only on handover

	// Flow records (ActionFlow).
	Verdict    Verdict           `json:"storeguard.verdict,omitempty"`
	ClosedBy   string            `json:"storeguard.closed_by,omitempty"` // client, store, guard
	Messages   *uint64           `json:"storeguard.messages,omitempty"`  // complete client messages judged
	Replies    *uint64           `json:"storeguard.replies,omitempty"`   // replies the store completed
	Ops        map[string]uint64 `json:"storeguard.ops,omitempty"`       // client messages by op
	StoreBytes *uint64           `json:"storeguard.store_bytes,omitempty"`
	// What of it a reader may unpickle: values written that were complete pickles (raw, base64)
	// and passed the policy, and the first keys they went to.
	Pickles       uint64   `json:"storeguard.pickles,omitempty"`
	Base64Pickles uint64   `json:"storeguard.base64_pickles,omitempty"`
	PickleKeys    []string `json:"storeguard.pickle_keys,omitempty"`

	// Scan notices (ActionScan).
	ScanConnections *uint64           `json:"storeguard.scan.connections,omitempty"`
	ScanPorts       []uint16          `json:"storeguard.scan.ports,omitempty"` // distinct destination ports
	ScanProbes      []string          `json:"storeguard.scan.probes,omitempty"`
	ScanVerdicts    map[string]uint64 `json:"storeguard.scan.verdicts,omitempty"`
}

// TLS is what a connection's mutual TLS tells of its client, in ECS's tls.* names: a session's
// (Established), or a refused handshake's, with what was seen of the client's certificate.
// Every event and flow record of a connection points at the same one; nil (TLS off, a plaintext
// connection) writes nothing, and costs an event a nil pointer and no allocation.
//
// Identity is the one field the report groups sources by (storeguard.identity): the peer's
// identity as the identity package names it ("spiffe://td/ns/x", "dns:host", "cn:name"). It is
// set only when the certificate chains to a configured CA, so that it names a peer vouched for;
// the names a certificate of another CA claims are in AltNames only (HandshakeEvent clears it).
type TLS struct {
	Version         string    `json:"tls.version,omitempty"`          // "1.3"
	VersionProtocol string    `json:"tls.version_protocol,omitempty"` // "tls"
	Cipher          string    `json:"tls.cipher,omitempty"`           // "TLS_AES_128_GCM_SHA256"
	Established     bool      `json:"tls.established"`                // false: a refused handshake
	Subject         string    `json:"tls.client.x509.subject.distinguished_name,omitempty"`
	Issuer          string    `json:"tls.client.x509.issuer.distinguished_name,omitempty"`
	AltNames        []string  `json:"tls.client.x509.alternative_names,omitempty"` // at most MaxAltNames
	Serial          string    `json:"tls.client.x509.serial_number,omitempty"`     // upper-case hex, as ECS has it
	NotBefore       time.Time `json:"tls.client.x509.not_before,omitzero"`
	NotAfter        time.Time `json:"tls.client.x509.not_after,omitzero"`
	SHA256          string    `json:"tls.client.hash.sha256,omitempty"` // of the DER certificate, upper-case hex
	Identity        string    `json:"storeguard.identity,omitempty"`
}

// BigUint is a uint64 written as a decimal string, so that no consumer rounds it (JSON numbers
// above 2^53 lose digits in JavaScript and jq, and above 2^63 an Elasticsearch long rejects them;
// the shipped index template maps it as unsigned_long, which takes the string). It reads either.
type BigUint uint64

func (n BigUint) MarshalJSON() ([]byte, error) {
	b := append(make([]byte, 0, 22), '"')
	b = strconv.AppendUint(b, uint64(n), 10)
	return append(b, '"'), nil
}

func (n *BigUint) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("not an unsigned integer: %s", b)
	}
	*n = BigUint(v)
	return nil
}

// HexBytes is written as a lower-case hex string.
type HexBytes []byte

func (b HexBytes) MarshalText() ([]byte, error) {
	return hex.AppendEncode(nil, b), nil
}

func (b *HexBytes) UnmarshalText(text []byte) error {
	out, err := hex.AppendDecode(nil, text)
	if err != nil {
		return err
	}
	*b = out
	return nil
}

// newEventID returns 128 random bits in hex: unique without coordination
// between writers or processes.
func newEventID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails since Go 1.24
	return hex.EncodeToString(b[:])
}

const protoTCP = 6

// CommunityID returns the Community ID v1 flow hash (seed 0) of a TCP flow,
// or "" when the two addresses are invalid or of different families.
// IPv4-mapped IPv6 addresses are hashed as IPv4, as a capture would see them.
func CommunityID(srcIP netip.Addr, srcPort uint16, dstIP netip.Addr, dstPort uint16) string {
	srcIP, dstIP = srcIP.Unmap(), dstIP.Unmap()
	if !srcIP.IsValid() || !dstIP.IsValid() || srcIP.Is4() != dstIP.Is4() {
		return ""
	}
	// The spec orders endpoints so both directions of a flow hash alike.
	if c := srcIP.Compare(dstIP); c > 0 || (c == 0 && srcPort > dstPort) {
		srcIP, dstIP = dstIP, srcIP
		srcPort, dstPort = dstPort, srcPort
	}
	buf := make([]byte, 0, 2+16+16+2+4)
	buf = binary.BigEndian.AppendUint16(buf, 0) // seed
	buf = append(buf, srcIP.AsSlice()...)
	buf = append(buf, dstIP.AsSlice()...)
	buf = append(buf, protoTCP, 0) // protocol, padding
	buf = binary.BigEndian.AppendUint16(buf, srcPort)
	buf = binary.BigEndian.AppendUint16(buf, dstPort)
	sum := sha1.Sum(buf)
	return "1:" + base64.StdEncoding.EncodeToString(sum[:])
}

// AdmissionEvent is the event of admission's decision on the flow src → dst (denied, banned), as
// serve and replay both record it: reason is the refusal's, or the rule behind a ban.
func AdmissionEvent(src, dst netip.AddrPort, action Action, reason string) Event {
	return Event{
		Action: action, Reason: reason,
		SourceIP: src.Addr(), SourcePort: src.Port(), DestIP: dst.Addr(), DestPort: dst.Port(),
		CommunityID: CommunityID(src.Addr(), src.Port(), dst.Addr(), dst.Port()),
	}
}

// ViolationEvent is the event of a protocol violation on the flow src → dst, as serve and replay
// both record it. first holds the offending message's first bytes; seen, the stream's bytes so far.
func ViolationEvent(v *protocol.Violation, generationKnown bool, src, dst netip.AddrPort, action Action, mode Mode,
	first []byte, seen uint64) Event {
	gen := v.Generation.String()
	if !generationKnown {
		gen = "unknown"
	}
	e := Event{
		Action: action, Reason: string(v.Rule), Mode: mode,
		SourceIP: src.Addr(), SourcePort: src.Port(), DestIP: dst.Addr(), DestPort: dst.Port(),
		CommunityID: CommunityID(src.Addr(), src.Port(), dst.Addr(), dst.Port()),
		Generation:  gen, Op: v.Op.String(),
		Offset: new(v.Offset), MessageIndex: new(v.Index), BytesSeen: new(seen),
		FirstBytes: append(HexBytes(nil), first[:min(len(first), MaxFirstBytes)]...),
	}
	if v.Index == 0 && !protocol.IsPolicyRule(v.Rule) {
		e.Probe = probename.Name(e.FirstBytes) // a probe is a stream's first message
	}
	e.Key, e.Detail = v.Key, v.Detail
	if protocol.IsPolicyRule(v.Rule) {
		if v.Field != protocol.FieldNone {
			e.Field = v.Field.String()
			e.Declared = new(BigUint(v.Declared)) // the value's length
		}
		return e
	}
	if v.Field != protocol.FieldNone {
		e.Field = v.Field.String()
		e.Declared = new(BigUint(v.Declared))
		if v.Limit != 0 {
			e.Limit = new(BigUint(v.Limit))
		}
	}
	return e
}
