package protocol

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// The golden captures under testdata/golden are real torch traffic: interop/capture.py drove a
// real TCPStore of each release and backend through a recording relay and noted which bytes each
// Python API call sent (interop/capture-all.sh regenerates them).

type goldenManifest struct {
	Torch       string `json:"torch"`
	Backend     string `json:"backend"`
	Connections []struct {
		File  string `json:"file"`
		Calls []struct {
			API   string `json:"api"`
			Start int    `json:"c2s_start"`
			End   int    `json:"c2s_end"`
		} `json:"calls"`
	} `json:"connections"`
}

// apiOps lists the message sequences each Python API call may send, from the protocol notes
// (section 3): get is WAIT then GET, a timed-out wait adds CANCEL_WAIT (G1+), a blocking
// queue_pop waits first, and so on. It is written from the notes, not from the decoder.
var apiOps = map[string][][]Op{
	"TCPStore()":  {{}, {OpValidate}, {OpValidate, OpPing}, {OpAdd}, {OpValidate, OpPing, OpAdd}, {OpValidate, OpAdd}},
	"clone()":     {{OpValidate, OpPing}},
	"set":         {{OpSet}},
	"get":         {{OpWait, OpGet}},
	"add":         {{OpAdd}},
	"compare_set": {{OpCompareSet}},
	"check":       {{OpCheck}},
	"wait":        {{OpWait}, {OpWait, OpCancelWait}},
	"num_keys":    {{OpGetNumKeys}},
	"delete_key":  {{OpDeleteKey}},
	"append":      {{OpAppend}},
	"multi_set":   {{OpMultiSet}},
	"multi_get":   {{OpWait, OpMultiGet}},
	"queue_push":  {{OpQueuePush}},
	"queue_pop":   {{OpQueuePop}, {OpWait, OpQueuePop}},
	"queue_len":   {{OpQueueLen}},
	"list_keys":   {{OpListKeys}},
	"barrier":     {{OpBarrier}, {OpBarrier, OpCancelWait}},
}

type goldenStream struct {
	name   string
	gen    Generation
	stream []byte
	calls  []struct {
		API        string
		Start, End int
	}
}

func loadGolden(t *testing.T) []goldenStream {
	dirs, _ := filepath.Glob("testdata/golden/*")
	if len(dirs) == 0 {
		t.Fatal("no golden captures in testdata/golden: run interop/capture-all.sh")
	}
	var out []goldenStream
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		var m goldenManifest
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		// The generation comes from our own release table: a wrong entry fails here.
		gs, err := ParseGeneration(m.Torch)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range m.Connections {
			s, err := os.ReadFile(filepath.Join(dir, c.File))
			if err != nil {
				t.Fatal(err)
			}
			gs := goldenStream{name: filepath.Base(dir) + "/" + c.File, gen: gs.Gen, stream: s}
			for _, call := range c.Calls {
				gs.calls = append(gs.calls, struct {
					API        string
					Start, End int
				}{call.API, call.Start, call.End})
			}
			out = append(out, gs)
		}
	}
	return out
}

// TestGoldenRealTraffic: every stream of every release decodes with no violation, as whole
// messages, under its exact generation and under auto; and each API call's bytes are exactly the
// messages the notes say that call sends.
func TestGoldenRealTraffic(t *testing.T) {
	for _, g := range loadGolden(t) {
		t.Run(g.name, func(t *testing.T) {
			legacy := min(g.gen, G1)
			for _, cfg := range []Config{exact(g.gen), auto(legacy)} {
				got := decodeAll(cfg, g.stream)
				if got.viol != nil {
					t.Fatalf("%s: real traffic violates %v", cfg.Gen, got.viol)
				}
				var end uint64
				for _, m := range got.msgs {
					end = m.Offset + m.Len
				}
				if end != uint64(len(g.stream)) {
					t.Fatalf("%s: messages end at %d of %d bytes", cfg.Gen, end, len(g.stream))
				}
				if !cfg.Gen.Auto {
					continue
				}
				if gen, _ := decoderAfter(cfg, g.stream).Generation(); g.gen >= G2 && gen > g.gen {
					t.Errorf("auto narrowed to %s, above the release's %s", gen, g.gen)
				}
			}
			msgs := decodeAll(exact(g.gen), g.stream).msgs
			for _, call := range g.calls {
				var ops []Op
				for _, m := range msgs {
					if m.Offset >= uint64(call.Start) && m.Offset < uint64(call.End) {
						ops = append(ops, m.Op)
					}
				}
				if call.Start == call.End {
					continue // refused by the client library, nothing sent
				}
				allowed, ok := apiOps[call.API]
				if !ok {
					t.Fatalf("no expectation for API %q", call.API)
				}
				if !slices.ContainsFunc(allowed, func(a []Op) bool { return slices.Equal(a, ops) }) {
					t.Errorf("%s at %d-%d sent %v, want one of %v", call.API, call.Start, call.End, ops, allowed)
				}
			}
		})
	}
}

// decoderAfter returns a decoder that has consumed stream, for tests.
func decoderAfter(cfg Config, stream []byte) *Decoder {
	d := NewDecoder(cfg)
	for p := stream; len(p) > 0; {
		n, _, err := d.Scan(p)
		if err != nil {
			return d
		}
		p = p[n:]
	}
	return d
}

// TestGoldenChunking: random splits of the real streams give the same messages as whole reads.
func TestGoldenChunking(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, g := range loadGolden(t) {
		want := decodeAll(exact(g.gen), g.stream)
		for range 20 {
			sizes := []int{1 + rng.IntN(9), 1 + rng.IntN(100), 1 + rng.IntN(3)}
			if got := decodeChunks(exact(g.gen), g.stream, sizes); !reflect.DeepEqual(got, want) {
				t.Fatalf("%s chunks %v differ", g.name, sizes)
			}
		}
	}
}

// FuzzDecode's seed corpus gets the real streams too.
func addGoldenSeeds(f *testing.F) {
	dirs, _ := filepath.Glob("testdata/golden/*/conn*.c2s")
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		torch := strings.SplitN(filepath.Base(filepath.Dir(p)), "-", 2)[0]
		if gs, err := ParseGeneration(torch); err == nil {
			f.Add(b, uint8(gs.Gen), uint16(len(b)/3))
		}
	}
}
