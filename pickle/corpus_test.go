package pickle

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// oracle is what CPython's unpickler did with a corpus item (testdata/gen_corpus.py writes it).
type oracle struct {
	Encoding    string         `json:"encoding"`
	Base64OK    *bool          `json:"base64_ok"`
	Complete    bool           `json:"complete"`
	Error       *string        `json:"error"`
	ErrorOffset *int           `json:"error_offset"`
	End         *int           `json:"end"`
	Protocol    *int           `json:"protocol"`
	Globals     [][2]string    `json:"globals"`
	GlobalsHex  [][2]string    `json:"globals_hex"` // the UTF-8 bytes in hex: JSON strings cannot hold lone surrogates
	RawGlobals  [][2]string    `json:"raw_globals"`
	Calls       map[string]int `json:"calls"`
	Hostile     bool           `json:"hostile"`
	Mutation    bool           `json:"mutation"`
	PyDisagrees bool           `json:"py_disagrees"`
	SafeOnly    string         `json:"safe_only"` // why this item is only checked for safety
	Torch       string         `json:"torch"`
}

// corpusItem is one pickle of testdata/corpus with its oracle.
type corpusItem struct {
	name string
	data []byte
	o    oracle
}

func loadCorpus(t testing.TB) []corpusItem {
	t.Helper()
	files, err := filepath.Glob("testdata/corpus/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus (run python3 testdata/gen_corpus.py): %v", err)
	}
	var items []corpusItem
	for _, f := range files {
		var it corpusItem
		it.name = strings.TrimSuffix(filepath.Base(f), ".json")
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &it.o); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		ext := ".pkl"
		if it.o.Encoding == "base64" {
			ext = ".b64"
		}
		if it.data, err = os.ReadFile(strings.TrimSuffix(f, ".json") + ext); err != nil {
			t.Fatal(err)
		}
		items = append(items, it)
	}
	return items
}

func (it corpusItem) scan(lim Limits) (Report, bool) {
	if it.o.Encoding == "base64" {
		return ScanBase64(it.data, nil, lim)
	}
	return Scan(it.data, nil, lim), true
}

// nothingRan: a report of a scan that stopped on malformed input before anything could run.
func nothingRan(r Report) bool {
	return !r.Complete && errors.Is(r.Err, ErrMalformed) && len(r.Globals) == 0 && len(r.Calls) == 0 &&
		!r.Truncated && !r.Ext && !r.Persistent
}

func callCounts(r Report) map[string]int {
	m := map[string]int{}
	for _, op := range []string{"REDUCE", "NEWOBJ", "NEWOBJ_EX", "INST", "OBJ", "BUILD"} {
		m[op] = 0
	}
	for _, c := range r.Calls {
		if _, ok := m[c.Op]; ok {
			m[c.Op]++
		}
	}
	return m
}

func pairs(r Report) [][2]string {
	var p [][2]string
	for _, g := range r.Globals {
		p = append(p, [2]string{g.Module, g.Name})
	}
	return p
}

