package pickle

import (
	"encoding/base64"
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// g is a resolved global as a test writes it: "module name".
func g(s string) Global {
	m, n, _ := strings.Cut(s, " ")
	return Global{Module: m, Name: n, Resolved: true}
}

// unresolved is a global the scan could not name.
var unresolved = Global{}

type scanCase struct {
	name    string
	pickle  string
	globals []Global // Module, Name, Resolved; Op and Offset are not compared
	calls   []string // "OP callee", callee an index or -1
	err     string   // "" for Complete, else "malformed@OFFSET" or "limit@OFFSET"
	ext     bool
	persist bool
	proto   int
	end     int // checked when not 0
	lim     Limits
}

var scanCases = []scanCase{
	// Imports and calls, every spelling.
	{name: "global reduce", pickle: "cos\nsystem\n(S'id'\ntR.", globals: []Global{g("os system")}, calls: []string{"REDUCE 0"}},
	{name: "inst imports and calls", pickle: "(S'id'\nios\nsystem\n.", globals: []Global{g("os system")}, calls: []string{"INST 0"}},
	{name: "obj calls the item after the mark", pickle: "(cos\nsystem\nS'id'\no.", globals: []Global{g("os system")}, calls: []string{"OBJ 0"}},
	{name: "newobj", pickle: "\x80\x02cm\nC\n)\x81.", globals: []Global{g("m C")}, calls: []string{"NEWOBJ 0"}, proto: 2},
	{name: "newobj_ex", pickle: "\x80\x04cm\nC\n)}\x92.", globals: []Global{g("m C")}, calls: []string{"NEWOBJ_EX 0"}, proto: 4},
	{name: "build on a call's result", pickle: "\x80\x02cm\nC\n)\x81}b.", globals: []Global{g("m C")}, calls: []string{"NEWOBJ 0", "BUILD 0"}, proto: 2},
	{name: "build on a global", pickle: "cos\npath\n}b.", globals: []Global{g("os path")}, calls: []string{"BUILD -1"}},
	{name: "calling a call's result", pickle: "cm\nf\n)R)R.", globals: []Global{g("m f")}, calls: []string{"REDUCE 0", "REDUCE -1"}},
	{name: "setitems on a call's result", pickle: "ccollections\nOrderedDict\n)R(K\x01K\x02u.", globals: []Global{g("collections OrderedDict")}, calls: []string{"REDUCE 0", "SETITEMS 0"}},
	{name: "setitem on a global", pickle: "cos\nenviron\nS'A'\nS'B'\ns.", globals: []Global{g("os environ")}, calls: []string{"SETITEM -1"}},
	{name: "appends on a global", pickle: "csys\npath\n(S'/x'\ne.", globals: []Global{g("sys path")}, calls: []string{"APPENDS -1"}},
	{name: "additems on a call's result", pickle: "\x80\x04cm\nS\n)R(K\x01\x90.", globals: []Global{g("m S")}, calls: []string{"REDUCE 0", "ADDITEMS 0"}, proto: 4},
	{name: "plain containers make no calls", pickle: "\x80\x04](K\x01e}(K\x01K\x02u\x8f(K\x03\x90\x87.", proto: 4},

	// STACK_GLOBAL through the stack and the memo.
	{name: "stack_global", pickle: "\x80\x04\x8c\x02os\x8c\x06system\x93.", globals: []Global{g("os system")}, proto: 4},
	{name: "stack_global via memoize and binget", pickle: "\x80\x04\x8c\x02os\x94\x8c\x01x\x94\x8c\x06system\x94h\x00h\x02\x93.", globals: []Global{g("os system")}, proto: 4},
	{name: "memoize index is the memo's length", pickle: "\x80\x04\x8c\x01ap9\n0\x8c\x02os\x94\x8c\x06system\x94h\x01h\x02\x93.", globals: []Global{g("os system")}, proto: 4},
	{name: "long_binget", pickle: "\x80\x04\x8c\x02osr\x00\x00\x01\x000j\x00\x00\x01\x00\x8c\x06system\x93.", globals: []Global{g("os system")}, proto: 4},
	{name: "text get and unicode", pickle: "Vos\np7\n0g7\nVsy\\u0073tem\n\x93.", globals: []Global{g("os system")}},
	{name: "string escapes", pickle: "S'\\x6fs'\nS\"sys\\164em\"\n\x93.", globals: []Global{g("os system")}},
	{name: "binstring", pickle: "U\x02osT\x06\x00\x00\x00system\x93.", globals: []Global{g("os system")}},
	{name: "dup", pickle: "\x80\x04\x8c\x02os2\x93.", globals: []Global{g("os os")}, proto: 4},
	{name: "stack_global on a call's result is unresolved", pickle: "cbuiltins\nstr\n)R\x8c\x06system\x93.", globals: []Global{g("builtins str"), unresolved}, calls: []string{"REDUCE 0"}},
	{name: "stack_global on a long str is unresolved", pickle: "\x80\x04X\x01\x04\x00\x00" + strings.Repeat("o", 1025) + "\x8c\x01x\x93.", globals: []Global{unresolved}, proto: 4},
	{name: "stack_global on the longest kept str", pickle: "\x80\x04X\x00\x04\x00\x00" + strings.Repeat("o", 1024) + "\x8c\x01x\x93.", globals: []Global{g(strings.Repeat("o", 1024) + " x")}, proto: 4},
	{name: "stack_global on an int raises", pickle: "K\x01\x8c\x01x\x93.", err: "malformed@5"},
	{name: "stack_global on bytes raises", pickle: "C\x02os\x8c\x01x\x93.", err: "malformed@7"},
	{name: "stack_global underflow", pickle: "\x8c\x01x\x93.", err: "malformed@3"},
	{name: "stack_global name not str, module unknown", pickle: "cm\nf\nK\x01\x93.", globals: []Global{g("m f")}, err: "malformed@7"},
	{name: "surrogatepass str", pickle: "\x8c\x03\xed\xa0\x80\x8c\x01x\x93.", globals: []Global{{Module: "\xed\xa0\x80", Name: "x", Resolved: true}}},

	// fix_imports follows the protocol in force when find_class runs.
	{name: "fix_imports p0", pickle: "c__builtin__\neval\n.", globals: []Global{g("builtins eval")}},
	{name: "fix_imports name mapping", pickle: "\x80\x02c__builtin__\nxrange\n.", globals: []Global{g("builtins range")}, proto: 2},
	{name: "fix_imports off at p3", pickle: "\x80\x03c__builtin__\neval\n.", globals: []Global{g("__builtin__ eval")}, proto: 3},
	{name: "fix_imports on stack_global", pickle: "\x80\x02\x8c\x0b__builtin__\x8c\x04eval\x93.", globals: []Global{g("builtins eval")}, proto: 2},
	{name: "protocol switches", pickle: "c__builtin__\nopen\n\x80\x04c__builtin__\nopen\n\x80\x02c__builtin__\nopen\n000N.",
		globals: []Global{g("builtins open"), g("__builtin__ open"), g("builtins open")}, proto: 2},

	// Lines.
	{name: "global utf-8", pickle: "c\xc3\xb6s\nx\n.", globals: []Global{g("\u00f6s x")}},
	{name: "global bad utf-8", pickle: "c\xffs\nx\n.", err: "malformed@0", end: 4},
	{name: "global surrogate not allowed", pickle: "c\xed\xa0\x80\nx\n.", err: "malformed@0"},
	{name: "inst is ascii", pickle: "(i\xc3\xb6s\nx\n.", err: "malformed@1"},
	{name: "inst without mark raises before reading", pickle: "ios\nsystem\n.", err: "malformed@0", end: 1},
	{name: "global empty module", pickle: "c\nx\n.", err: "malformed@0"},
	{name: "global long name unresolved", pickle: "cm\n" + strings.Repeat("n", 1100) + "\n.", globals: []Global{unresolved}},
	{name: "global line truncated", pickle: "cos\nsys", err: "malformed@0", end: 7},
	{name: "int line", pickle: "I0x1f\nI 12 \nI\x00junk\nI010\n(t.", end: 27},
	{name: "int bad octal", pickle: "I08\n.", err: "malformed@0"},
	{name: "long line", pickle: "L123L\nL0o17\n(t.", end: 15},
	{name: "long empty", pickle: "LL\n.", err: "malformed@0"},
	{name: "float line", pickle: "F1e308\nF-inf\nFnan\nF.5\n(t.", end: 25},
	{name: "float overflow", pickle: "F1e309\n.", err: "malformed@0"},
	{name: "float trailing space", pickle: "F1.0 \n.", err: "malformed@0"},
	{name: "put negative", pickle: "Np-1\n.", err: "malformed@1"},
	{name: "get missing", pickle: "Np1\ng2\n.", err: "malformed@4"},
	{name: "string unquoted", pickle: "Sabc\n.", err: "malformed@0"},
	{name: "string non-ascii", pickle: "S'\\xff'\n.", err: "malformed@0"},
	{name: "unicode truncated escape", pickle: "V\\u12\n.", err: "malformed@0"},
	{name: "persid", pickle: "P1\n.", persist: true},
	{name: "persid not ascii", pickle: "P\xff\n.", persist: true, err: "malformed@0"},
	{name: "binpersid", pickle: "K\x01Q.", persist: true},

	// Stack, marks, memo.
	{name: "empty input", pickle: "", err: "malformed@0"},
	{name: "stop on empty stack", pickle: ".", err: "malformed@0"},
	{name: "stop after mark", pickle: "N(.", err: "malformed@2"},
	{name: "pop pops a mark", pickle: "N(0.", end: 4},
	{name: "pop_mark", pickle: "N(NN1.", end: 6},
	{name: "pop_mark without mark", pickle: "N1.", err: "malformed@1"},
	{name: "tuple2 across a mark", pickle: "N(N\x86.", err: "malformed@3"},
	{name: "appends to a tuple", pickle: ")(Ne.", err: "malformed@3"},
	{name: "appends of nothing to a tuple", pickle: ")(e.", end: 4},
	{name: "setitems odd", pickle: "}(NNNu.", err: "malformed@5"},
	{name: "dict with a list key", pickle: "(]Nd.", err: "malformed@3"},
	{name: "tuple key holding a list", pickle: "(]\x85Nd.", err: "malformed@4"},
	{name: "reduce on an int", pickle: "K\x01)R.", err: "malformed@3"},
	{name: "reduce args not a tuple", pickle: "cm\nf\nNR.", globals: []Global{g("m f")}, err: "malformed@6"},
	{name: "newobj class an int", pickle: "K\x01)\x81.", err: "malformed@3"},
	{name: "build underflow", pickle: "Nb.", err: "malformed@1"},
	{name: "memoize empty stack", pickle: "\x94.", err: "malformed@0"},
	{name: "readonly_buffer of str", pickle: "\x8c\x01a\x98.", err: "malformed@3"},
	{name: "readonly_buffer of bytearray", pickle: "\x96\x01\x00\x00\x00\x00\x00\x00\x00a\x98.", end: 12},
	{name: "next_buffer", pickle: "\x80\x05\x97.", err: "malformed@2", proto: 5},
	{name: "unknown opcode", pickle: "N\xff.", err: "malformed@1", end: 2},
	{name: "protocol 6", pickle: "\x80\x06N.", err: "malformed@0"},
	{name: "trailing data not read", pickle: "N.garbage", end: 2},

	// EXT: the extension registry is the loading process's; pickle.loads' empty one raises, the
	// scan goes on and says so.
	{name: "ext1", pickle: "\x82\x01)R.", ext: true, calls: []string{"REDUCE -1"}},
	{name: "ext2", pickle: "\x83\x01\x01.", ext: true},
	{name: "ext4", pickle: "\x84\x01\x00\x00\x00.", ext: true},
	{name: "ext code 0", pickle: "\x82\x00.", err: "malformed@0"},
	{name: "ext4 negative", pickle: "\x84\x00\x00\x00\x80.", err: "malformed@0"},

	// Counted arguments and frames.
	{name: "frame too long", pickle: "\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00N.", err: "malformed@2", proto: 4},
	{name: "frame not enforced", pickle: "\x80\x04\x95\x01\x00\x00\x00\x00\x00\x00\x00NN\x86.", proto: 4},
	{name: "frame too long, imports after it never run", pickle: "\x80\x04\x95\x20\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93)R.", err: "malformed@2", proto: 4, end: 11},
	{name: "frame in a frame too long", pickle: "\x80\x04\x95\x40\x00\x00\x00\x00\x00\x00\x00\x95\x01\x00\x00\x00\x00\x00\x00\x00cos\nsystem\n.", err: "malformed@2", proto: 4, end: 11},
	{name: "frame past stop, there", pickle: "\x80\x04\x95\x06\x00\x00\x00\x00\x00\x00\x00N.tail", proto: 4, end: 13},
	{name: "frame too long, limit inside", pickle: "\x80\x04\x95\x20\x00\x00\x00\x00\x00\x00\x00NNNN.", err: "malformed@2", proto: 4, lim: Limits{MaxOps: 4}},
	{name: "frame length overflow", pickle: "\x95\xff\xff\xff\xff\xff\xff\xff\xff.", err: "malformed@0"},
	{name: "binbytes truncated", pickle: "B\x05\x00\x00\x00ab", err: "malformed@0", end: 7},
	{name: "long4 negative", pickle: "\x8b\xff\xff\xff\xff.", err: "malformed@0"},
	{name: "binunicode bad utf-8", pickle: "\x8c\x01\xff.", err: "malformed@0"},

	// Limits.
	{name: "max ops", pickle: "NNNN.", err: "limit@3", lim: Limits{MaxOps: 3}},
	{name: "max stack", pickle: "((((N.", err: "limit@3", lim: Limits{MaxStack: 3}},
	{name: "max memo loses gets", pickle: "\x80\x04\x8c\x02os\x94\x8c\x01x\x94h\x00h\x01\x93.", globals: []Global{unresolved}, proto: 4, lim: Limits{MaxMemo: 1}},
}

func (c scanCase) check(t *testing.T, r Report) {
	t.Helper()
	var got []Global
	for _, gl := range r.Globals {
		got = append(got, Global{Module: gl.Module, Name: gl.Name, Resolved: gl.Resolved})
	}
	if !reflect.DeepEqual(got, c.globals) {
		t.Errorf("globals %+v, want %+v", got, c.globals)
	}
	var calls []string
	for _, cl := range r.Calls {
		calls = append(calls, cl.Op+" "+itoa(cl.Callee))
	}
	if !reflect.DeepEqual(calls, c.calls) {
		t.Errorf("calls %q, want %q", calls, c.calls)
	}
	switch {
	case c.err == "":
		if !r.Complete || r.Err != nil {
			t.Errorf("not complete: %v", r.Err)
		}
	default:
		kind, off, _ := strings.Cut(c.err, "@")
		var e *Error
		if r.Complete || !errors.As(r.Err, &e) {
			t.Fatalf("Complete %v, Err %v; want %s", r.Complete, r.Err, c.err)
		}
		want := ErrMalformed
		if kind == "limit" {
			want = ErrLimit
		}
		if !errors.Is(r.Err, want) || itoa(e.Offset) != off {
			t.Errorf("Err %v, want %s", r.Err, c.err)
		}
	}
	if r.Ext != c.ext || r.Persistent != c.persist || r.Protocol != c.proto {
		t.Errorf("Ext %v Persistent %v Protocol %d, want %v %v %d", r.Ext, r.Persistent, r.Protocol, c.ext, c.persist, c.proto)
	}
	if c.end != 0 && r.End != c.end {
		t.Errorf("End %d, want %d", r.End, c.end)
	}
	if r.End > len(c.pickle) {
		t.Errorf("End %d past the input (%d)", r.End, len(c.pickle))
	}
}

func itoa(i int) string {
	if i < 0 {
		return "-" + itoa(-i)
	}
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

// TestScanTable runs each case raw, split into two buffers at every byte, and base64-encoded
// (split too): all must give the same report.
func TestScanTable(t *testing.T) {
	for _, c := range scanCases {
		t.Run(c.name, func(t *testing.T) {
			p := []byte(c.pickle)
			r := Scan(p, nil, c.lim)
			c.check(t, r)
			for k := 0; k <= len(p); k++ {
				if rk := Scan(p[:k], p[k:], c.lim); !reflect.DeepEqual(rk, r) {
					t.Fatalf("split at %d: %+v\nwhole: %+v", k, rk, r)
				}
			}
			text := []byte(base64.StdEncoding.EncodeToString(p))
			for _, k := range []int{0, min(1, len(text)), len(text) / 2, len(text)} {
				rb, ok := ScanBase64(text[:k], text[k:], c.lim)
				if !ok {
					t.Fatalf("base64 split at %d: not ok", k)
				}
				if rb.Encoding != Base64 {
					t.Errorf("Encoding %v", rb.Encoding)
				}
				rb.Encoding = Raw
				if !reflect.DeepEqual(rb, r) {
					t.Fatalf("base64 split at %d: %+v\nraw: %+v", k, rb, r)
				}
			}
		})
	}
}

// TestScanBase64Junk: characters b64decode skips do not change the scan, and strings read after
// them are still resolved (copied, since their offset no longer finds them in the text).
func TestScanBase64Junk(t *testing.T) {
	p := []byte("\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x8c\x02os\x8c\x05popen\x93h\x00h\x01\x93.")
	want := Scan(p, nil, Limits{})
	text := base64.StdEncoding.EncodeToString(p)
	for _, junked := range []string{
		"\n" + text,
		text[:3] + "!" + text[3:],
		text[:17] + "\r\n" + text[17:],
		text[:len(text)-4] + "-" + text[len(text)-4:],
	} {
		r, ok := ScanBase64([]byte(junked), nil, Limits{})
		r.Encoding = Raw
		if !ok || !reflect.DeepEqual(r, want) {
			t.Errorf("%q: ok %v %+v\nwant %+v", junked, ok, r, want)
		}
	}
}

func TestTruncatedGlobals(t *testing.T) {
	r := Scan([]byte("cm\na\n)Rcm\nb\n)Rcm\nc\n)R."), nil, Limits{MaxGlobals: 2})
	if !r.Complete || !r.Truncated || len(r.Globals) != 2 || len(r.Calls) != 2 {
		t.Fatalf("%+v", r)
	}
	if r.Calls[0].Callee != 0 || r.Calls[1].Callee != 1 {
		t.Errorf("callees %+v", r.Calls)
	}
	r = Scan([]byte("cm\na\ncm\nb\ncm\nc\n)R."), nil, Limits{MaxGlobals: 2})
	if !r.Truncated || len(r.Calls) != 1 || r.Calls[0].Callee != -1 {
		t.Errorf("a call on a global past MaxGlobals: %+v", r)
	}
}

func TestErrorString(t *testing.T) {
	r := Scan([]byte("N\xff"), nil, Limits{})
	var e *Error
	if !errors.As(r.Err, &e) || e.Op != 0xff || e.Offset != 1 {
		t.Fatalf("%v", r.Err)
	}
	if s := r.Err.Error(); !strings.Contains(s, "offset 1") || !strings.Contains(s, "0xff") {
		t.Errorf("%q", s)
	}
}

// TestBoundedMemory: what a scan allocates does not grow with its input. A 16 MiB bytes value,
// raw or in base64, costs the report and nothing else.
func TestBoundedMemory(t *testing.T) {
	p := append([]byte("\x80\x04cm\nf\n\x8e"), 0, 0, 0, 1, 0, 0, 0, 0)
	p = append(append(p, make([]byte, 16<<20)...), "\x85R."...)
	text := []byte(base64.StdEncoding.EncodeToString(p))
	for _, c := range []struct {
		name string
		scan func() Report
	}{
		{"raw", func() Report { return Scan(p[:len(p)/2], p[len(p)/2:], Limits{}) }},
		{"base64", func() Report { r, _ := ScanBase64(text, nil, Limits{}); return r }},
	} {
		if r := c.scan(); !r.Complete || len(r.Calls) != 1 {
			t.Fatalf("%s: %+v", c.name, r)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		const runs = 8
		for range runs {
			c.scan()
		}
		runtime.ReadMemStats(&after)
		if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 16<<10 {
			t.Errorf("%s: %d bytes allocated per scan of a %d-byte input", c.name, per, len(p))
		}
	}
}
