package policy

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// Pickles made by CPython 3.11's pickle.dumps (never loaded here).
const (
	// torchrun 2.15's rendezvous state as C10dRendezvousBackend.set_state writes it: round 3, a
	// participant, a node waiting and a heartbeat.
	realState = "gASVVwEAAAAAAACMN3RvcmNoLmRpc3RyaWJ1dGVkLmVsYXN0aWMucmVuZGV6dm91cy5keW5hbWljX3JlbmRlenZvdXOUjBBfUmVuZGV6dm91c1N0YXRllJOUKYGUfZQojAVyb3VuZJRLA4wIY29tcGxldGWUiYwIZGVhZGxpbmWUTowGY2xvc2VklImMDHBhcnRpY2lwYW50c5R9lGgAjAlfTm9kZURlc2OUk5QpgZR9lCiMBGFkZHKUjAZob3N0LWGUjANwaWSUTdIEjAhsb2NhbF9pZJRLAHViSwBzjAl3YWl0X2xpc3SUj5QoaAwpgZR9lChoD4wGaG9zdC1ilGgRS2NoEksBdWKQjA9yZWR1bmRhbmN5X2xpc3SUj5SMD2xhc3RfaGVhcnRiZWF0c5R9lGgNjAhkYXRldGltZZSMCGRhdGV0aW1llJOUQwoH6gsaBQAAAAAAlIWUUpRzdWIu"
	// An object whose __reduce__ is (os.system, ("touch /tmp/x",)), by protocol.
	evil0 = "63706f7369780a73797374656d0a70300a2856746f756368202f746d702f780a70310a7470320a5270330a2e"
	evil2 = "800263706f7369780a73797374656d0a7100580c000000746f756368202f746d702f7871018571025271032e"
	evil4 = "80049527000000000000008c05706f736978948c0673797374656d9493948c0c746f756368202f746d702f7894859452942e"
	// The same, base64: what a T1 attacker writes to the state key.
	evil4b64 = "gASVJwAAAAAAAACMBXBvc2l4lIwGc3lzdGVtlJOUjAx0b3VjaCAvdG1wL3iUhZRSlC4="
	// subprocess.Popen(["id"]), protocol 5.
	evilPopen = "80059524000000000000008c0a73756270726f63657373948c05506f70656e9493945d948c0269649461859452942e"
	// {"a": [1, 2, 3], "b": "x"}, protocol 4; datetime.datetime(2026, 1, 1), protocol 2.
	benignDict = "8004951b000000000000007d94288c0161945d94284b014b024b03658c0162948c017894752e"
	benignDT2  = "8002636461746574696d650a6461746574696d650a7100635f636f646563730a656e636f64650a7101580b00000007c3aa0101000000000000710258060000006c6174696e3171038671045271058571065271072e"
)

const stateKey = "/torch.rendezvous.job-7"

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// message encodes r for G6 and decodes it back: the message and its bytes.
func message(t testing.TB, r protocol.Request) (*protocol.Message, []byte) {
	t.Helper()
	b, err := protocol.Append(nil, protocol.G6, protocol.Request{Op: protocol.OpValidate})
	if err != nil {
		t.Fatal(err)
	}
	start := len(b)
	if b, err = protocol.Append(b, protocol.G6, r); err != nil {
		t.Fatal(err)
	}
	d := protocol.NewDecoder(protocol.Config{Gen: protocol.GenSetting{Gen: protocol.G6}, Limits: protocol.DefaultLimits()})
	var msg *protocol.Message
	for p := 0; p < len(b); {
		n, m, err := d.Scan(b[p:])
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		p += n
		if m != nil && m.Op == r.Op {
			c := *m
			msg = &c
		}
	}
	if msg == nil {
		t.Fatal("no message")
	}
	return msg, b[start:]
}

type checkCase struct {
	name   string
	req    protocol.Request
	rule   protocol.Rule // "" for none
	detail string        // a substring of Finding.Detail
	field  protocol.FieldKind
}

func setReq(key, value string) protocol.Request {
	return protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte(value)}
}

