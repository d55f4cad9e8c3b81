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

// TestCorpusBenignPasses: ordinary pickles of every protocol pass on any key when they import only
// builtins and the standard library's data types; those that import the corpus's own classes
// (corpus_classes: dataclasses, enums, namedtuples, subclasses, __reduce__) are refused by default
// and pass on a key whose policy file rule allows corpus_classes.*, as a framework's classes would.
// Nested classes in protocols 0 to 3 stay refused on any key: CPython reaches them with
// builtins.getattr, which reaches anything from any function (its __globals__): the floor no
// allow-list lifts.
func TestCorpusBenignPasses(t *testing.T) {
	def, _ := New(Defaults())
	c := Defaults()
	c.Rules = []Rule{{Name: "framework", Keys: []string{"fw/*"}, Action: "value",
		Value: &ValueRule{Kind: KindPickle, Globals: []string{"corpus_classes.*"}}},
		{Name: "framework-b64", Keys: []string{"fw64/*"}, Action: "value",
			Value: &ValueRule{Kind: KindBase64Pickle, Globals: []string{"corpus_classes.*"}}}}
	withRule, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	own := 0
	for name, v := range corpusFiles(t, "benign") {
		getattr := strings.Contains(name, "nested_class") && !strings.HasSuffix(name, "_p4.pkl") && !strings.HasSuffix(name, "_p5.pkl") ||
			strings.Contains(name, "newargs_ex") && (strings.HasSuffix(name, "_p2.pkl") || strings.HasSuffix(name, "_p3.pkl"))
		f, broke := judgeSet(t, def, "/x", v)
		key := "/fw/x"
		if strings.HasSuffix(name, ".b64") {
			key = "/fw64/x"
		}
		fw, fwBroke := judgeSet(t, withRule, key, v)
		// A function pickled by reference (benign_types: builtins.len) is not data: on no allow-list.
		function := strings.Contains(fw.Detail, "imports builtins.len:")
		switch {
		case strings.Contains(name, "outofband"):
			// Buffers out of band: no complete pickle alone, so not of the rule's kind; checked by default.
			if broke {
				t.Errorf("%s: %s %q", name, f.Rule, f.Detail)
			}
		case function:
			if !fwBroke {
				t.Errorf("%s: builtins.len passed on a key allowing corpus_classes.*", name)
			}
		case getattr:
			if !broke || !strings.Contains(f.Detail, "builtins.getattr, which runs code") || !fwBroke {
				t.Errorf("%s: %v %q; with the rule %v %q: want builtins.getattr refused on both", name, broke, f.Detail, fwBroke, fw.Detail)
			}
		case broke && !strings.Contains(f.Detail, "imports corpus_classes.") && !strings.Contains(f.Detail, "calls"):
			t.Errorf("%s: %s %q: refused for what is not the corpus's own class", name, f.Rule, f.Detail)
		case fwBroke:
			t.Errorf("%s on a key allowing corpus_classes.*: %s %q", name, fw.Rule, fw.Detail)
		case broke:
			own++
		}
	}
	if own < 20 {
		t.Fatalf("only %d pickles of the corpus's own classes refused by default", own)
	}
}

// TestCorpusHostileBlocked: every pickle of the corpus for which CPython imported a global that the
// allow-list does not hold (its oracle: find_class as it ran) is refused on any key, and as the
// rendezvous state; the corpus's other hostile pickles (malformed before any import) are refused as
// the state.
func TestCorpusHostileBlocked(t *testing.T) {
	p, _ := New(Defaults())
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
				gl := pickle.Global{Module: g[0], Name: g[1], Resolved: true}
				if importable(gl) && !p.allow.allowed(gl) {
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
		t.Fatalf("only %d pickles of the corpus import a global not allowed", dangerous)
	}
	t.Logf("%d pickles that CPython let import a global not allowed, all refused", dangerous)
}
