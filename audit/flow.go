package audit

import (
	"net/netip"
	"time"

	"github.com/storeguard/storeguard/probename"
	"github.com/storeguard/storeguard/protocol"
)

// Verdict is a flow record's storeguard.verdict: what became of the connection.
type Verdict string

const (
	VerdictPassed     Verdict = "passed"      // every message valid, the stream ended between messages
	VerdictEmpty      Verdict = "empty"       // the client sent nothing (a port scan, a connect-and-close)
	VerdictTruncated  Verdict = "truncated"   // the stream ended inside a message, which the store never saw
	VerdictBlocked    Verdict = "blocked"     // closed at a violation (event.reason: the rule)
	VerdictWouldBlock Verdict = "would_block" // monitor mode: a violation passed on
	VerdictRefused    Verdict = "refused"     // refused by admission (event.reason: why); nothing read
	VerdictOpen       Verdict = "open"        // an interim record: the connection lasts
	// VerdictIncomplete: replay only, a stream the capture cannot judge (event.reason: midstream,
	// gap or snaplen); serve sees every byte it judges.
	VerdictIncomplete Verdict = "incomplete"
	// VerdictHalfOpen: replay only: the handshake never completed (a SYN scan, or a refused
	// port); serve, in user space, never sees these.
	VerdictHalfOpen Verdict = "half_open"
)

// Flow is one client connection's account, the model being Zeek's conn.log: serve keeps one per
// connection and replay one per TCP stream, and both write it with Event.
type Flow struct {
	ConnID     uint64
	Src, Dst   netip.AddrPort
	Start, End time.Time
	Verdict    Verdict
	Reason     string // the rule or refusal reason behind the verdict, if any
	ClosedBy   string // client, store or guard; "" while open
	Generation string // "" when the stream never showed it
	Mode       Mode

	FromClient uint64 // bytes the client sent
	ToStore    uint64 // bytes forwarded to the store
	FromStore  uint64 // bytes the store sent
	Messages   uint64 // complete client messages
	Replies    uint64 // replies the store completed
	Ops        *[32]uint64
	// Judged: the rule the first bytes of a refused connection would have broken (read for
	// ban.peek, never forwarded): its op, field, declared and limit go in the record.
	Judged *protocol.Violation
	// First: the stream's first bytes (at most MaxFirstBytes), recorded unless the flow passed:
	// a job's traffic carries its keys and values, a probe's is evidence.
	First []byte
	// TLS: the connection's mutual TLS (NewTLS), shared with its events; nil without.
	TLS *TLS
	// Pickles: the values written that were complete pickles and passed (policy.PickleWrites).
	Pickles, Base64Pickles uint64
	PickleKeys             []string
}

// Closed-by values.
const (
	ClosedByClient = "client"
	ClosedByStore  = "store"
	ClosedByGuard  = "guard"
)

// Event is the flow's record.
func (f *Flow) Event() Event {
	e := Event{
		Timestamp: f.End, Action: ActionFlow, Reason: f.Reason, Mode: f.Mode,
		SourceIP: f.Src.Addr(), SourcePort: f.Src.Port(), DestIP: f.Dst.Addr(), DestPort: f.Dst.Port(),
		CommunityID: CommunityID(f.Src.Addr(), f.Src.Port(), f.Dst.Addr(), f.Dst.Port()),
		ConnID:      f.ConnID, Generation: f.Generation, Verdict: f.Verdict, ClosedBy: f.ClosedBy,
		Start: f.Start, Duration: new(int64(f.End.Sub(f.Start))),
		SourceBytes: new(f.FromClient), DestBytes: new(f.FromStore), NetBytes: new(f.FromClient + f.FromStore),
		StoreBytes: new(f.ToStore), Messages: new(f.Messages), Replies: new(f.Replies),
		TLS: f.TLS, Pickles: f.Pickles, Base64Pickles: f.Base64Pickles, PickleKeys: f.PickleKeys,
	}
	if f.Verdict != VerdictOpen {
		e.End = f.End
	}
	if f.Ops != nil {
		for op, n := range f.Ops {
			if n > 0 {
				if e.Ops == nil {
					e.Ops = make(map[string]uint64)
				}
				e.Ops[protocol.Op(op).String()] = n
			}
		}
	}
	if v := f.Judged; v != nil {
		e.Op = v.Op.String()
		if v.Field != protocol.FieldNone {
			e.Field, e.Declared = v.Field.String(), new(BigUint(v.Declared))
			if v.Limit != 0 {
				e.Limit = new(BigUint(v.Limit))
			}
		}
	}
	if f.Verdict != VerdictPassed && f.Verdict != VerdictOpen && len(f.First) > 0 {
		e.FirstBytes = append(HexBytes(nil), f.First[:min(len(f.First), MaxFirstBytes)]...)
		e.Probe = probename.Name(e.FirstBytes)
	}
	return e
}