func defaultCases(t testing.TB) []checkCase {
	raw := func(h string) string { return string(unhex(t, h)) }
	b64 := func(h string) string { return base64.StdEncoding.EncodeToString(unhex(t, h)) }
	many := protocol.Request{Op: protocol.OpMultiSet}
	for i := range 5 {
		many.Keys = append(many.Keys, []byte("/k"+string(rune('0'+i))))
		many.Values = append(many.Values, []byte("v"))
	}
	many.Keys[4], many.Values[4] = []byte(stateKey), []byte(evil4b64)
	return []checkCase{
		{name: "state key: the sentinel", req: setReq(stateKey, "Y2FuaW1hZGFt")},
		{name: "state key: torch's own state", req: setReq(stateKey, realState)},
		{name: "state key: base64 pickle of os.system", req: setReq(stateKey, evil4b64),
			rule: protocol.RuleRendezvousStateInvalid, detail: "posix.system", field: protocol.FieldValue},
		{name: "state key without the client's slash", req: setReq("torch.rendezvous.x", evil4b64),
			rule: protocol.RuleRendezvousStateInvalid, detail: "posix.system"},
		{name: "state key: not base64", req: setReq(stateKey, "{not base64}"),
			rule: protocol.RuleRendezvousStateInvalid, detail: "not base64"},
		{name: "state key: a base64 pickle of a dict is no state", req: setReq(stateKey, b64(benignDict)),
			rule: protocol.RuleRendezvousStateInvalid, detail: "not a torch rendezvous state"},
		{name: "state key: half of torch's state", req: setReq(stateKey, realState[:200]),
			rule: protocol.RuleRendezvousStateInvalid},
		{name: "state key: COMPARE_SET's desired value is judged", req: protocol.Request{Op: protocol.OpCompareSet,
			Key: []byte(stateKey), Value: []byte(realState), Desired: []byte(evil4b64)},
			rule: protocol.RuleRendezvousStateInvalid, field: protocol.FieldDesired},
		{name: "state key: COMPARE_SET to torch's state from the sentinel", req: protocol.Request{Op: protocol.OpCompareSet,
			Key: []byte(stateKey), Value: []byte("Y2FuaW1hZGFt"), Desired: []byte(realState)}},
		{name: "state key: the fifth pair of a MULTI_SET", req: many,
			rule: protocol.RuleRendezvousStateInvalid, detail: "posix.system"},
		{name: "state key: QUEUE_PUSH", req: protocol.Request{Op: protocol.OpQueuePush, Key: []byte(stateKey), Value: []byte(evil4b64)},
			rule: protocol.RuleRendezvousStateInvalid},
		{name: "state key: APPEND of anything", req: protocol.Request{Op: protocol.OpAppend, Key: []byte(stateKey), Value: []byte("AA==")},
			rule: protocol.RuleRendezvousStateInvalid, detail: "APPEND", field: protocol.FieldKey},
		{name: "the round's keys are not the state", req: setReq(stateKey+".0/MASTER_ADDR", "10.1.2.3")},
		{name: "GET of the state", req: protocol.Request{Op: protocol.OpGet, Key: []byte(stateKey)}},
		{name: "any key: raw pickle of os.system, protocol 0", req: setReq("/vllm/obj", raw(evil0)),
			rule: protocol.RulePickleGlobalDenied, detail: "pickle imports posix.system"},
		{name: "any key: protocol 2", req: setReq("/vllm/obj", raw(evil2)), rule: protocol.RulePickleGlobalDenied},
		{name: "any key: protocol 4", req: setReq("/vllm/obj", raw(evil4)), rule: protocol.RulePickleGlobalDenied},
		{name: "any key: base64", req: setReq("/x", evil4b64), rule: protocol.RulePickleGlobalDenied,
			detail: "base64 pickle imports posix.system"},
		{name: "any key: subprocess.Popen, protocol 5", req: setReq("/x", raw(evilPopen)),
			rule: protocol.RulePickleGlobalDenied, detail: "subprocess.Popen"},
		{name: "any key: hostile import, then garbage", req: setReq("/x", raw(evil0)[:20]+"\xff\xff"),
			rule: protocol.RulePickleGlobalDenied},
		{name: "any key: a pickled dict", req: setReq("/x", raw(benignDict))},
		{name: "any key: a pickled datetime, protocol 2", req: setReq("/x", raw(benignDT2))},
		{name: "any key: the dict, base64", req: setReq("/x", b64(benignDict))},
		{name: "any key: APPEND of a pickle", req: protocol.Request{Op: protocol.OpAppend, Key: []byte("/x"), Value: []byte(raw(evil4))},
			rule: protocol.RulePickleGlobalDenied},
		{name: "any key: an address", req: setReq("/rank_0", "127.0.0.1:41235")},
		{name: "any key: an integer", req: setReq("/init/", "1")},
		{name: "ADD has no value", req: protocol.Request{Op: protocol.OpAdd, Key: []byte(stateKey), Int: 1}},
	}
}

