package protocol

import (
	"bytes"
	"reflect"
	"testing"
)

// attackSeeds are the known hostile inputs of the protocol notes, section 9 and Appendix A.
var attackSeeds = []string{
	"0300000b06e0000000000000", // nmap TerminalServer (#106294)
	"0300002a25e00000000000",   // nmap TerminalServerCookie
	"040000000100000000",       // G0 CHECK n=2^24
	"000000000000000040",       // G0 SET keylen 2^62
	"0064000000000000006162",   // partial SET
	"000300000000000000" + "2f7467030000000000000076616ceeee", // SET + garbage
	"00cef7853c0d39300000", // VALIDATE + PING
	"00cef7853d",           // wrong magic
	"003c85f7ce",           // big-endian magic
	"0b0000000000000080",   // MULTI_SET count with the sign bit
}

// FuzzDecode asserts, for any bytes, generation and split point: no panic; the message in
// progress never exceeds the ceiling; the verdict and messages do not depend on the split; and
// every message decoded re-encodes to its own bytes.
func FuzzDecode(f *testing.F) {
	for g := G0; g <= LatestGeneration; g++ {
		s, _ := sampleStream(f, g)
		f.Add(s, uint8(g), uint16(7))
	}
	addGoldenSeeds(f)
	for _, h := range attackSeeds {
		for _, g := range []uint8{0, 1, 3, 6, 255} {
			f.Add(unhex(f, h), g, uint16(3))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, gen uint8, split uint16) {
		cfg := Config{Limits: DefaultLimits(), Backend: Backend(gen % 3)}
		cfg.Limits.MaxMessageBytes = 4096 // small, so that the fuzzer reaches the cap
		cfg.Limits.MaxKeyBytes = 512
		cfg.Limits.MaxValueBytes = 1024
		cfg.Limits.MaxKeys = 64
		if g := Generation(gen % 8); g <= LatestGeneration {
			cfg.Gen.Gen = g
		} else {
			cfg.Gen.Auto = true
			cfg.LegacyGen = Generation(gen>>3) % 2
		}
		whole := decodeBounded(t, cfg, data, len(data)+1)
		for _, size := range []int{1, int(split%64) + 1} {
			if got := decodeBounded(t, cfg, data, size); !reflect.DeepEqual(got, whole) {
				t.Fatalf("chunks of %d: %+v; whole: %+v", size, got.viol, whole.viol)
			}
		}
		for i, m := range whole.msgs {
			r, err := ParseRequest(m.Op, whole.bufs[i])
			if err != nil {
				t.Fatalf("message %d %s: %v", i, m.Op, err)
			}
			re, err := Append(nil, m.Generation, r)
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
			if !bytes.Equal(re, whole.bufs[i]) {
				t.Fatalf("message %d %s re-encoded %x, was %x", i, m.Op, re, whole.bufs[i])
			}
		}
	})
}

// decodeBounded is decodeChunks with the ceiling asserted after every Scan.
func decodeBounded(t *testing.T, cfg Config, stream []byte, size int) decoded {
	d := NewDecoder(cfg)
	var out decoded
	var cur []byte
	for p := stream; len(p) > 0; {
		chunk := p[:min(size, len(p))]
		p = p[len(chunk):]
		for len(chunk) > 0 {
			n, msg, err := d.Scan(chunk)
			if d.PartialBytes() > cfg.Limits.MaxMessageBytes {
				t.Fatalf("%d bytes in progress, ceiling %d", d.PartialBytes(), cfg.Limits.MaxMessageBytes)
			}
			if err != nil {
				out.viol = err.(*Violation)
				return out
			}
			cur = append(cur, chunk[:n]...)
			chunk = chunk[n:]
			if msg != nil {
				if msg.Len > cfg.Limits.MaxMessageBytes {
					t.Fatalf("message of %d bytes passed a ceiling of %d", msg.Len, cfg.Limits.MaxMessageBytes)
				}
				out.msgs = append(out.msgs, *msg)
				out.bufs = append(out.bufs, cur)
				cur = nil
			}
		}
	}
	return out
}
