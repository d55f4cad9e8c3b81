// Package guard judges one client-to-store stream as its bytes arrive: which bytes may go to the
// store now, which must wait for the rest of their message, and which break a rule. serve's
// transports (goroutines and event loops) carry its decisions out on sockets; replay records them
// for a capture. It has no sockets and no clock: every call is given the time, so a live stream
// and a recorded one are judged alike, and a table test can assert decisions byte by byte.
//
// A Stream owns the decoder, when the message in progress began, the deadlines and the spare rule,
// the first bytes of the message in progress and the counts of complete messages. It does not
// keep the bytes of the message in progress: the caller holds them (serve against its buffer
// budget; replay not at all) and Held says how many there are.
package guard

import (
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
)

// Policy is what every stream of a configuration shares.
type Policy struct {
	Deadlines protocol.Deadlines
	// Configured is the generation setting as configured (auto or one), which decides whether a
	// silent stream may be spared (protocol.MaySpareSilent).
	Configured protocol.GenSetting
	// Monitor: a violation is recorded and the stream goes on undecoded, every byte passed on;
	// otherwise the violation ends the stream and no byte of the offending message is passed on.
	Monitor bool
	// OnMessage, if set, sees each complete message (serve counts them in its metrics).
	OnMessage func(*protocol.Message)
	// MaxAwaited is how many requests may await their replies before the stream stalls at the
	// next message boundary, 0 for no bound (limits.max-pending-replies; needs Await).
	MaxAwaited int
	// Rules, if set, judge each complete message before any byte of it is sent (package policy):
	// a rule broken in enforce mode is the stream's violation like a decoder's; one in monitor mode
	// (or any, with Monitor) is a Decision.Warnings entry and the message is sent.
	Rules *policy.Policy
}

// Holder is what a caller that holds the bytes of the message in progress (serve, against its
// buffer budget) shows the guard, so that the policy can read a message that arrived in several
// feeds without a second copy. Without one, a stream with Rules keeps its own copy.
type Holder interface {
	// Held returns the bytes of the message in progress held from earlier feeds (Stream.Held of them).
	Held() []byte
}

// Warning is a rule broken by a message that was sent all the same (a monitored rule).
type Warning struct {
	Violation *protocol.Violation
	First     []byte // the message's first bytes, at most protocol.MaxFirstBytes
}

// Awaiting counts a stream's requests that await their replies. serve keeps one per connection,
// fed the store's side of it; replay keeps none.
type Awaiting interface {
	Expect(*protocol.Message)
	Pending() int
}

// Decision is what to do with the bytes of one Feed (p), or at a deadline (p empty).
type Decision struct {
	// Send: the held bytes (the start of a message from earlier feeds), then p[:Forward], go to
	// the store now, in that order, and nothing is held any more. Without a violation they end on
	// a message boundary.
	Send    bool
	Forward int
	// Keep: p[Forward:] is the start of a message still arriving, to hold after the held bytes
	// (or in their place, after Send).
	Keep bool
	// Violation: the message at p[Forward:], after the held bytes, breaks a rule; First is its
	// first bytes (at most protocol.MaxFirstBytes), valid until the next call. In monitor mode the
	// decision also sends everything.
	Violation *protocol.Violation
	First     []byte
	// Talked: p completes the stream's first message.
	Talked bool
	// Rest: the stream stalled at a message boundary, MaxAwaited requests awaiting replies; the
	// last Rest bytes of p were not judged, to be fed again once a reply came (Stalled).
	Rest int
	// Warnings: messages of p that broke a rule in monitor mode, and are sent; valid until the
	// next call.
	Warnings []Warning
}

// Stream is the judgement of one stream. The zero value is not ready: call Reset.
type Stream struct {
	pol      *Policy
	aw       Awaiting
	dec      protocol.Decoder
	start    time.Time // when the stream began
	msgStart time.Time // when the message in progress began
	spared   bool      // first-message deadline waived: a silent G0 callback stream
	passing  bool      // monitor mode after a violation: bytes pass undecoded
	talked   bool
	bytes    uint64
	counts   [32]uint64                   // complete messages by protocol.Op
	head     [protocol.MaxFirstBytes]byte // the first bytes of the message in progress
	headN    int
	first    [protocol.MaxFirstBytes]byte // Decision.First
	// resumed: when the message in progress began, for a stream restored mid-message (Restore),
	// whose held bytes are fed again
	resumed time.Time

	src    netip.Addr // the client's address, for the policy's per-source rules
	id     string     // the client's proved identity (mutual TLS), for the policy's rules by identity
	holder Holder     // who holds the message in progress, if not the stream (own)
	own    []byte     // the message in progress, kept for the policy when no holder does
	ruled  bool       // a policy rule ended the stream
	warns  []Warning
	seq    uint64 // the stream's number (streamSeq)
	// pickles: the complete pickles the stream wrote that passed, for its flow record
	pickles policy.PickleWrites
}

// Reset readies s for a new stream begun at start, decoded as dc, under pol.
func (s *Stream) Reset(dc protocol.Config, pol *Policy, start time.Time) {
	*s = Stream{pol: pol, start: start, seq: streamSeq.Add(1)}
	s.dec.Reset(dc)
}