// TestDefaultRules judges each case whole, and split in two at every byte (a message that arrived
// over several reads): the finding must not depend on where.
func TestDefaultRules(t *testing.T) {
	p, err := New(Defaults())
	if err != nil {
		t.Fatal(err)
	}
	src := netip.MustParseAddr("10.0.0.9")
	for _, c := range defaultCases(t) {
		t.Run(c.name, func(t *testing.T) {
			msg, b := message(t, c.req)
			for cut := 0; cut <= len(b); cut++ {
				f, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{A: b[:cut], B: b[cut:]}, Src: src}, nil)
				if c.rule == "" {
					if broke {
						t.Fatalf("cut %d: %s (%s), want none", cut, f.Rule, f.Detail)
					}
					continue
				}
				if !broke || f.Rule != c.rule || !strings.Contains(f.Detail, c.detail) {
					t.Fatalf("cut %d: got %v %s %q, want %s %q", cut, broke, f.Rule, f.Detail, c.rule, c.detail)
				}
				if c.field != protocol.FieldNone && f.Field.Kind != c.field {
					t.Fatalf("field %s, want %s", f.Field.Kind, c.field)
				}
				if f.Mode != Enforce || f.Key == "" {
					t.Fatalf("finding %+v: want enforce and the key", f)
				}
			}
		})
	}
}

func TestModes(t *testing.T) {
	msg, b := message(t, setReq(stateKey, evil4b64))
	m := Message{Msg: msg, Bytes: protocol.Split{B: b}}
	for _, tc := range []struct {
		state, globals Mode
		rule           protocol.Rule
		warned         []protocol.Rule
	}{
		{state: Enforce, globals: Enforce, rule: protocol.RuleRendezvousStateInvalid},
		{state: Monitor, globals: Enforce, rule: protocol.RulePickleGlobalDenied, warned: []protocol.Rule{protocol.RuleRendezvousStateInvalid}},
		{state: Monitor, globals: Monitor, warned: []protocol.Rule{protocol.RuleRendezvousStateInvalid, protocol.RulePickleGlobalDenied}},
		{state: Off, globals: Monitor, warned: []protocol.Rule{protocol.RulePickleGlobalDenied}},
		{state: Off, globals: Off},
	} {
		c := Defaults()
		c.RendezvousState, c.PickleGlobals = tc.state, tc.globals
		p, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		var warned []protocol.Rule
		f, broke := p.Check(m, func(f Finding) { warned = append(warned, f.Rule) })
		if got := map[bool]protocol.Rule{true: f.Rule}[broke]; got != tc.rule {
			t.Errorf("%v/%v: broke %q, want %q", tc.state, tc.globals, got, tc.rule)
		}
		if strings.Join(rulesOf(warned), ",") != strings.Join(rulesOf(tc.warned), ",") {
			t.Errorf("%v/%v: warned %v, want %v", tc.state, tc.globals, warned, tc.warned)
		}
	}
}

func rulesOf(rs []protocol.Rule) []string {
	var s []string
	for _, r := range rs {
		s = append(s, string(r))
	}
	return s
}

