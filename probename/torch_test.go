package probename

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/storeguard/storeguard/protocol"
)

// A torch client's first bytes must never be named. These tests hold Name to it two ways: on real
// and built torch traffic (Name gives ""), and on everything Name names (no torch client within
// protocol.DefaultLimits can send it, as the protocol package's decoder judges).

// torchStream is bytes a torch client can begin a connection with.
type torchStream struct {
	name  string
	bytes []byte
}

// torchStreams are the real captures of every release and backend, from their first byte and,
// for torch <= 2.1 (which has no handshake, so any message may come first), from each message;
// then messages built by protocol.Append of every op of every generation.
func torchStreams(t testing.TB) []torchStream {
	var out []torchStream
	for _, f := range goldenGlob(t) {
		s, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		gen := goldenGeneration(t, filepath.Dir(f))
		name := filepath.Base(filepath.Dir(f)) + "/" + filepath.Base(f)
		out = append(out, torchStream{name, s})
		if gen.Validated() {
			continue
		}
		for _, off := range messageOffsets(t, gen, s) {
			out = append(out, torchStream{fmt.Sprintf("%s@%d", name, off), s[off:]})
		}
	}
	return append(out, builtStreams(t)...)
}

func goldenGeneration(t testing.TB, dir string) protocol.Generation {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Torch string `json:"torch"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	g, err := protocol.ParseGeneration(m.Torch)
	if err != nil {
		t.Fatal(err)
	}
	return g.Gen
}

// messageOffsets are where each message of a valid stream starts.
func messageOffsets(t testing.TB, g protocol.Generation, s []byte) []int {
	d := protocol.NewDecoder(config(g))
	var offs []int
	for p := s; len(p) > 0; {
		n, m, err := d.Scan(p)
		if err != nil {
			t.Fatalf("real torch traffic violates %v", err)
		}
		if m != nil {
			offs = append(offs, int(m.Offset))
		}
		p = p[n:]
	}
	return offs
}

// builtStreams: every op of every generation, with keys, values and integers of the sizes torch
// uses (and up to the default key limit), first on the connection: after the handshake from G2 on,
// alone for G0/G1. Each is followed by a GET so that short messages show what comes next.
func builtStreams(t testing.TB) []torchStream {
	rng := rand.New(rand.NewPCG(106294, 2))
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	keys := [][]byte{{}, []byte("k"), []byte("rank_0"), []byte("/default_pg/0//cuda//0"),
		[]byte("GET / HTTP/1.0\r\n\r\n"), bytes.Repeat([]byte("a"), 255), bytes.Repeat([]byte("b"), 256),
		randBytes(4096), randBytes(8192)}
	values := [][]byte{{}, []byte("1"), randBytes(300), randBytes(70000)}
	ints := []int64{0, 1, -1, 2, 1024, 1 << 40}
	nonces := []uint32{0, 1, 0x0d0d0d0d, 0x0a0d0a0d, rng.Uint32()}
	var out []torchStream
	for g := protocol.G0; g <= protocol.LatestGeneration; g++ {
		for _, op := range protocol.Ops() {
			if _, ok := protocol.WireOf(g, op); !ok || op == protocol.OpValidate {
				continue
			}
			var reqs []protocol.Request
			for i, k := range keys {
				v := values[i%len(values)]
				reqs = append(reqs, protocol.Request{Op: op, Key: k, Value: v, Desired: values[(i+1)%len(values)],
					Int: ints[i%len(ints)], Keys: [][]byte{k, keys[(i+1)%len(keys)]}, Values: [][]byte{v, v},
					U32: nonces[i%len(nonces)]})
			}
			for i, r := range reqs {
				var s []byte
				if g.Validated() {
					s = protocol.AppendHandshake(s, g, nonces[i%len(nonces)])
				}
				s, err := protocol.Append(s, g, r)
				if err != nil {
					t.Fatal(err)
				}
				s, _ = protocol.Append(s, g, protocol.Request{Op: protocol.OpGet, Key: []byte("k")})
				out = append(out, torchStream{fmt.Sprintf("built %s %s #%d", g, op, i), s})
			}
		}
	}
	return out
}

func TestTorchNeverNamed(t *testing.T) {
	for _, s := range torchStreams(t) {
		for k := 1; k <= min(len(s.bytes), MaxPrefix+1); k++ {
			if got := Name(s.bytes[:k]); got != "" {
				t.Errorf("%s, first %d bytes %x: Name = %q, want \"\"", s.name, k, s.bytes[:k], got)
				break
			}
		}
	}
}

// TestTorchRandomMessages: torch <= 2.1 messages of random ops, random key lengths up to the default
// limit and random bytes, first on the connection.
func TestTorchRandomMessages(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 106294))
	for i := range 50000 {
		g := protocol.Generation(rng.IntN(2))
		ops := protocol.Ops()
		op := ops[rng.IntN(len(ops))]
		if _, ok := protocol.WireOf(g, op); !ok || op == protocol.OpValidate {
			continue
		}
		key := make([]byte, rng.IntN(int(protocol.DefaultLimits().MaxKeyBytes)+1))
		for j := range key[:min(len(key), MaxPrefix)] {
			key[j] = byte(rng.Uint32())
		}
		s, err := protocol.Append(nil, g, protocol.Request{Op: op, Key: key, Value: key, Desired: key,
			Int: int64(rng.Uint64()), Keys: [][]byte{key}, Values: [][]byte{key}})
		if err != nil {
			t.Fatal(err)
		}
		for k := 1; k <= min(len(s), MaxPrefix); k++ {
			if got := Name(s[:k]); got != "" {
				t.Fatalf("#%d %s %s, first %d bytes %x: Name = %q", i, g, op, k, s[:k], got)
			}
		}
	}
}

// TestNamedCannotBeTorch: every exact pattern, and every prefix of a capture that Name names, is
// something no torch client within protocol.DefaultLimits begins a connection with.
func TestNamedCannotBeTorch(t *testing.T) {
	for _, e := range exacts {
		if err := notTorch([]byte(e.pat)); err != nil {
			t.Errorf("%s: %v", e.name, err)
		}
	}
	for _, v := range loadObserved(t) {
		for k := 1; k <= min(len(v.bytes), MaxPrefix); k++ {
			if Name(v.bytes[:k]) == "" {
				continue
			}
			if err := notTorch(v.bytes[:k]); err != nil {
				t.Errorf("%s, first %d bytes: %v", v, k, err)
			}
		}
	}
}

// torchConfigs are every way storeguard reads a client stream: each generation, and auto with
// either legacy reading. WATCH_KEY is not blocked: torch <= 2.0 clients send it.
func torchConfigs() []protocol.Config {
	var cs []protocol.Config
	for g := protocol.G0; g <= protocol.LatestGeneration; g++ {
		cs = append(cs, config(g))
	}
	for _, legacy := range []protocol.Generation{protocol.G0, protocol.G1} {
		c := config(legacy)
		c.Gen, c.LegacyGen = protocol.GenSetting{Auto: true}, legacy
		cs = append(cs, c)
	}
	return cs
}

func config(g protocol.Generation) protocol.Config {
	lim := protocol.DefaultLimits()
	lim.BlockWatchKey = false
	return protocol.Config{Gen: protocol.GenSetting{Gen: g}, Limits: lim}
}

// notTorch returns nil when b cannot begin a torch client's connection under any of torchConfigs:
// the decoder stops on b itself, or b ends inside a length or count and zeros, its smallest
// completion, already break a limit. Otherwise it says which reading accepts b.
func notTorch(b []byte) error {
	for _, cfg := range torchConfigs() {
		d := protocol.NewDecoder(cfg)
		if scan(d, b) != nil {
			continue
		}
		v := scan(d, make([]byte, 8))
		if v != nil && v.Offset < uint64(len(b)) {
			switch v.Rule {
			case protocol.RuleKeyTooLong, protocol.RuleValueTooLong, protocol.RuleTooManyKeys,
				protocol.RuleMessageTooLarge:
				continue
			}
		}
		return fmt.Errorf("%x is a valid start of a %s stream", b, cfg.Gen)
	}
	return nil
}

// scan feeds p to d and returns the violation it stops on, if any.
func scan(d *protocol.Decoder, p []byte) *protocol.Violation {
	for len(p) > 0 {
		n, _, err := d.Scan(p)
		if err != nil {
			var v *protocol.Violation
			if errors.As(err, &v) {
				return v
			}
			panic(err)
		}
		p = p[n:]
	}
	return nil
}

// TestIssue106294: nmap's TerminalServer probe, which PyTorch issue #106294 is about, is named
// rdp_x224, and a torch <= 2.1 store reads it as an ADD of a 962 GB key.
func TestIssue106294(t *testing.T) {
	probe := []byte("\x03\x00\x00\x0b\x06\xe0\x00\x00\x00\x00\x00")
	if got := Name(probe); got != "rdp_x224" {
		t.Errorf("Name = %q, want rdp_x224", got)
	}
	for _, g := range []protocol.Generation{protocol.G0, protocol.G1} {
		v := scan(protocol.NewDecoder(config(g)), probe)
		if v == nil || v.Op != protocol.OpAdd || v.Rule != protocol.RuleKeyTooLong || v.Declared != 0xe0060b0000 {
			t.Errorf("%s: %v, want an ADD whose key length 962174058496 is too long", g, v)
		}
	}
}