// TestCorpus checks every corpus item against what Python did with it: the same find_class calls
// in order, the same call opcodes run, the same end or failing opcode. A mutation item (a random
// corruption) only has to be safe: every import Python did is reported, in order.
func TestCorpus(t *testing.T) {
	items := loadCorpus(t)
	var over, safe int
	for _, it := range items {
		t.Run(it.name, func(t *testing.T) {
			r, ok := it.scan(DefaultLimits())
			o := it.o
			if o.Base64OK != nil {
				if !*o.Base64OK {
					if ok && !nothingRan(r) {
						t.Fatalf("b64decode raises, ScanBase64 ok with %+v", r)
					}
					return
				}
				if !ok {
					t.Fatalf("b64decode returns, ScanBase64 not ok")
				}
			}
			if o.Mutation || o.SafeOnly != "" {
				if safeOver(t, r, o) {
					over++
				}
				safe++
				return
			}
			if r.Complete != o.Complete {
				t.Fatalf("Complete = %v (err %v), Python: complete %v (%v)", r.Complete, r.Err, o.Complete, deref(o.Error))
			}
			checkGlobals(t, r, o)
			if o.Calls != nil {
				if got := callCounts(r); !mapsEqual(got, o.Calls) {
					t.Errorf("call counts %v, Python ran %v", got, o.Calls)
				}
			}
			if o.Complete && o.End != nil && r.End != *o.End {
				t.Errorf("End = %d, Python: %d", r.End, *o.End)
			}
			if !o.Complete && o.ErrorOffset != nil {
				var e *Error
				if !errors.As(r.Err, &e) || e.Offset != *o.ErrorOffset {
					t.Errorf("Err = %v, Python raised at offset %d: %s", r.Err, *o.ErrorOffset, deref(o.Error))
				}
			}
			if o.Protocol != nil && r.Protocol != *o.Protocol {
				t.Errorf("Protocol = %d, Python: %d", r.Protocol, *o.Protocol)
			}
			if !o.Complete && !errors.Is(r.Err, ErrMalformed) {
				t.Errorf("Err = %v, want ErrMalformed (Python: %s)", r.Err, deref(o.Error))
			}
			if o.Complete && r.Truncated {
				t.Errorf("Truncated with default limits")
			}
		})
	}
	t.Logf("%d items, %d checked for safety only; the scan went on past Python's error in %d", len(items), safe, over)
}

func checkGlobals(t *testing.T, r Report, o oracle) {
	t.Helper()
	want := o.Globals
	if len(r.Globals) != len(want) {
		t.Fatalf("globals %v, Python imported %v", pairs(r), want)
	}
	for i, g := range r.Globals {
		if !g.Resolved {
			if w := o.GlobalsHex[i]; len(w[0]) <= 2*MaxStrLen && len(w[1]) <= 2*MaxStrLen {
				t.Errorf("global %d unresolved, Python imported %v", i, want[i])
			}
			continue
		}
		if !o.sameGlobal(i, g) {
			t.Errorf("global %d = %q, Python imported %q", i, [2]string{g.Module, g.Name}, want[i])
		}
	}
}

// safeOver checks a mutation item: Python's imports are a prefix of the scan's (an unresolved
// global stands for anything); when Python completed, the scan is exact. It reports whether the
// scan went on past the point where Python raised.
func safeOver(t *testing.T, r Report, o oracle) bool {
	t.Helper()
	if r.Truncated {
		return true
	}
	if len(r.Globals) < len(o.Globals) {
		t.Fatalf("scan reported %v (stopped: %v), Python imported %v (%s)", pairs(r), r.Err, o.Globals, deref(o.Error))
	}
	for i, w := range o.Globals {
		if g := r.Globals[i]; g.Resolved && !o.sameGlobal(i, g) {
			t.Fatalf("global %d = %q, Python imported %q", i, [2]string{g.Module, g.Name}, w)
		}
	}
	if o.Complete {
		if !r.Complete || len(r.Globals) != len(o.Globals) {
			t.Fatalf("Python completed with %v; scan complete %v (%v) with %v", o.Globals, r.Complete, r.Err, pairs(r))
		}
		return false
	}
	return r.Complete || len(r.Globals) > len(o.Globals)
}

// sameGlobal compares the scan's global i with Python's i-th find_class call, byte for byte;
// where the oracle could not tell the protocol (RawGlobals), with or without fix_imports.
func (o oracle) sameGlobal(i int, g Global) bool {
	got := [2]string{hex.EncodeToString([]byte(g.Module)), hex.EncodeToString([]byte(g.Name))}
	if got == o.GlobalsHex[i] {
		return true
	}
	return o.RawGlobals != nil && [2]string{g.Module, g.Name} == o.RawGlobals[i]
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