func TestDenyGlobals(t *testing.T) {
	for _, tc := range []struct {
		module, name string
		denied       bool
	}{
		{"posix", "system", true}, {"os", "popen", true}, {"os.path", "join", true},
		{"builtins", "eval", true}, {"builtins", "getattr", true}, {"__builtin__", "exec", true},
		{"subprocess", "Popen", true}, {"runpy", "run_path", true}, {"importlib", "import_module", true},
		{"operator", "attrgetter", true}, {"torch.serialization", "os.system", true},
		{"collections", "OrderedDict.__init__.__globals__", true}, {"torch", "load", true},
		{"builtins", "set", false}, {"builtins", "dict", false}, {"collections", "OrderedDict", false},
		{"datetime", "datetime", false}, {"torch._utils", "_rebuild_tensor_v2", false},
		{"copyreg", "_reconstructor", false}, {"_codecs", "encode", false}, {"numpy.core.multiarray", "_reconstruct", false},
		{"torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_RendezvousState", false},
		{"mypkg.models", "Config.Inner", false}, {"ossify", "x", false},
		{"pathlib", "os", true}, {"torch.serialization", "pickle", true}, {"mypkg", "sysconfig_helper", false},
		{"_ctypes", "_unpickle", false}, {"_ctypes", "dlopen", true}, {"ctypes", "CDLL", true},
	} {
		g := defaultDeny()
		gl := pickleGlobal(tc.module, tc.name)
		if got := g.denied(gl); got != tc.denied {
			t.Errorf("%s.%s: denied %v, want %v", tc.module, tc.name, got, tc.denied)
		}
	}
}

func pickleGlobal(module, name string) pickle.Global {
	return pickle.Global{Module: module, Name: name, Resolved: true, Op: "STACK_GLOBAL"}
}

// BenchmarkCheck is the policy's cost per message: a torchrun state write (the rendezvous rule
// decodes and scans its base64 pickle, then the pickle rule scans it again raw and as base64), a
// small SET of an address, a 1 MiB raw pickle of bytes (a tensor-like payload), and a WAIT of one
// key (torch's get: judged for a key named twice), with what a server keeps of the store.
func BenchmarkCheck(b *testing.B) {
	p, err := New(Defaults())
	if err != nil {
		b.Fatal(err)
	}
	p = p.WithStore(Store{Appends: NewAppends(1 << 16)})        // not Written: the SET would be a second write
	big := append([]byte{0x80, 0x04, 0x8e}, make([]byte, 8)...) // BINBYTES8 of 1 MiB, then STOP
	big[3], big[5] = 0x00, 0x10
	big = append(append(big, make([]byte, 1<<20)...), '.')
	for _, bc := range []struct {
		name string
		req  protocol.Request
	}{
		{"rendezvous state", protocol.Request{Op: protocol.OpCompareSet, Key: []byte(stateKey), Value: []byte("Y2FuaW1hZGFt"), Desired: []byte(realState)}},
		{"small SET", setReq("/torch.rendezvous.job-7.0/MASTER_ADDR", "10.1.2.3")},
		{"1 MiB pickle", protocol.Request{Op: protocol.OpSet, Key: []byte("/vllm/t"), Value: big}},
		{"WAIT of one key", protocol.Request{Op: protocol.OpWait, Keys: [][]byte{[]byte("/torch.rendezvous.job-7.0/MASTER_ADDR")}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			msg, raw := message(b, bc.req)
			m := Message{Msg: msg, Bytes: protocol.Split{B: raw}}
			if _, broke := p.Check(m, nil); broke {
				b.Fatal("the benchmark's message breaks a rule")
			}
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				p.Check(m, nil)
			}
		})
	}
}

// TestFileAllowListWidensTheDefaultForItsKeys: a policy file's pickle allow-list for a key adds a
// framework's own classes to the default allow-list for that key only; it cannot lift the deny
// list's floor, nor allow a call of what is not a global.
func TestFileAllowListWidensTheDefaultForItsKeys(t *testing.T) {
	thing := "\x80\x04\x8c\x05mylib\x8c\x05Thing\x93)\x81."     // mylib.Thing(), a framework's class
	getattr := "\x80\x04\x8c\x08builtins\x8c\x07getattr\x93."   // builtins.getattr, as a value
	callOnCall := "\x80\x04\x8c\x05mylib\x8c\x05Thing\x93)R)R." // mylib.Thing()()
	c := Defaults()
	c.Rules = []Rule{{Name: "fw", Keys: []string{"fw/*"}, Action: "value",
		Value: &ValueRule{Kind: KindPickle, Globals: []string{"mylib.Thing", "builtins.getattr"}}}}
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, value, detail string }{
		{"/fw/x", thing, ""},
		{"/other", thing, "imports mylib.Thing: not on the allow-list"},
		{"/fw/x", getattr, "imports builtins.getattr, which runs code: never allowed"},
		{"/fw/x", callOnCall, "calls what is not an allowed global (REDUCE at offset 20)"},
	} {
		f, broke := judgeSet(t, p, tc.key, []byte(tc.value))
		if tc.detail == "" && broke || tc.detail != "" && (!broke || f.Rule != protocol.RulePickleGlobalDenied || !strings.Contains(f.Detail, tc.detail)) {
			t.Errorf("%s %q: %v %s %q, want %q", tc.key, tc.value, broke, f.Rule, f.Detail, tc.detail)
		}
	}
}

