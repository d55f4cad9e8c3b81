package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
)

// Verdict is what replay concluded about one client-to-server stream.
type Verdict string

const (
	VerdictPass       Verdict = "pass"       // decoded to its end (or to the end of the capture) without a violation
	VerdictReject     Verdict = "reject"     // serve would have blocked it (or logged would_block in monitor mode)
	VerdictIncomplete Verdict = "incomplete" // could not be decoded: see Reason
	// VerdictRefused: serve's admission would have refused the connection at accept (Reason: banned,
	// ban_throttled, denied, not_allowed, max_connections, prefix_connections, source_connections,
	// source_rate, source_table_full): never decoded; a banned source's first bytes are judged (Judged).
	VerdictRefused Verdict = "refused"
	// VerdictHalfOpen: the handshake never completed (the client's or the store's RST, or nothing
	// after the SYN): a SYN scan or a closed port. Serve's accept never returns such a connection,
	// so admission is not asked and nothing is judged.
	VerdictHalfOpen Verdict = "half_open"
)

// Reasons of an incomplete verdict.
const (
	ReasonMidstream = "midstream" // the capture has no SYN: message framing cannot be found, so nothing is guessed
	ReasonGap       = "gap"       // bytes missing from the capture (lost segment, reassembly gave up waiting)
	ReasonSnaplen   = "snaplen"   // a segment was cut by the capture's snap length: a gap the capture made
)

// StreamResult is the verdict on one client-to-server stream.
type StreamResult struct {
	Src        netip.AddrPort    `json:"src"`
	Dst        netip.AddrPort    `json:"dst"`
	Generation string            `json:"generation"` // G0..G6, or "unknown" before auto detection could tell
	Messages   map[string]uint64 `json:"messages"`   // complete messages by op
	Verdict    Verdict           `json:"verdict"`
	Reason     string            `json:"reason,omitempty"` // for incomplete and refused
	Start      time.Time         `json:"start"`            // capture time of the stream's first packet
	// End is the capture time the verdict was reached: the violation, the gap, the stream's close,
	// or its last packet when the capture ended first; for refused, when serve closed the
	// connection: at its accept (the handshake's last ACK), or, for a banned source, once ban.peek
	// read its first bytes; for half_open, its RST or last packet.
	End       time.Time  `json:"end"`
	Violation *Violation `json:"violation,omitempty"`
	// Judged is, for a stream refused as banned, the rule its first bytes (those serve reads for
	// ban.peek) would have broken: what the source came back with. Never a reject.
	Judged *Violation `json:"judged,omitempty"`
	Bytes  uint64     `json:"bytes"`   // client bytes decoded (or, midstream, seen; refused, read for ban.peek)
	ID     uint64     `json:"conn_id"` // storeguard.conn_id of its audit events: streams numbered from 1 per run
	File   string     `json:"file"`
	// FlowVerdict is the verdict of the stream's flow record (storeguard.verdict): passed, empty,
	// truncated (the stream ended inside a message: a reject by truncated_message), blocked,
	// would_block, incomplete, refused, half_open (the handshake never completed), or open when
	// the capture ended before the stream did and no verdict was reached. A monitor-mode or
	// incomplete stream that outlasts the capture keeps its verdict here; its record in the audit
	// log is open.
	FlowVerdict audit.Verdict `json:"flow_verdict"`
}

// Violation is the first rule a stream broke, as serve would have reported it.
type Violation struct {
	Rule         protocol.Rule `json:"rule"`
	Offset       uint64        `json:"offset"` // stream offset of the offending field (or opcode byte)
	MessageIndex uint64        `json:"message_index"`
	Declared     uint64        `json:"declared"` // declared length or count; for timeouts, the bytes of the message so far
	Limit        uint64        `json:"limit"`
	Field        string        `json:"field"` // "" for opcode-level rules and timeouts
	Op           string        `json:"op"`
}

func newViolation(v *protocol.Violation) *Violation {
	out := &Violation{Rule: v.Rule, Offset: v.Offset, MessageIndex: v.Index, Declared: v.Declared,
		Limit: v.Limit, Op: v.Op.String()}
	if v.Field != protocol.FieldNone {
		out.Field = v.Field.String()
	}
	return out
}

