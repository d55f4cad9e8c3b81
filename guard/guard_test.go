package guard

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func g1Config() protocol.Config {
	return protocol.Config{Gen: protocol.GenSetting{Gen: protocol.G1}, Limits: protocol.DefaultLimits()}
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// G1 wire: SET 00, GET 02, ADD 03; a key or value is an 8-byte little-endian length then its bytes.
const (
	setAB  = "00 0100000000000000 61 0100000000000000 62" // SET "a" = "b": 19 bytes
	getA   = "02 0100000000000000 61"                     // GET "a": 10 bytes
	hugeAd = "03 00000b06e0000000"                        // ADD with nmap's RDP key length (#106294)
)

// step is one call and the decision it must give.
type step struct {
	at     time.Duration // since t0
	feed   string        // hex; empty: a deadline check (Due) instead of a feed
	talker bool          // for Due: the source has a working stream
	want   Decision      // First compared as bytes, Violation by rule and offset
	rule   protocol.Rule
	offset uint64
	first  string // hex: Decision.First
	held   uint64 // Held() after the step
}

func TestDecisionsByteByByte(t *testing.T) {
	dl := protocol.Deadlines{Message: 30 * time.Second, FirstMessage: 10 * time.Second}
	cases := []struct {
		name    string
		monitor bool
		g0      bool // the configured generation is G0, not G1
		steps   []step
	}{
		{name: "whole messages pass in one feed", steps: []step{
			{feed: setAB + getA, want: Decision{Send: true, Forward: 29, Talked: true}},
			{feed: getA, want: Decision{Send: true, Forward: 10}},
		}},
		{name: "a message split at every field is held, then sent with what was held", steps: []step{
			{feed: "00", want: Decision{Keep: true}, held: 1},
			{feed: "01000000", want: Decision{Keep: true}, held: 5},
			{feed: "00000000 61 01", want: Decision{Keep: true}, held: 11},
			{feed: "00000000000000 62 02", want: Decision{Send: true, Forward: 8, Keep: true, Talked: true}, held: 1},
			{feed: "0100000000000000 61", want: Decision{Send: true, Forward: 9}},
		}},
		{name: "an oversize length is refused at its eighth byte, after the valid messages before it", steps: []step{
			{feed: getA + "03 00000b06e0", want: Decision{Send: true, Forward: 10, Keep: true, Talked: true}, held: 6},
			{feed: "000000", want: Decision{}, rule: protocol.RuleKeyTooLong, offset: 11, first: hugeAd},
		}},
		{name: "monitor mode sends the offending message and everything after it", monitor: true, steps: []step{
			{feed: "03 00000b", want: Decision{Keep: true}, held: 4},
			{feed: "06e0000000 ff", want: Decision{Send: true, Forward: 6}, rule: protocol.RuleKeyTooLong, offset: 1,
				first: hugeAd + "ff"},
			{feed: "ffff", want: Decision{Send: true, Forward: 2}},
		}},
		{name: "a message in progress past its deadline", steps: []step{
			{at: time.Second, feed: "00 01", want: Decision{Keep: true}, held: 2},
			{at: 30 * time.Second, want: Decision{}, held: 2},
			{at: 31 * time.Second, want: Decision{}, rule: protocol.RuleMessageTimeout, offset: 0, first: "0001"},
		}},
		{name: "the message deadline runs from the feed its message began in", steps: []step{
			{at: time.Second, feed: getA + "00", want: Decision{Send: true, Forward: 10, Keep: true, Talked: true}, held: 1},
			{at: 20 * time.Second, feed: "01", want: Decision{Keep: true}, held: 2},
			{at: 31*time.Second - 1, want: Decision{}, held: 2},
			{at: 31 * time.Second, want: Decision{}, rule: protocol.RuleMessageTimeout, offset: 10, first: "0001"},
		}},
		{name: "a silent stream breaks the first-message deadline", steps: []step{
			{at: 10 * time.Second, want: Decision{}, rule: protocol.RuleFirstMessageTimeout},
		}},
		{name: "a silent G0 stream of a talking source is spared", g0: true, steps: []step{
			{at: 10 * time.Second, talker: true, want: Decision{}},
			{at: time.Hour, want: Decision{}},
			{at: time.Hour, feed: getA, want: Decision{Send: true, Forward: 10, Talked: true}},
		}},
		{name: "a silent G1 stream is not spared", steps: []step{
			{at: 10 * time.Second, talker: true, want: Decision{}, rule: protocol.RuleFirstMessageTimeout},
		}},
		{name: "monitor mode flushes what it held at a deadline", monitor: true, steps: []step{
			{feed: "00 01", want: Decision{Keep: true}, held: 2},
			{at: time.Minute, want: Decision{Send: true}, rule: protocol.RuleMessageTimeout, first: "0001"},
			{at: time.Minute, feed: "00", want: Decision{Send: true, Forward: 1}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pol := &Policy{Deadlines: dl, Configured: protocol.GenSetting{Gen: protocol.G1}, Monitor: tc.monitor}
			if tc.g0 {
				pol.Configured.Gen = protocol.G0
			}
			dc := g1Config()
			dc.Gen = pol.Configured
			var s Stream
			s.Reset(dc, pol, t0)
			var held []byte // what a transport holds
			for i, st := range tc.steps {
				now := t0.Add(st.at)
				var p []byte
				var got Decision
				if st.feed == "" {
					got = s.Due(now, st.talker)
				} else {
					p = unhex(t, st.feed)
					got = s.Feed(p, now)
				}
				var rule protocol.Rule
				var offset uint64
				if got.Violation != nil {
					rule, offset = got.Violation.Rule, got.Violation.Offset
				}
				first := got.First
				got.Violation, got.First = nil, nil
				if got.Send != st.want.Send || got.Forward != st.want.Forward || got.Keep != st.want.Keep ||
					got.Talked != st.want.Talked || rule != st.rule || offset != st.offset {
					t.Fatalf("step %d: got %+v %q at %d, want %+v %q at %d", i, got, rule, offset, st.want, st.rule, st.offset)
				}
				if w := unhex(t, st.first); !bytes.Equal(first, w) {
					t.Fatalf("step %d: first bytes %x, want %x", i, first, w)
				}
				// Carry the decision out as a transport would, and check Held agrees.
				if got.Send {
					held = held[:0]
				}
				if got.Keep {
					held = append(held, p[got.Forward:]...)
				}
				if rule != "" && !tc.monitor {
					return // the transport closes the stream
				}
				if st.held != s.Held() || uint64(len(held)) != s.Held() {
					t.Fatalf("step %d: Held() = %d, transport holds %d, want %d", i, s.Held(), len(held), st.held)
				}
			}
		})
	}
}

// TestFeedAllocatesNothing: the guard runs on every read of every connection.
func TestFeedAllocatesNothing(t *testing.T) {
	pol := &Policy{Configured: protocol.GenSetting{Gen: protocol.G1}, OnMessage: func(*protocol.Message) {}}
	msgs := unhex(t, setAB+getA+setAB)
	var s Stream
	s.Reset(g1Config(), pol, t0)
	if n := testing.AllocsPerRun(1000, func() {
		s.Feed(msgs[:7], t0)
		s.Feed(msgs[7:], t0)
	}); n != 0 {
		t.Fatalf("Feed allocates %.1f times a run", n)
	}
}

func BenchmarkFeed(b *testing.B) {
	pol := &Policy{Configured: protocol.GenSetting{Gen: protocol.G1}}
	msgs, _ := hex.DecodeString(strings.ReplaceAll(setAB+getA, " ", ""))
	var s Stream
	s.Reset(g1Config(), pol, t0)
	b.SetBytes(int64(len(msgs)))
	b.ReportAllocs()
	for b.Loop() {
		s.Feed(msgs, t0)
	}
}

func TestStallsAtTheBoundAwaitingReplies(t *testing.T) {
	pol := &Policy{MaxAwaited: 2}
	var r protocol.Replies
	var s Stream
	s.Reset(g1Config(), pol, t0)
	s.Await(&r)
	// Three GETs and a SET pipelined: two GETs go, the rest waits for a reply.
	p := unhex(t, getA+getA+getA+setAB)
	d := s.Feed(p, t0)
	if want := (Decision{Send: true, Forward: 20, Talked: true, Rest: 29}); !sameDecision(d, want) {
		t.Fatalf("first feed: %+v, want %+v", d, want)
	}
	if !s.Stalled() || r.Pending() != 2 {
		t.Fatalf("stalled %v pending %d", s.Stalled(), r.Pending())
	}
	r.Feed(unhex(t, "0100000000000000 62")) // the first GET's reply
	d = s.Feed(p[20:], t0)
	if want := (Decision{Send: true, Forward: 10, Rest: 19}); !sameDecision(d, want) {
		t.Fatalf("after one reply: %+v, want %+v", d, want)
	}
	r.Feed(unhex(t, "0000000000000000 0000000000000000"))
	if d = s.Feed(p[30:], t0); !sameDecision(d, Decision{Send: true, Forward: 19}) || s.Bytes() != uint64(len(p)) {
		t.Fatalf("after every reply: %+v, %d bytes judged", d, s.Bytes())
	}
	// A message in progress is never cut: the bound applies at its start.
	r.Expect(&protocol.Message{Op: protocol.OpGet})
	r.Expect(&protocol.Message{Op: protocol.OpGet})
	if d = s.Feed(unhex(t, "02"), t0); d.Rest != 1 {
		t.Fatalf("a new message at the bound: %+v", d)
	}
}

func sameDecision(a, b Decision) bool {
	return a.Send == b.Send && a.Forward == b.Forward && a.Keep == b.Keep && a.Violation == b.Violation &&
		bytes.Equal(a.First, b.First) && a.Talked == b.Talked && a.Rest == b.Rest
}
