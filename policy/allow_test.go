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
