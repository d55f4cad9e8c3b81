package protocol

import (
	"bytes"
	"testing"
)

// mixStream is a realistic rendezvous mix: SET/GET/ADD/WAIT/CHECK of short keys and values, as
// torchrun and init_process_group send them, after the G3 handshake.
func mixStream(b *testing.B, g Generation, n int) []byte {
	var s []byte
	s = AppendHandshake(s, g, 4242)
	val := bytes.Repeat([]byte("x"), 64)
	for i := 0; len(s) < n; i++ {
		key := []byte("/rank_" + string(rune('0'+i%10)) + "/store_based_barrier_key")
		for _, r := range []Request{
			{Op: OpSet, Key: key, Value: val},
			{Op: OpWait, Keys: [][]byte{key}},
			{Op: OpGet, Key: key},
			{Op: OpAdd, Key: []byte("init/"), Int: 1},
			{Op: OpCheck, Keys: [][]byte{key, key}},
			{Op: OpGetNumKeys},
		} {
			s = mustAppend(b, s, g, r)
		}
	}
	return s
}

func benchScan(b *testing.B, stream []byte, chunk int) {
	d := NewDecoder(exact(G3))
	msgs := 0
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		d.Reset(exact(G3))
		for p := stream; len(p) > 0; {
			c := p[:min(chunk, len(p))]
			p = p[len(c):]
			for len(c) > 0 {
				n, m, err := d.Scan(c)
				if err != nil {
					b.Fatal(err)
				}
				if m != nil {
					msgs++
				}
				c = c[n:]
			}
		}
	}
	b.ReportMetric(float64(msgs)/b.Elapsed().Seconds(), "msgs/s")
}

func BenchmarkScanMix64KiBReads(b *testing.B) { benchScan(b, mixStream(b, G3, 1<<20), 64<<10) }
func BenchmarkScanMix1500BReads(b *testing.B) { benchScan(b, mixStream(b, G3, 1<<20), 1500) }

// BenchmarkScanSmall is the message-rate case: GETNUMKEYS and CANCEL_WAIT-sized requests.
func BenchmarkScanSmall(b *testing.B) {
	var s []byte
	s = AppendHandshake(s, G3, 1)
	for len(s) < 1<<20 {
		s = mustAppend(b, s, G3, Request{Op: OpGet, Key: []byte("/k")})
	}
	benchScan(b, s, 64<<10)
}

// BenchmarkScanLargeValues is the bandwidth case: 1 MiB SETs.
func BenchmarkScanLargeValues(b *testing.B) {
	var s []byte
	s = AppendHandshake(s, G3, 1)
	val := make([]byte, 1<<20)
	for range 16 {
		s = mustAppend(b, s, G3, Request{Op: OpSet, Key: []byte("/blob"), Value: val})
	}
	benchScan(b, s, 64<<10)
}
