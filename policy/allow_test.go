package policy

import (
	"bufio"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/netip"
	"os"
	"strings"
	"testing"
)

type judged struct {
	Name     string
	Protocol int
	Globals  []string
	Value    string
}

func readJudged(t *testing.T, path string) []judged {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []judged
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var j judged
		if err := json.Unmarshal(sc.Bytes(), &j); err != nil {
			t.Fatal(err)
		}
		out = append(out, j)
	}
	return out
}

// TestWhatTorchWritesPasses: what torch and the frameworks write, as interop/pickle_census.py
// written pickled it with torch 2.6 (torchrun's rendezvous state, tensors, torch.Size, dtypes,
// devices, vLLM's PyNcclPipe metadata and ncclUniqueId, containers, datetimes, numpy arrays) at
// protocols 0, 2, 4 and 5, passes the default policy raw and base64; every global CPython imported
// for it is on the allow-list (the interop suite does the same with every release's whole set).
func TestWhatTorchWritesPasses(t *testing.T) {
	p, _ := New(Defaults())
	recs := readJudged(t, "testdata/torch-written.jsonl")
	if len(recs) < 60 {
		t.Fatalf("only %d values", len(recs))
	}
	for _, r := range recs {
		v, _ := hex.DecodeString(r.Value)
		for _, form := range [][]byte{v, []byte(base64.StdEncoding.EncodeToString(v))} {
			if f, broke := p.JudgeValue([]byte("/vllm/obj"), form, netip.IPv4Unspecified()); broke {
				t.Errorf("%s, protocol %d: %s %q", r.Name, r.Protocol, f.Rule, f.Detail)
			}
		}
		for _, g := range r.Globals { // module.name, as find_class was called
			if !p.allow.names[g] {
				t.Errorf("%s: CPython imported %s, not on the allow-list", r.Name, g)
			}
		}
	}
}

// TestGadgetsRefused: the pickles that walked around the deny list (interop/pickle_gadgets.py: a call
// on a call's result, code from source, a shell through a helper, an attribute walk, a factory by
// name, a torch.save stream made at load time) are each refused, raw and base64, naming the global.
func TestGadgetsRefused(t *testing.T) {
	p, _ := New(Defaults())
	recs := readJudged(t, "testdata/gadgets.jsonl")
	if len(recs) != 10 {
		t.Fatalf("%d gadgets, want 10", len(recs))
	}
	for _, r := range recs {
		v, _ := hex.DecodeString(r.Value)
		for _, form := range [][]byte{v, []byte(base64.StdEncoding.EncodeToString(v))} {
			f, broke := p.JudgeValue([]byte("/vllm/obj"), form, netip.IPv4Unspecified())
			if !broke || !strings.Contains(f.Detail, "imports ") {
				t.Errorf("%s: %v %q", r.Name, broke, f.Detail)
			}
		}
	}
}

// TestReadersRaiseAtExtAndPersistentIDs: pickle.loads raises at an EXT opcode (no process registers
// copyreg codes) and at a persistent id (it has no persistent_load), so what follows them never
// runs: binary values read as pickles meet them by chance (a gloo address of torch 1.13, read as
// base64, was refused so and its job failed). What comes before them is judged as ever.
func TestReadersRaiseAtExtAndPersistentIDs(t *testing.T) {
	p, _ := New(Defaults())
	system := "cposix\nsystem\n(S'x'\ntR"
	for _, tc := range []struct{ name, value, detail string }{
		{"EXT, then a call of its result", "\x82\x05)R.", ""},
		{"a persistent id, then a call of it", "P1\n)R.", ""},
		{"BINPERSID, then a call of it", "K\x01Q)R.", ""},
		{"os.system after an EXT: never runs", "\x82\x05" + system + ".", ""},
		{"os.system before an EXT", system + "\x82\x05.", "imports posix.system"},
		{"a call of an unknown value before an EXT", "\x80\x04K\x01)R\x82\x05.", ""},
	} {
		for _, form := range []string{tc.value, base64.StdEncoding.EncodeToString([]byte(tc.value))} {
			f, broke := p.JudgeValue([]byte("/0/0/2"), []byte(form), netip.IPv4Unspecified())
			if tc.detail == "" && broke || tc.detail != "" && (!broke || !strings.Contains(f.Detail, tc.detail)) {
				t.Errorf("%s (%q): %v %q, want %q", tc.name, form, broke, f.Detail, tc.detail)
			}
		}
	}
	// torch 1.13's gloo address of rank 2 (sockaddr_in 127.0.0.1, padded), as its job wrote it.
	addr := append([]byte{0x02, 0x00, 0x91, 0xbf, 0x7f, 0x00, 0x00, 0x01}, make([]byte, 400)...)
	if f, broke := p.JudgeValue([]byte("/0/0/2"), addr, netip.IPv4Unspecified()); broke {
		t.Errorf("a gloo address: %q", f.Detail)
	}
}