// TestPickleHidingPastTheBounds: a denied global after more globals than the scanner records, or
// past its stack bound, is refused all the same.
func TestPickleHidingPastTheBounds(t *testing.T) {
	p, _ := New(Defaults())
	global := func(mod, name string) string {
		return "\x8c" + string(rune(len(mod))) + mod + "\x8c" + string(rune(len(name))) + name + "\x93"
	}
	many := "\x80\x04" + strings.Repeat(global("builtins", "dict")+"0", 300) + global("posix", "system") + "."
	deep := "\x80\x04" + strings.Repeat("(", 1<<16) + global("posix", "system") + "."
	for name, v := range map[string]string{"many globals": many, "deep marks": deep} {
		msg, b := message(t, setReq("/x", v))
		f, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}}, nil)
		if !broke || f.Rule != protocol.RulePickleGlobalDenied {
			t.Errorf("%s: %v %q", name, broke, f.Detail)
		}
	}
}

// TestWhatTorchStorageLoads: torch.storage._load_from_bytes runs torch.load on bytes inside the
// pickle: a pickle hidden there is inspected like the outer one; a zip there is refused.
func TestWhatTorchStorageLoads(t *testing.T) {
	p, _ := New(Defaults())
	loader := func(inner []byte) string {
		return "\x80\x02ctorch.storage\n_load_from_bytes\nq\x00B" + string([]byte{byte(len(inner)), byte(len(inner) >> 8), 0, 0}) +
			string(inner) + "\x85R."
	}
	magic := "\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19." // torch.save's magic number, first of its pickles
	for _, tc := range []struct {
		name   string
		inner  string
		detail string
	}{
		{"the magic number, then an os.system", magic + string(unhex(t, evil4)), "loads with torch.storage._load_from_bytes a pickle that imports posix.system"},
		{"a tar archive", tarHeader(), "tar archive"},
		{"os.system first", string(unhex(t, evil0)), "imports posix.system"},
		{"a zip", "PK\x03\x04" + strings.Repeat("\x00", 40), "zip archive"},
		{"a loader in a loader", loader([]byte(magic)), "nests"},
		{"torch's magic and nothing else", magic, ""},
	} {
		f, broke := judgeSet(t, p, "/vllm/t", []byte(loader([]byte(tc.inner))))
		if f64, broke64 := judgeSet(t, p, "/vllm/t", []byte(base64.StdEncoding.EncodeToString([]byte(loader([]byte(tc.inner)))))); broke64 != broke ||
			broke && !strings.Contains(f64.Detail, tc.detail) {
			t.Errorf("%s, base64: %v %q", tc.name, broke64, f64.Detail)
		}
		if tc.detail == "" {
			if broke {
				t.Errorf("%s: %q", tc.name, f.Detail)
			}
			continue
		}
		if !broke || !strings.Contains(f.Detail, tc.detail) {
			t.Errorf("%s: %v %q, want %q", tc.name, broke, f.Detail, tc.detail)
		}
	}
}