// streamSeq numbers streams for the policy (policy.Message.Stream): the messages of one stream
// reach the store in the order it judged them.
var streamSeq atomic.Uint64

// From tells s the address of the client whose stream it judges, for the policy's rules by source.
func (s *Stream) From(src netip.Addr) { s.src = src }

// As tells s the identity the client proved (mutual TLS), for the policy's rules by identity.
func (s *Stream) As(id string) { s.id = id }

// Hold tells s that h holds the bytes of its message in progress (see Holder).
func (s *Stream) Hold(h Holder) { s.holder = h }

// Await has s count its requests awaiting replies in a, and stall at pol.MaxAwaited of them.
func (s *Stream) Await(a Awaiting) { s.aw = a }

// Stalled reports whether the next message must wait for a reply: MaxAwaited requests await theirs.
func (s *Stream) Stalled() bool {
	return s.aw != nil && s.pol.MaxAwaited > 0 && !s.passing && !s.dec.InMessage() && s.aw.Pending() >= s.pol.MaxAwaited
}

// Feed judges p, the next bytes of the stream, arriving at now. p must not be empty.
func (s *Stream) Feed(p []byte, now time.Time) Decision {
	if s.passing {
		s.bytes += uint64(len(p))
		return Decision{Send: true, Forward: len(p)}
	}
	var d Decision
	s.warns = s.warns[:0]
	base := s.dec.Offset() // the stream offset of p[0]
	fwd := 0               // p[:fwd] ends with a complete message
	for i := 0; i < len(p); {
		if s.Stalled() {
			d.Rest, p = len(p)-i, p[:i]
			break
		}
		n, msg, err := s.dec.Scan(p[i:])
		i += n
		if err != nil {
			s.bytes += uint64(len(p))
			d.Send, d.Forward = fwd > 0, fwd
			return s.fail(d, err.(*protocol.Violation), p[fwd:])
		}
		if msg != nil {
			if v := s.judge(msg, p, i, base); v != nil {
				s.bytes += uint64(len(p))
				s.ruled, s.own = true, nil
				d.Send, d.Forward = fwd > 0, fwd
				return s.fail(d, v, p[fwd:])
			}
			fwd, s.headN = i, 0
			if s.aw != nil {
				s.aw.Expect(msg)
			}
			if int(msg.Op) < len(s.counts) {
				s.counts[msg.Op]++
			}
			if s.pol.OnMessage != nil {
				s.pol.OnMessage(msg)
			}
			if !s.talked {
				s.talked, d.Talked = true, true
			}
		}
	}
	s.bytes += uint64(len(p))
	s.resumed = time.Time{}
	d.Send, d.Forward = fwd > 0, fwd
	d.Warnings = s.warns
	if s.keepsOwn() {
		if fwd > 0 {
			s.own = s.own[:0]
		}
		if s.dec.InMessage() {
			s.own = append(s.own, p[fwd:]...)
		}
	}
	if tail := p[fwd:]; len(tail) > 0 && s.dec.InMessage() {
		if s.dec.PartialBytes() == uint64(len(tail)) {
			s.msgStart = now // the message in progress began in p
			if !s.resumed.IsZero() && fwd == 0 {
				s.msgStart = s.resumed // it began before a hand-over: its deadline stays
			}
		}
		s.headN += copy(s.head[s.headN:], tail)
		d.Keep = true
	}
	return d
}

// keepsOwn reports whether the stream keeps its own copy of the message in progress.
func (s *Stream) keepsOwn() bool { return s.pol.Rules != nil && s.holder == nil }

// judge applies the policy to msg, complete at p[:end], p starting at stream offset base. It
// returns the violation of a rule broken in enforce mode; monitored ones go to s.warns.
func (s *Stream) judge(msg *protocol.Message, p []byte, end int, base uint64) *protocol.Violation {
	if s.pol.Rules == nil || !s.pol.Rules.Wants(msg.Op) {
		return nil
	}
	var b protocol.Split
	if msg.Offset >= base {
		b.B = p[msg.Offset-base : end]
	} else {
		held := s.own
		if s.holder != nil {
			held = s.holder.Held()
		}
		if uint64(len(held)) != base-msg.Offset {
			// The bytes the policy must read are not there: a caller's bug. Nothing unjudged passes.
			return s.ruleViolation(msg, policy.Finding{Rule: protocol.RulePolicyDenied,
				Detail: "the message's held bytes were not available to the policy"})
		}
		b.A, b.B = held, p[:end]
	}
	f, broke := s.pol.Rules.Check(policy.Message{Msg: msg, Bytes: b, Src: s.src, Identity: s.id, Stream: s.seq,
		Pickles: &s.pickles}, func(f policy.Finding) {
		s.warn(msg, b, f)
	})
	if !broke {
		return nil
	}
	if s.pol.Monitor {
		s.warn(msg, b, f)
		return nil
	}
	return s.ruleViolation(msg, f)
}

