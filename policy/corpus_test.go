package policy

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// corpus is the pickle package's corpus: real pickles of every protocol, the rendezvous state and
// tensors of every pinned torch release, and hostile ones, with what CPython did with each.
const corpus = "../pickle/testdata/corpus"

func corpusFiles(t *testing.T, prefix string) map[string][]byte {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(corpus, prefix+"*"))
	if err != nil || len(names) == 0 {
		t.Fatalf("corpus %s: %v", prefix, err)
	}
	files := map[string][]byte{}
	for _, n := range names {
		if strings.HasSuffix(n, ".json") {
			continue
		}
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(n)] = b
	}
	return files
}

func judgeSet(t *testing.T, p *Policy, key string, value []byte) (Finding, bool) {
	t.Helper()
	msg, b := message(t, setReq(key, string(value)))
	return p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}}, nil)
}

// TestCorpusTorchPasses: torch's own rendezvous state of every pinned release (1.13 to 2.15: naive
// and UTC-aware heartbeats), written as torchrun writes it, and torch tensors on any key, pass.
func TestCorpusTorchPasses(t *testing.T) {
	p, _ := New(Defaults())
	n := 0
	for name, v := range corpusFiles(t, "torch-") {
		key := "/vllm/obj"
		switch {
		case strings.Contains(name, "rdzv_state") && strings.HasSuffix(name, ".b64"):
			key = "/torch.rendezvous.job"
		case strings.Contains(name, "rdzv_state"):
			continue // the raw pickle is no state value
		}
		if f, broke := judgeSet(t, p, key, v); broke {
			t.Errorf("%s on %s: %s %q", name, key, f.Rule, f.Detail)
		}
		if strings.Contains(name, "tensor") { // a tensor broadcast as base64 (its storage's bytes read decoded)
			if f, broke := judgeSet(t, p, key, []byte(base64.StdEncoding.EncodeToString(v))); broke {
				t.Errorf("%s, base64, on %s: %s %q", name, key, f.Rule, f.Detail)
			}
		}
		n++
	}
	if n < 8*(4+3) {
		t.Fatalf("only %d torch pickles", n)
	}
}

// TestCorpusBenignPasses: ordinary pickles of every protocol pass on any key, but for nested
// classes in protocols 0 to 3, which CPython reaches with builtins.getattr (protocol 4 and later,
// the default since Python 3.8, name them with a dotted name instead): getattr reaches anything
// from any function (its __globals__), so it stays denied; a policy file can allow it for a key.
func TestCorpusBenignPasses(t *testing.T) {
	p, _ := New(Defaults())
	for name, v := range corpusFiles(t, "benign") {
		f, broke := judgeSet(t, p, "/x", v)
		getattr := strings.Contains(name, "nested_class") && !strings.HasSuffix(name, "_p4.pkl") && !strings.HasSuffix(name, "_p5.pkl") ||
			strings.Contains(name, "newargs_ex") && (strings.HasSuffix(name, "_p2.pkl") || strings.HasSuffix(name, "_p3.pkl"))
		switch {
		case getattr && (!broke || f.Detail != "pickle imports builtins.getattr"):
			t.Errorf("%s: %v %q, want builtins.getattr refused", name, broke, f.Detail)
		case !getattr && broke:
			t.Errorf("%s: %s %q", name, f.Rule, f.Detail)
		}
	}
}

// TestCorpusHostileBlocked: every pickle of the corpus for which CPython imported a global on the
// deny list (its oracle: find_class as it ran) is refused on any key, and as the rendezvous state;
// the corpus's other hostile pickles (malformed before any import) are refused as the state.
func TestCorpusHostileBlocked(t *testing.T) {
	p, _ := New(Defaults())
	deny := defaultDeny()
	dangerous := 0
	for _, prefix := range []string{"hostile", "mutation", "edge"} {
		for name, v := range corpusFiles(t, prefix) {
			var oracle struct{ Globals [][2]string }
			js, err := os.ReadFile(filepath.Join(corpus, strings.TrimSuffix(strings.TrimSuffix(name, ".pkl"), ".b64")+".json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(js, &oracle); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			ran := false
			for _, g := range oracle.Globals {
				if deny.denied(pickle.Global{Module: g[0], Name: g[1], Resolved: true}) {
					ran = true
				}
			}
			if ran {
				dangerous++
				if f, broke := judgeSet(t, p, "/x", v); !broke || f.Rule != protocol.RulePickleGlobalDenied {
					t.Errorf("%s: CPython imported %v, the policy let it pass on /x", name, oracle.Globals)
				}
			}
			if prefix == "hostile" {
				if _, broke := judgeSet(t, p, "/torch.rendezvous.job", v); !broke {
					t.Errorf("%s passed as the rendezvous state", name)
				}
			}
		}
	}
	if dangerous < 50 {
		t.Fatalf("only %d pickles of the corpus import a denied global", dangerous)
	}
	t.Logf("%d pickles that CPython let import a denied global, all refused", dangerous)
}