// TestStateCallsTorchNeverMakes: a state pickle of torch's own globals that also sets a class's
// attributes (BUILD on the class itself) is no state torch writes.
func TestStateCallsTorchNeverMakes(t *testing.T) {
	p, _ := New(Defaults())
	const mod = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
	sg := func(name string) string {
		return "\x8c" + string(rune(len(mod))) + mod + "\x8c" + string(rune(len(name))) + name + "\x93"
	}
	state := "\x80\x04" + sg("_RendezvousState") + ")\x81}b"
	for _, tc := range []struct {
		name, pickle, detail string
	}{
		{"the state alone", state + ".", ""},
		{"a BUILD of the node class itself", state + sg("_NodeDesc") + "}\x8c\x01x\x8c\x01ysb0.", "BUILD of an object that is no global"},
		{"a REDUCE of the state class", "\x80\x04" + sg("_RendezvousState") + ")R.", "REDUCE of " + mod + "._RendezvousState"},
	} {
		f, broke := judgeSet(t, p, "/torch.rendezvous.j", []byte(base64.StdEncoding.EncodeToString([]byte(tc.pickle))))
		if tc.detail == "" && broke || tc.detail != "" && (!broke || !strings.Contains(f.Detail, tc.detail)) {
			t.Errorf("%s: %v %q, want %q", tc.name, broke, f.Detail, tc.detail)
		}
	}
}

// tarHeader is a V7 tar header (no magic) whose checksum holds: tarfile.open reads it.
func tarHeader() string {
	h := make([]byte, 512)
	copy(h, "pickle")
	copy(h[100:], "0000644\x00")
	copy(h[124:], "00000000010\x00")
	sum := 0
	for i, c := range h {
		if i >= 148 && i < 156 {
			c = ' '
		}
		sum += int(c)
	}
	copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
	return string(h) + strings.Repeat("\x00", 512)
}

// TestWhatTorchStorageLoadsAtOldProtocols: at pickle protocols 0 to 2 a tensor's torch.save stream
// is a str handed to _codecs.encode(s, "latin1"): it is decoded and judged as a bytes literal is;
// bytes made from a list of ints (bytearray, bytes), which the guard does not read, are refused.
func TestWhatTorchStorageLoadsAtOldProtocols(t *testing.T) {
	p, _ := New(Defaults())
	latin1 := func(inner []byte) string {
		var u []byte
		for _, c := range inner {
			u = utf8.AppendRune(u, rune(c))
		}
		return "\x80\x02ctorch.storage\n_load_from_bytes\nq\x00c_codecs\nencode\nq\x01X" +
			string([]byte{byte(len(u)), byte(len(u) >> 8), 0, 0}) + string(u) + "X\x06\x00\x00\x00latin1\x86R\x85R."
	}
	rawEscape := func(inner []byte) string { // protocol 0: UNICODE, raw-unicode-escape
		var u []byte
		for _, c := range inner {
			if c == '\\' || c == '\n' || c >= 0x80 {
				u = fmt.Appendf(u, "\\u%04x", c)
			} else {
				u = append(u, c)
			}
		}
		return "ctorch.storage\n_load_from_bytes\np0\n(c_codecs\nencode\np1\n(V" + string(u) + "\nVlatin1\ntRtR."
	}
	magic := "\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."
	evil := []byte(magic + string(unhex(t, evil4)))
	for _, tc := range []struct{ name, value, detail string }{
		{"BINUNICODE, torch's magic", latin1([]byte(magic)), ""},
		{"BINUNICODE, an os.system after the magic", latin1(evil), "a pickle that imports posix.system"},
		{"UNICODE, torch's magic", rawEscape([]byte(magic)), ""},
		{"UNICODE, an os.system after the magic", rawEscape(evil), "a pickle that imports posix.system"},
		{"a stream in another codec: cp037", strings.Replace(latin1([]byte(magic)), "X\x06\x00\x00\x00latin1", "X\x05\x00\x00\x00cp037", 1), "names the codec cp037"},
		{"a bytearray of ints", "\x80\x02ctorch.storage\n_load_from_bytes\ncbuiltins\nbytearray\n]K\x80a\x85R\x85R.",
			"makes bytes with builtins.bytearray"},
	} {
		f, broke := judgeSet(t, p, "/vllm/t", []byte(tc.value))
		if tc.detail == "" && broke || tc.detail != "" && (!broke || !strings.Contains(f.Detail, tc.detail)) {
			t.Errorf("%s: %v %q, want %q", tc.name, broke, f.Detail, tc.detail)
		}
	}
}