func (s *Stream) warn(msg *protocol.Message, b protocol.Split, f policy.Finding) {
	first := b.AppendTo(nil, 0, min(b.Len(), protocol.MaxFirstBytes))
	s.warns = append(s.warns, Warning{Violation: s.ruleViolation(msg, f), First: first})
}

// ruleViolation is f, broken by msg, as a violation.
func (s *Stream) ruleViolation(msg *protocol.Message, f policy.Finding) *protocol.Violation {
	return &protocol.Violation{Rule: f.Rule, Field: f.Field.Kind, Offset: msg.Offset + f.Field.Off, Index: msg.Index,
		MsgOffset: msg.Offset, Op: msg.Op, Wire: msg.Wire, Generation: msg.Generation, Declared: f.Field.Len,
		Key: f.Key, Detail: f.Detail}
}

// Deadline is when the stream's next deadline falls, zero for none: the message deadline while a
// message is in progress, else the first-message deadline until the stream sends (or is spared).
func (s *Stream) Deadline() time.Time {
	if s.passing || s.ruled || s.dec.Err() != nil {
		return time.Time{}
	}
	return s.pol.Deadlines.Next(&s.dec, s.start, s.msgStart, s.spared)
}

// Due applies the deadline if it has passed by now (see Expired); otherwise it decides nothing.
func (s *Stream) Due(now time.Time, talker bool) Decision {
	if dl := s.Deadline(); dl.IsZero() || now.Before(dl) {
		return Decision{}
	}
	return s.Expired(talker)
}

// Expired is the stream's deadline passing, as the caller's timer measured it: a message still in
// progress, or a stream that sent nothing, breaks its timeout rule, unless the silent stream may
// be spared (talker: the stream's source has another stream that completed a message).
func (s *Stream) Expired(talker bool) Decision {
	if s.Deadline().IsZero() {
		return Decision{}
	}
	if !s.dec.InMessage() && protocol.MaySpareSilent(s.pol.Configured, talker) {
		s.spared = true
		return Decision{}
	}
	return s.fail(Decision{}, s.pol.Deadlines.Expire(&s.dec), nil)
}

// Ended is the stream's end (the client's FIN or RST, or the store's close) as the caller saw it:
// a message in progress breaks RuleTruncatedMessage (declared: its bytes so far); otherwise, or
// once a violation was decided, nothing. Nothing more is forwarded.
func (s *Stream) Ended() Decision {
	if !s.InMessage() || s.ruled || s.dec.Err() != nil {
		return Decision{}
	}
	d := s.fail(Decision{}, s.dec.Expire(protocol.RuleTruncatedMessage), nil)
	d.Send, d.Forward = false, 0
	return d
}

// fail completes d with v, the offending message's first bytes being the held ones and then rest.
func (s *Stream) fail(d Decision, v *protocol.Violation, rest []byte) Decision {
	n := copy(s.first[:], s.head[:s.headN])
	n += copy(s.first[n:], rest)
	d.Violation, d.First = v, s.first[:n]
	d.Keep, d.Warnings = false, s.warns
	if s.pol.Monitor {
		s.passing, s.own = true, nil
		d.Send, d.Forward = true, d.Forward+len(rest)
	}
	return d
}

// Paused tells the guard that the transport did not read the stream for d, waiting for buffer
// budget other streams held: the message deadline moves by d, since that time was not the client's.
func (s *Stream) Paused(d time.Duration) {
	if s.InMessage() && d > 0 {
		s.msgStart = s.msgStart.Add(d)
	}
}

// Held is how many bytes of the message in progress the caller holds.
func (s *Stream) Held() uint64 {
	if s.passing {
		return 0
	}
	return s.dec.PartialBytes()
}

// BodyLeft is how many bytes of the key or value in progress are still to come, as declared and
// checked: a caller holding the message can reserve room for them at once.
func (s *Stream) BodyLeft() uint64 {
	if s.passing {
		return 0
	}
	return s.dec.BodyLeft()
}

// Limits are the ceilings the stream is judged by (serve's depend on the store's backend).
func (s *Stream) Limits() protocol.Limits { return s.dec.Limits() }

// InMessage reports whether a message has begun and not completed.
func (s *Stream) InMessage() bool { return !s.passing && s.dec.InMessage() }

// Passing reports whether the stream goes on undecoded after a violation in monitor mode.
func (s *Stream) Passing() bool { return s.passing }

// Generation is the generation the stream is decoded as; known is false while an auto decoder
// has not seen enough to tell (replay).
func (s *Stream) Generation() (g protocol.Generation, known bool) { return s.dec.Generation() }

// Bytes is how many bytes the stream has sent.
func (s *Stream) Bytes() uint64 { return s.bytes }

// Talked reports whether the stream has completed a message.
func (s *Stream) Talked() bool { return s.talked }

// Counts returns the complete messages by protocol.Op.
func (s *Stream) Counts() *[32]uint64 { return &s.counts }

// Pickles is what the stream wrote that is a complete pickle and passed; like Counts, read by the
// stream's reader, or once it has ended.
func (s *Stream) Pickles() *policy.PickleWrites { return &s.pickles }
