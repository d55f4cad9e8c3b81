package gencap

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// TrafficOptions shape Traffic's rounds of torch-like store clients.
type TrafficOptions struct {
	Target  int64                 // stop after the round that takes the written packet bytes past this
	Clients int                   // connections per round, each a rank of one job; default 64
	Ops     int                   // requests per connection per round; default 40
	Seed    uint64                // for the random mix
	Gen     protocol.Generation   // wire generation of the clients; default G0 (set it)
	Server  netip.AddrPort        // default 10.0.0.1:29500
	MSS     int                   // default 1448
	Start   time.Time             // capture time of the first packet; default 2025-01-01
	Step    time.Duration         // capture time between requests; default 50 µs
	Rounds  int                   // stop after this many rounds if Target is 0
	OnRound func(round int) error // called after each round, for progress
}

// Traffic writes rounds of store traffic: each round, Clients connections open, shake hands,
// send Ops requests each (interleaved, with the store's replies), and close. The mix is
// torch-like: mostly small SET/GET/ADD/CHECK/WAIT on rank keys, some MULTI_GET and COMPARE_SET,
// and one SET in twenty carrying a 4 KiB–256 KiB value (pickled objects). Every request is valid
// under the default limits.
func Traffic(w *Writer, o TrafficOptions) error {
	if o.Clients <= 0 {
		o.Clients = 64
	}
	if o.Ops <= 0 {
		o.Ops = 40
	}
	if !o.Server.IsValid() {
		o.Server = netip.MustParseAddrPort("10.0.0.1:29500")
	}
	if o.MSS <= 0 {
		o.MSS = 1448
	}
	if o.Start.IsZero() {
		o.Start = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	if o.Step <= 0 {
		o.Step = 50 * time.Microsecond
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x5347))
	big := make([]byte, 256<<10)
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	t := o.Start
	var buf []byte
	for round := 0; ; round++ {
		if o.Target > 0 && w.Bytes >= o.Target || o.Target <= 0 && round >= max(o.Rounds, 1) {
			return nil
		}
		conns := make([]*Conn, o.Clients)
		for i := range conns {
			ip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
			port := uint16(32768 + (round*7+i)%28000)
			c := w.Conn(netip.AddrPortFrom(ip, port), o.Server, rng.Uint32(), rng.Uint32())
			if err := c.Open(t); err != nil {
				return err
			}
			t = t.Add(o.Step)
			buf = protocol.AppendHandshake(buf[:0], o.Gen, rng.Uint32())
			if len(buf) > 0 {
				if err := c.Send(t, buf, o.MSS); err != nil {
					return err
				}
				if err := c.Reply(t.Add(o.Step/2), []byte{0, 0, 0, 0}, o.MSS); err != nil {
					return err
				}
			}
			conns[i] = c
		}
		for op := 0; op < o.Ops; op++ {
			for i, c := range conns {
				req, reply := request(rng, o.Gen, round, i, op, len(conns), big)
				var err error
				if buf, err = protocol.Append(buf[:0], o.Gen, req); err != nil {
					return fmt.Errorf("gencap: %w", err)
				}
				t = t.Add(o.Step)
				if err := c.Send(t, buf, o.MSS); err != nil {
					return err
				}
				if err := c.Reply(t.Add(o.Step/2), reply, o.MSS); err != nil {
					return err
				}
			}
		}
		for _, c := range conns {
			t = t.Add(o.Step)
			if err := c.Close(t); err != nil {
				return err
			}
		}
		if o.OnRound != nil {
			if err := o.OnRound(round); err != nil {
				return err
			}
		}
		t = t.Add(10 * time.Millisecond)
	}
}

// request picks one request of rank i and the store's reply to it.
func request(rng *rand.Rand, g protocol.Generation, round, rank, op, world int, big []byte) (protocol.Request, []byte) {
	key := func(k int) []byte { return fmt.Appendf(nil, "/job%d/rank_%d/key_%d", round, k, op%8) }
	u64 := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	small := fmt.Appendf(nil, "tcp://10.1.%d.%d:%d", rank>>8, rank&255, 40000+op)
	switch p := rng.IntN(100); {
	case p < 5:
		n := 4<<10 + rng.IntN(len(big)-4<<10)
		return protocol.Request{Op: protocol.OpSet, Key: key(rank), Value: big[:n]}, nil
	case p < 30:
		return protocol.Request{Op: protocol.OpSet, Key: key(rank), Value: small}, nil
	case p < 55:
		return protocol.Request{Op: protocol.OpGet, Key: key((rank + 1) % world)}, append(u64(uint64(len(small))), small...)
	case p < 70:
		return protocol.Request{Op: protocol.OpAdd, Key: fmt.Appendf(nil, "/job%d/store_barrier", round), Int: 1}, u64(uint64(op))
	case p < 80:
		return protocol.Request{Op: protocol.OpCheck, Keys: [][]byte{key(0), key(world - 1)}}, u64(0)
	case p < 88:
		return protocol.Request{Op: protocol.OpWait, Keys: [][]byte{key(0)}}, u64(0)
	case p < 94:
		if _, ok := protocol.WireOf(g, protocol.OpMultiGet); ok {
			return protocol.Request{Op: protocol.OpMultiGet, Keys: [][]byte{key(0), key(1), key(2)}}, u64(3)
		}
		fallthrough
	default:
		return protocol.Request{Op: protocol.OpCompareSet, Key: key(rank), Value: small, Desired: small[:4]}, small
	}
}
