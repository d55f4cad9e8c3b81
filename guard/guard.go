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
	"time"

	"github.com/storeguard/storeguard/audit"
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
	// first bytes (at most audit.MaxFirstBytes), valid until the next call. In monitor mode the
	// decision also sends everything.
	Violation *protocol.Violation
	First     []byte
	// Talked: p completes the stream's first message.
	Talked bool
	// Rest: the stream stalled at a message boundary, MaxAwaited requests awaiting replies; the
	// last Rest bytes of p were not judged, to be fed again once a reply came (Stalled).
	Rest int
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
	counts   [32]uint64                // complete messages by protocol.Op
	head     [audit.MaxFirstBytes]byte // the first bytes of the message in progress
	headN    int
	first    [audit.MaxFirstBytes]byte // Decision.First
	// resumed: when the message in progress began, for a stream restored mid-message (Restore),
	// whose held bytes are fed again
	resumed time.Time
}

// Reset readies s for a new stream begun at start, decoded as dc, under pol.
func (s *Stream) Reset(dc protocol.Config, pol *Policy, start time.Time) {
	*s = Stream{pol: pol, start: start}
	s.dec.Reset(dc)
}

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
	fwd := 0 // p[:fwd] ends with a complete message
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

// Deadline is when the stream's next deadline falls, zero for none: the message deadline while a
// message is in progress, else the first-message deadline until the stream sends (or is spared).
func (s *Stream) Deadline() time.Time {
	if s.passing || s.dec.Err() != nil {
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
	if !s.InMessage() || s.dec.Err() != nil {
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
	d.Keep = false
	if s.pol.Monitor {
		s.passing = true
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
