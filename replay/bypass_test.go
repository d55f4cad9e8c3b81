package replay

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/replay/internal/gencap"
)

// TestBypassSameAsReassembler replays random captures twice, with in-order segments bypassing
// the reassembler and with every segment given to it, and wants the same results, audit events
// and errors. The captures mix what makes the bypass hand a stream over: segments lost, repeated,
// swapped, re-cut, cut by the snap length, bare ACKs, keep-alives, repeated SYNs, resets, a
// 4-tuple reused, timestamps going back, long silences, and page and stream limits.
func TestBypassSameAsReassembler(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 60
	}
	// The reassembler's idle clock is its segments' timestamps, not the capture's: A's second
	// segment is stamped 4 s behind the capture, so at 9 s A has been idle for 9 s.
	idleByTimestamps := goldenCase{name: "bypass", opts: Options{IdleClose: 8 * time.Second},
		build: func(t testing.TB, w *gencap.Writer) {
			p := traffic(t, protocol.G3)
			a := w.Conn(client(0), server, 1000, 5000)
			must(t, a.Open(t0))
			must(t, a.Send(ms(1), p[:50], 1448))
			b := w.Conn(client(1), server, 1000, 5000)
			must(t, b.Open(sec(4)))
			must(t, a.Send(ms(2), p[50:100], 1448))
			must(t, b.Send(sec(9), p, 1448))
			must(t, a.Send(sec(10), p[100:], 1448))
		}}
	compareBypass(t, "idle by timestamps", idleByTimestamps)
	// The same, with A handed to the reassembler by a retransmission stamped behind the capture.
	handedOverIdle := idleByTimestamps
	handedOverIdle.build = func(t testing.TB, w *gencap.Writer) {
		p := traffic(t, protocol.G3)
		a := w.Conn(client(0), server, 1000, 5000)
		must(t, a.Open(t0))
		first := a.Segments(p[:50], 1448)
		must(t, a.Write(ms(1), first...))
		b := w.Conn(client(1), server, 1000, 5000)
		must(t, b.Open(sec(4)))
		must(t, a.Write(ms(2), first...))
		must(t, b.Send(sec(9), p, 1448))
		must(t, a.Send(sec(10), p[50:], 1448))
	}
	compareBypass(t, "handed over, idle by timestamps", handedOverIdle)
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 0xb1))
		tc := goldenCase{name: "bypass", audit: true, build: func(t testing.TB, w *gencap.Writer) {
			randomCapture(t, w, rng)
		}}
		tc.opts = Options{ReorderWait: time.Duration(1+rng.IntN(3)) * time.Second,
			IdleClose: time.Duration(5+rng.IntN(20)) * time.Second}
		if rng.IntN(4) == 0 {
			tc.opts.MaxStreams = 2 + rng.IntN(3)
		}
		if rng.IntN(4) == 0 {
			tc.opts.MaxBufferedPagesPerConnection = 1 + rng.IntN(4)
			tc.opts.MaxBufferedPagesTotal = 2 + rng.IntN(8)
		}
		if rng.IntN(3) == 0 {
			d := time.Duration(1+rng.IntN(5)) * time.Second
			tc.cfg = func(c *config.Config) { c.Timeouts.Message = d }
		}
		compareBypass(t, fmt.Sprintf("seed %d", seed), tc)
	}
}

func compareBypass(t *testing.T, name string, tc goldenCase) {
	t.Helper()
	data := buildCapture(t, tc)
	slow := tc
	slow.opts.alwaysReassemble = true
	got := render(run(t, tc, data))
	want := render(run(t, slow, data))
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: bypassing the reassembler changed the results\n--- bypass\n%s--- reassembler only\n%s", name, got, want)
	}
}