// Summary counts what a replay saw.
type Summary struct {
	Files      int
	Packets    uint64 // packets read
	Bytes      uint64 // capture bytes read (captured lengths)
	Streams    int
	Pass       int
	Reject     int
	Incomplete int
	Refused    int
	HalfOpen   int
	// JobStores are the rendezvous rounds' stores the capture wrote on ports it was not replayed
	// for: the ranks' own stores of torchrun's c10d rendezvous, which no guard of those ports
	// fronts. At most maxJobStores; MoreJobStores counts the rest.
	JobStores     []policy.JobStore
	MoreJobStores int
}

// maxJobStores bounds Summary.JobStores.
const maxJobStores = 64

func (s *Summary) add(r *StreamResult) {
	s.Streams++
	switch r.Verdict {
	case VerdictPass:
		s.Pass++
	case VerdictReject:
		s.Reject++
	case VerdictIncomplete:
		s.Incomplete++
	case VerdictRefused:
		s.Refused++
	case VerdictHalfOpen:
		s.HalfOpen++
	}
}

func (s Summary) String() string {
	out := fmt.Sprintf("%d streams in %d files (%d packets): %d pass, %d reject, %d incomplete, %d refused",
		s.Streams, s.Files, s.Packets, s.Pass, s.Reject, s.Incomplete, s.Refused)
	if s.HalfOpen > 0 {
		out += fmt.Sprintf(", %d half_open", s.HalfOpen)
	}
	for _, js := range s.JobStores {
		addr := js.Addr
		if addr == "" {
			addr = "?"
		}
		out += fmt.Sprintf("\nrendezvous round %s sends its ranks to %s:%d, a store no guard of these ports fronts (written by %s)",
			js.Round, addr, js.Port, js.Src)
	}
	if s.MoreJobStores > 0 {
		out += fmt.Sprintf("\n%d more rounds send their ranks to stores no guard of these ports fronts", s.MoreJobStores)
	}
	return out
}

// JSONWriter writes one JSON object per line per stream.
type JSONWriter struct{ enc *json.Encoder }

func NewJSONWriter(w io.Writer) *JSONWriter {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return &JSONWriter{enc: enc}
}

func (w *JSONWriter) Write(r StreamResult) error { return w.enc.Encode(r) }

// TableWriter writes a fixed-width table, one row per stream as it is decided, so that a large
// capture streams instead of buffering every row.
type TableWriter struct {
	w      io.Writer
	header bool
}

func NewTableWriter(w io.Writer) *TableWriter { return &TableWriter{w: w} }

const tableRow = "%-22s %-22s %-7s %8s  %-10s  %s\n"

// Header writes the column names; Write does so before the first row if not done yet.
func (t *TableWriter) Header() error {
	if t.header {
		return nil
	}
	t.header = true
	_, err := fmt.Fprintf(t.w, tableRow, "SRC", "DST", "GEN", "MESSAGES", "VERDICT", "RULE / REASON")
	return err
}

func (t *TableWriter) Write(r StreamResult) error {
	if err := t.Header(); err != nil {
		return err
	}
	var n uint64
	for _, c := range r.Messages {
		n += c
	}
	_, err := fmt.Fprintf(t.w, tableRow, r.Src, r.Dst, r.Generation, fmt.Sprint(n), r.Verdict, detail(r))
	return err
}

func detail(r StreamResult) string {
	switch {
	case r.Violation != nil:
		v := r.Violation
		s := fmt.Sprintf("%s at offset %d (message %d, %s", v.Rule, v.Offset, v.MessageIndex, v.Op)
		if v.Field != "" {
			s += fmt.Sprintf(", %s %d", v.Field, v.Declared)
			if v.Limit != 0 {
				s += fmt.Sprintf(" > %d", v.Limit)
			}
		}
		return s + ")"
	case r.Judged != nil:
		return r.Reason + "; its first bytes: " + detail(StreamResult{Violation: r.Judged})
	case r.Reason != "":
		return r.Reason
	}
	return ""
}
