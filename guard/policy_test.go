package guard

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"testing"

	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
)

// evilPickle is an object whose __reduce__ is (os.system, ("touch /tmp/x",)), pickle protocol 4.
const evilPickle = "80049527000000000000008c05706f736978948c0673797374656d9493948c0c746f756368202f746d702f7894859452942e"

// setHex is a G1 SET of key to value, in hex.
func setHex(t *testing.T, key string, value []byte) []byte {
	t.Helper()
	b, err := protocol.Append(nil, protocol.G1, protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: value})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// heldBytes is a transport that holds what the guard keeps, as serve's carry does.
type heldBytes struct{ b []byte }

func (h *heldBytes) Held() []byte { return h.b }

// feedAll feeds the stream in pieces of n bytes, carrying the decisions out as a transport would; it
// returns the bytes sent and the violation, if any.
func feedAll(t *testing.T, s *Stream, h *heldBytes, stream []byte, n int) (sent []byte, v *protocol.Violation, first []byte, warns []protocol.Rule) {
	t.Helper()
	for i := 0; i < len(stream); i += n {
		p := stream[i:min(i+n, len(stream))]
		d := s.Feed(p, t0)
		for _, w := range d.Warnings {
			warns = append(warns, w.Violation.Rule)
		}
		if d.Send {
			sent = append(append(sent, h.b...), p[:d.Forward]...)
			h.b = h.b[:0]
		}
		if d.Violation != nil {
			return sent, d.Violation, append([]byte(nil), d.First...), warns
		}
		if d.Keep {
			h.b = append(h.b, p[d.Forward:]...)
		}
	}
	return sent, nil, nil, warns
}

func TestPolicyJudgesWholeMessagesBeforeTheyAreSent(t *testing.T) {
	rules, err := policy.New(policy.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	evil, _ := hex.DecodeString(evilPickle)
	good := setHex(t, "/a", []byte("b"))
	bad := setHex(t, "/vllm/obj", evil)
	get := unhex(t, getA)
	stream := append(append(append(append([]byte{}, good...), get...), bad...), get...)
	for _, own := range []bool{false, true} {
		for _, monitor := range []bool{false, true} {
			for n := 1; n <= len(stream); n++ {
				pol := &Policy{Configured: protocol.GenSetting{Gen: protocol.G1}, Rules: rules, Monitor: monitor}
				var s Stream
				s.Reset(g1Config(), pol, t0)
				s.From(netip.MustParseAddr("10.9.9.9"))
				h := &heldBytes{}
				if !own {
					s.Hold(h)
				}
				sent, v, first, warns := feedAll(t, &s, h, stream, n)
				if monitor {
					if v != nil || !bytes.Equal(sent, stream) || len(warns) != 1 || warns[0] != protocol.RulePickleGlobalDenied {
						t.Fatalf("monitor, own %v, pieces of %d: violation %v, sent %d of %d, warnings %v", own, n, v, len(sent), len(stream), warns)
					}
					continue
				}
				if v == nil || v.Rule != protocol.RulePickleGlobalDenied || v.Key != "/vllm/obj" || v.Detail != "pickle imports posix.system, which runs code: never allowed" {
					t.Fatalf("own %v, pieces of %d: violation %+v", own, n, v)
				}
				if want := len(good) + len(get); !bytes.Equal(sent, stream[:want]) {
					t.Fatalf("own %v, pieces of %d: sent %d bytes, want the %d before the bad message", own, n, len(sent), want)
				}
				if v.MsgOffset != uint64(len(good)+len(get)) || v.Field != protocol.FieldValue || v.Declared != uint64(len(evil)) {
					t.Fatalf("violation at %d, field %s, declared %d", v.MsgOffset, v.Field, v.Declared)
				}
				if !bytes.HasPrefix(bad, first) || len(first) == 0 {
					t.Fatalf("first bytes %x, not the bad message's", first)
				}
				if !s.Deadline().IsZero() || s.Ended().Violation != nil {
					t.Fatal("a stream ended by a rule has no deadline and no truncated message")
				}
			}
		}
	}
}

func TestPolicyFailsClosedWithoutTheHeldBytes(t *testing.T) {
	rules, _ := policy.New(policy.Defaults())
	pol := &Policy{Configured: protocol.GenSetting{Gen: protocol.G1}, Rules: rules}
	var s Stream
	s.Reset(g1Config(), pol, t0)
	s.Hold(&heldBytes{}) // a holder that never holds anything
	msg := setHex(t, "/a", []byte("b"))
	s.Feed(msg[:5], t0)
	if d := s.Feed(msg[5:], t0); d.Violation == nil || d.Send {
		t.Fatalf("%+v: want a violation and nothing sent", d)
	}
}

// TestFeedWithRulesAllocates: with the default rules, a message that breaks none (a job's SET of
// an address, a GET) costs the guard nothing but the pickle scanner's two error values (the
// value read raw and as base64 stops at a byte no pickle has: pickle.Report.Err is a *Error).
func TestFeedWithRulesAllocates(t *testing.T) {
	rules, _ := policy.New(policy.Defaults())
	pol := &Policy{Configured: protocol.GenSetting{Gen: protocol.G1}, Rules: rules}
	msgs := append(setHex(t, "/torch.rendezvous.r.0/other", []byte("10.0.0.1:29500")), unhex(t, getA)...)
	var s Stream
	s.Reset(g1Config(), pol, t0)
	h := &heldBytes{}
	s.Hold(h)
	if n := testing.AllocsPerRun(1000, func() {
		if d := s.Feed(msgs, t0); d.Violation != nil || d.Forward != len(msgs) {
			t.Fatalf("%+v", d)
		}
	}); n > 2 {
		t.Fatalf("Feed allocates %.1f times a run, want at most the scanner's 2", n)
	}
}