// randomCapture writes a few interleaved connections with random faults.
func randomCapture(t testing.TB, w *gencap.Writer, rng *rand.Rand) {
	type pending struct {
		c    *gencap.Conn
		segs []gencap.Segment
		pkts [][]byte // frames cut by a snap length, written as they are
	}
	var conns []*pending
	n := 1 + rng.IntN(5)
	for i := range n {
		cl := client(i)
		if i > 0 && rng.IntN(4) == 0 {
			cl = client(i - 1) // the same 4-tuple again, maybe with a new ISN
		}
		c := w.Conn(cl, server, rng.Uint32(), rng.Uint32())
		p := &pending{c: c}
		syn := gencap.Segment{Seq: c.CSeq, Flags: gencap.SYN}
		if rng.IntN(8) != 0 { // else the capture begins midstream
			p.segs = append(p.segs, syn)
		}
		c.CSeq++
		var payload []byte
		switch rng.IntN(4) {
		case 0:
			payload = traffic(t, protocol.G0)
		case 1:
			payload = append(traffic(t, protocol.G3), probe106294...)
		case 2:
			payload = append(traffic(t, protocol.G0), bigSet(t)[:1+rng.IntN(len(bigSet(t)))]...)
		default:
			payload = traffic(t, protocol.G3)
		}
		mss := 200 + rng.IntN(1400)
		segs := c.Segments(payload, mss)
		var again []gencap.Segment
		for j := 0; j < len(segs); j++ {
			s := segs[j]
			switch k := rng.IntN(60); {
			case k == 0: // lost
				continue
			case k == 1: // repeated somewhere
				again = append(again, s)
			case k == 2 && j+1 < len(segs): // swapped with the next
				p.segs = append(p.segs, segs[j+1], s)
				j++
				continue
			case k == 3 && len(s.Payload) > 2: // re-cut: its second half again with the first of the next
				half := len(s.Payload) / 2
				p.segs = append(p.segs, s, gencap.Segment{Seq: s.Seq + uint32(half), Ack: s.Ack, Flags: s.Flags,
					Payload: slices.Clone(s.Payload[half:])})
				continue
			case k == 4: // a bare ACK at the next byte
				p.segs = append(p.segs, gencap.Segment{Seq: s.Seq, Ack: s.Ack, Flags: gencap.ACK})
			case k == 5: // a keep-alive: one old byte
				p.segs = append(p.segs, gencap.Segment{Seq: s.Seq - 1, Ack: s.Ack, Flags: gencap.ACK, Payload: []byte{0}})
			case k == 6: // the SYN again
				p.segs = append(p.segs, syn)
			case k == 7: // a reset at the next byte, and nothing more
				p.segs = append(p.segs, gencap.Segment{Seq: s.Seq, Ack: s.Ack, Flags: gencap.RST | gencap.ACK})
				j = len(segs)
				continue
			case k == 8: // cut by a snap length
				b, err := w.Frame(c.Client, c.Server, s)
				must(t, err)
				p.pkts = append(p.pkts, slices.Clone(b[:60]))
				p.segs = append(p.segs, gencap.Segment{Flags: 0xff}) // its place in the order
				continue
			case k == 9: // a bare ACK beyond the next byte
				p.segs = append(p.segs, gencap.Segment{Seq: s.Seq + 100, Ack: s.Ack, Flags: gencap.ACK})
			case k == 10: // a SYN carrying the next bytes
				s.Flags |= gencap.SYN
			case k == 11: // a FIN with the last of it, early
				s.Flags |= gencap.FIN
			}
			p.segs = append(p.segs, s)
		}
		for _, s := range again {
			p.segs = slices.Insert(p.segs, rng.IntN(len(p.segs)+1), s)
		}
		if rng.IntN(3) != 0 {
			p.segs = append(p.segs, gencap.Segment{Seq: c.CSeq, Ack: c.SSeq, Flags: gencap.FIN | gencap.ACK},
				gencap.Segment{Seq: c.CSeq + 1, Ack: c.SSeq + 1, Flags: gencap.ACK})
		}
		conns = append(conns, p)
	}
	at := t0
	for {
		var open []*pending
		for _, p := range conns {
			if len(p.segs) > 0 {
				open = append(open, p)
			}
		}
		if len(open) == 0 {
			return
		}
		p := open[rng.IntN(len(open))]
		switch k := rng.IntN(100); {
		case k < 2:
			at = at.Add(time.Duration(rng.IntN(40)) * time.Second) // long silence
		case k < 4:
			at = at.Add(-time.Duration(rng.IntN(500)) * time.Millisecond) // a timestamp going back
		case k < 5:
			at = at.Add(-time.Duration(rng.IntN(20)) * time.Second) // far back
		default:
			at = at.Add(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
		s := p.segs[0]
		p.segs = p.segs[1:]
		if s.Flags == 0xff {
			must(t, w.WritePacket(at, p.pkts[0], len(p.pkts[0])))
			p.pkts = p.pkts[1:]
			continue
		}
		must(t, w.WriteSegment(at, p.c.Client, p.c.Server, s))
		if rng.IntN(10) == 0 { // the store's side
			must(t, w.WriteSegment(at, p.c.Server, p.c.Client, gencap.Segment{Seq: p.c.SSeq, Ack: s.Seq, Flags: gencap.ACK}))
		}
	}
}
