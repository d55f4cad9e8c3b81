// Package audit owns the storeguard audit event: its JSON Lines format, a
// writer that rotates files and samples per source, and a reader that
// summarizes what was blocked.
package audit

import (
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"github.com/storeguard/storeguard/protocol"
	"net/netip"
	"time"
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
)

// Mode is the value of storeguard.mode.
type Mode string

const (
	ModeEnforce Mode = "enforce"
	ModeMonitor Mode = "monitor"
	ModeReplay  Mode = "replay"
)

// MaxFirstBytes caps storeguard.first_bytes; the writer clips longer slices.
const MaxFirstBytes = 32

// Event is one audit record, written as one JSON object per line.
//
// Absent fields are omitted. Numbers that may legitimately be 0 (an offset,
// the first message, a declared length of 0, bytes seen before a timeout) are
// pointers: nil means absent, non-nil is always written, 0 included. Set them
// with new, e.g. Offset: new(uint64(12)). Ports, ConnID (ids start at 1) and
// Suppressed are never meaningfully 0 and use omitempty.
type Event struct {
	Timestamp   time.Time  `json:"@timestamp"` // RFC3339Nano; the writer fills it from its clock when zero
	ID          string     `json:"event.id"`   // the writer fills it when empty
	Action      Action     `json:"event.action"`
	Reason      string     `json:"event.reason,omitempty"` // rule id (protocol.Rule) or denial reason
	SourceIP    netip.Addr `json:"source.ip,omitzero"`
	SourcePort  uint16     `json:"source.port,omitempty"`
	DestIP      netip.Addr `json:"destination.ip,omitzero"`
	DestPort    uint16     `json:"destination.port,omitempty"`
	CommunityID string     `json:"network.community_id,omitempty"`

	ConnID       uint64   `json:"storeguard.conn_id,omitempty"`
	Generation   string   `json:"storeguard.generation,omitempty"`
	Op           string   `json:"storeguard.op,omitempty"`
	Field        string   `json:"storeguard.field,omitempty"`
	Offset       *uint64  `json:"storeguard.offset,omitempty"`
	MessageIndex *uint64  `json:"storeguard.message_index,omitempty"`
	Declared     *uint64  `json:"storeguard.declared,omitempty"`
	Limit        *uint64  `json:"storeguard.limit,omitempty"`
	FirstBytes   HexBytes `json:"storeguard.first_bytes,omitempty"`
	BytesSeen    *uint64  `json:"storeguard.bytes_seen,omitempty"`
	Mode         Mode     `json:"storeguard.mode,omitempty"`
	Suppressed   uint64   `json:"storeguard.suppressed,omitempty"`  // only on sampled_summary and dropped_summary
	Connections  *uint64  `json:"storeguard.connections,omitempty"` // only on handover
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
	if v.Field != protocol.FieldNone {
		e.Field = v.Field.String()
		e.Declared = new(v.Declared)
		if v.Limit != 0 {
			e.Limit = new(v.Limit)
		}
	}
	return e
}
