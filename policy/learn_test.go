package policy

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/storeguard/storeguard/internal/glob"
	"github.com/storeguard/storeguard/protocol"
)

// More pickles by CPython 3.11's pickle.dumps: an OrderedDict and a Fraction, protocol 4; a list,
// protocol 0 (text that is valid UTF-8 too).
const (
	orderedDict4 = "80049529000000000000008c0b636f6c6c656374696f6e73948c0b4f726465726564446963749493942952948c0161944b01732e"
	thing4       = "\x80\x04\x8c\x05mylib\x8c\x05Thing\x93)\x81." // mylib.Thing(): a framework's own class
	fraction4    = "80049522000000000000008c096672616374696f6e73948c084672616374696f6e9493944b014b03869452942e"
	list0        = "286c70300a49310a6149320a612e"
)

func TestKeyPattern(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"/torch.rendezvous.job.0/MASTER_ADDR", "/torch.rendezvous.job.*/MASTER_ADDR"},
		{"/torch.rendezvous.job.12/MASTER_ADDR", "/torch.rendezvous.job.*/MASTER_ADDR"},
		{"/rank_3", "/rank_*"},
		{"/broadcast/17", "/broadcast/*"},
		{"/a1b22c333", "/a*b*c*"},
		{"/2024-01-01", "/*-*-*"},
		{"/torchelastic/agent/store", "/torchelastic/agent/store"},
		{"key/without/slash/7", "key/without/slash/*"},
		{"/", "/"},
		{"7", "*"},
		{"/what?", "/what*"},
		{"/a*1*?2", "/a*"}, // a star or ? of the key is a star; runs of them are one
		{"/\x00\xff9", "/\x00\xff*"},
	} {
		got, ok := KeyPattern([]byte(tc.key))
		if !ok || got != tc.want {
			t.Errorf("KeyPattern(%q) = %q, %v; want %q", tc.key, got, ok, tc.want)
		}
		if !glob.Match([]byte(got), []byte(tc.key)) {
			t.Errorf("%q does not match its own key %q", got, tc.key)
		}
	}
	if _, ok := KeyPattern(nil); ok {
		t.Error("an empty key has a pattern")
	}
}

func TestValueKinds(t *testing.T) {
	raw := func(h string) string { return string(unhex(t, h)) }
	b64 := func(h string) string { return base64.StdEncoding.EncodeToString(unhex(t, h)) }
	for _, tc := range []struct {
		name, value string
		kind        string
		globals     []string
	}{
		{"an integer", "42", KindInteger, nil},
		{"a negative integer with spaces", " -7\n", KindInteger, nil},
		{"JSON", `{"rank": 3, "hosts": ["a", "b"]}`, KindJSON, nil},
		{"an address", "10.0.0.7:29500", KindUTF8, nil},
		{"empty", "", KindUTF8, nil},
		// The globals learned are those the default allow-list lacks: a framework's own.
		{"torch's rendezvous state", realState, KindBase64Pickle, []string{}},
		{"a pickled dict: a pickle importing nothing", raw(benignDict), KindPickle, []string{}},
		{"an OrderedDict", raw(orderedDict4), KindPickle, []string{}},
		{"a datetime, protocol 2", raw(benignDT2), KindPickle, []string{}},
		{"a list, protocol 0: UTF-8 too, pickle is narrower", raw(list0), KindPickle, []string{}},
		{"the OrderedDict, base64", b64(orderedDict4), KindBase64Pickle, []string{}},
		{"a framework's class", thing4, KindPickle, []string{"mylib.Thing"}},
		{"a framework's class, base64", base64.StdEncoding.EncodeToString([]byte(thing4)), KindBase64Pickle, []string{"mylib.Thing"}},
		{"half a pickle", raw(orderedDict4)[:20], KindAny, nil},
		{"bytes", "\xff\xfe\x00\x01", KindAny, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := fieldView{op: protocol.OpSet, val: protocol.Field{Kind: protocol.FieldValue, Len: uint64(len(tc.value))}}
			for cut := 0; cut <= len(tc.value); cut += max(1, len(tc.value)/7) {
				v.va, v.vb = []byte(tc.value[:cut]), []byte(tc.value[cut:])
				ks, globals := valueKinds(&v)
				if got := ks.narrowest(); got != tc.kind {
					t.Fatalf("cut %d: kind %s (%05b), want %s", cut, got, ks, tc.kind)
				}
				var g []string
				switch tc.kind {
				case KindPickle:
					g = globals[0]
				case KindBase64Pickle:
					g = globals[1]
				}
				if !reflect.DeepEqual(g, tc.globals) {
					t.Fatalf("cut %d: globals %q, want %q", cut, g, tc.globals)
				}
			}
		})
	}
}

func TestMarginBytes(t *testing.T) {
	for _, tc := range []struct{ largest, want int64 }{
		{0, 4096}, {1, 4096}, {2048, 4096}, {2049, 8192}, {5000, 16384}, {1 << 20, 2 << 20}, {1<<20 + 1, 4 << 20},
	} {
		if got := marginBytes(tc.largest); got != tc.want {
			t.Errorf("marginBytes(%d) = %d, want %d", tc.largest, got, tc.want)
		}
	}
}

// learn runs reqs through a policy with the default rules and a Learner, as `policy learn` does,
// and returns the learner.
func learn(t *testing.T, reqs []protocol.Request) *Learner {
	t.Helper()
	l := NewLearner()
	c := Defaults()
	c.Learn = l
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		msg, b := message(t, r)
		p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}, Src: netip.MustParseAddr("10.0.0.2")}, nil)
	}
	return l
}

// judge checks reqs against the default rules and rules, every rule in mode (or as written, for
// ""), and returns every finding.
func judge(t *testing.T, rules []Rule, mode string, reqs []protocol.Request) []Finding {
	t.Helper()
	c := Defaults()
	for _, r := range rules {
		if mode != "" {
			r.Mode = mode
		}
		c.Rules = append(c.Rules, r)
	}
	p, err := New(c)
	if err != nil {
		t.Fatalf("the learned rules do not compile: %v", err)
	}
	var out []Finding
	for _, r := range reqs {
		msg, b := message(t, r)
		for _, cut := range []int{0, len(b) / 2, len(b)} {
			f, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{A: b[:cut], B: b[cut:]}, Src: netip.MustParseAddr("10.0.0.2")},
				func(f Finding) { out = append(out, f) })
			if broke {
				out = append(out, f)
			}
		}
	}
	return out
}

// jobTraffic is a torchrun c10d job's store traffic and a vLLM-style pickle broadcast, as clients send them.
func jobTraffic(t *testing.T) []protocol.Request {
	raw := func(h string) []byte { return unhex(t, h) }
	var reqs []protocol.Request
	reqs = append(reqs, protocol.Request{Op: protocol.OpCompareSet, Key: []byte(stateKey), Value: []byte("Y2FuaW1hZGFt"), Desired: []byte(realState)})
	for rank := range 4 {
		round := fmt.Sprintf("/torch.rendezvous.job-7.%d/", rank%2)
		reqs = append(reqs,
			protocol.Request{Op: protocol.OpGet, Key: []byte(stateKey)},
			protocol.Request{Op: protocol.OpSet, Key: []byte(round + "MASTER_ADDR"), Value: []byte("node-0.cluster")},
			protocol.Request{Op: protocol.OpSet, Key: []byte(round + "MASTER_PORT"), Value: []byte("29501")},
			protocol.Request{Op: protocol.OpAdd, Key: []byte(round + "torchelastic/role_info/counter"), Int: 1},
			protocol.Request{Op: protocol.OpMultiSet, Keys: [][]byte{[]byte(fmt.Sprintf("/torchelastic/role_info/%d", rank))},
				Values: [][]byte{[]byte(`{"role": "default", "rank": 0}`)}},
			protocol.Request{Op: protocol.OpMultiGet, Keys: [][]byte{[]byte("/torchelastic/role_info/0"), []byte("/torchelastic/role_info/1")}},
			protocol.Request{Op: protocol.OpWait, Keys: [][]byte{[]byte(fmt.Sprintf("/broadcast/%d", rank))}},
			protocol.Request{Op: protocol.OpSet, Key: []byte(fmt.Sprintf("/broadcast/%d", rank)), Value: []byte([]string{string(raw(benignDict)), string(raw(orderedDict4)), string(raw(benignDT2)), thing4}[rank])},
			protocol.Request{Op: protocol.OpGet, Key: []byte(fmt.Sprintf("/broadcast/%d", rank))},
			protocol.Request{Op: protocol.OpPing},
			protocol.Request{Op: protocol.OpGetNumKeys},
		)
	}
	return reqs
}

// TestLearnedPolicyPassesWhatItLearned: the starting policy gives no finding, in enforce or
// monitor mode, on the traffic it was learned from, whether a message arrived whole or split.
func TestLearnedPolicyPassesWhatItLearned(t *testing.T) {
	reqs := jobTraffic(t)
	l := learn(t, reqs)
	rules := l.Rules()
	for _, mode := range []string{"", "enforce", "monitor"} {
		if f := judge(t, rules, mode, reqs); len(f) > 0 {
			t.Errorf("mode %q: %d findings on the learned traffic, the first %+v", mode, len(f), f[0])
		}
	}
	if s := l.Stats(); s.Messages != uint64(len(reqs)) || s.Skipped != 0 || s.Dropped != 0 {
		t.Errorf("stats %+v", s)
	}
	byName := map[string]Rule{}
	for _, r := range rules {
		byName[strings.Join(r.Keys, ",")+" "+r.Action] = r
	}
	want := map[string]Rule{
		"/broadcast/* value": {Ops: []string{"set"}, Value: &ValueRule{Kind: KindPickle, MaxBytes: 4096,
			Globals: []string{"mylib.Thing"}}},
		"/broadcast/* allow":                                             {Ops: []string{"get", "wait"}},
		"/torch.rendezvous.job-*.*/MASTER_PORT value":                    {Ops: []string{"set"}, Value: &ValueRule{Kind: KindInteger, MaxBytes: 4096}},
		"/torch.rendezvous.job-*.*/MASTER_ADDR value":                    {Ops: []string{"set"}, Value: &ValueRule{Kind: KindUTF8, MaxBytes: 4096}},
		"/torch.rendezvous.job-*.*/torchelastic/role_info/counter allow": {Ops: []string{"add"}},
		"/torch.rendezvous.job-* value":                                  {Ops: []string{"compare_set"}, Value: &ValueRule{Kind: KindBase64Pickle, MaxBytes: 4096}},
		"/torch.rendezvous.job-* allow":                                  {Ops: []string{"get"}},
		"/torchelastic/role_info/* value":                                {Ops: []string{"multi_set"}, Value: &ValueRule{Kind: KindJSON, MaxBytes: 4096}},
		"/torchelastic/role_info/* allow":                                {Ops: []string{"multi_get"}},
		" allow":                                                         {Ops: []string{"get_num_keys", "ping"}},
		" deny":                                                          {Mode: "monitor"},
	}
	for k, w := range want {
		got, ok := byName[k]
		if !ok {
			t.Errorf("no rule %q in %+v", k, rules)
			continue
		}
		if !reflect.DeepEqual(got.Ops, w.Ops) || !reflect.DeepEqual(got.Value, w.Value) || got.Mode != w.Mode {
			t.Errorf("%s: ops %v value %+v mode %q; want %v %+v %q", k, got.Ops, got.Value, got.Mode, w.Ops, w.Value, w.Mode)
		}
	}
	if last := rules[len(rules)-1]; last.Name != NotLearned || len(last.Keys) > 0 || len(last.Ops) > 0 {
		t.Errorf("last rule %+v, want the catch-all", last)
	}
}

// TestNotLearnedIsRecorded: what the job did not do is would_block by the catch-all (monitor
// mode, forwarded), a value of a learned key that is not of its kind is value_invalid, and the
// default rules still stop a hostile pickle on a learned pickle key.
func TestNotLearnedIsRecorded(t *testing.T) {
	rules := learn(t, jobTraffic(t)).Rules()
	p, err := New(Config{RendezvousState: Enforce, PickleGlobals: Enforce, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		req    protocol.Request
		rule   protocol.Rule
		mode   Mode
		detail string
	}{
		{"a SET of a key the job never wrote", setReq("/torch.rendezvous.job-7.0/backdoor", "x"),
			protocol.RulePolicyDenied, Monitor, "rule not-learned: set denied"},
		{"a DELETE_KEY of a learned key: an op it never did", protocol.Request{Op: protocol.OpDeleteKey, Key: []byte("/broadcast/1")},
			protocol.RulePolicyDenied, Monitor, "rule not-learned: delete_key denied"},
		{"LIST_KEYS, never done", protocol.Request{Op: protocol.OpListKeys},
			protocol.RulePolicyDenied, Monitor, "rule not-learned: list_keys denied"},
		{"a broadcast importing a global not learned", setReq("/broadcast/9", "\x80\x04\x8c\x05mylib\x8c\x05Other\x93)\x81."),
			protocol.RulePickleGlobalDenied, Enforce, "imports mylib.Other: not on the allow-list"},
		{"a broadcast of os.system", setReq("/broadcast/9", string(unhex(t, evil4))),
			protocol.RulePickleGlobalDenied, Enforce, "imports posix.system, which runs code"},
		{"a MASTER_PORT that is not a number", setReq("/torch.rendezvous.job-7.3/MASTER_PORT", "29501; rm -rf"),
			protocol.RuleValueInvalid, Enforce, "not an integer"},
		{"a MASTER_ADDR of 5000 bytes", setReq("/torch.rendezvous.job-7.3/MASTER_ADDR", strings.Repeat("a", 5000)),
			protocol.RuleValueInvalid, Enforce, "more than max-bytes 4096"},
	} {
		msg, b := message(t, tc.req)
		var warned []Finding
		f, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}}, func(f Finding) { warned = append(warned, f) })
		if broke {
			warned = append(warned, f)
		}
		if len(warned) != 1 || warned[0].Rule != tc.rule || warned[0].Mode != tc.mode || !strings.Contains(warned[0].Detail, tc.detail) {
			t.Errorf("%s: findings %+v, want one %s in %s mode with %q", tc.name, warned, tc.rule, tc.mode, tc.detail)
		}
	}
}

// TestLearnerSkipsWhatBreaksARule: a message a rule stops (or records) is not the job's: it is
// counted, not learned.
func TestLearnerSkipsWhatBreaksARule(t *testing.T) {
	l := learn(t, []protocol.Request{setReq("/a/1", "x"), setReq("/vllm/obj", string(unhex(t, evil4))), setReq(stateKey, evil4b64)})
	if s := l.Stats(); s.Messages != 3 || s.Skipped != 2 || s.Patterns != 1 {
		t.Fatalf("stats %+v, want 3 messages, 2 skipped, 1 pattern", s)
	}
	for _, r := range l.Rules() {
		for _, k := range r.Keys {
			if k != "/a/*" {
				t.Errorf("learned %q from a message a rule stopped", k)
			}
		}
	}
}

// TestLearnedPolicyPassesRandomTraffic: keys that collide under generalisation (digits, ? and *
// of the key, with and without the client's /) and values of every kind: the learned policy must
// give no finding on any of them, which needs each key's own pattern first among those matching it.
func TestLearnedPolicyPassesRandomTraffic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	values := [][]byte{[]byte("7"), []byte(`{"a":1}`), []byte("text"), unhex(t, benignDict), unhex(t, orderedDict4),
		[]byte(base64.StdEncoding.EncodeToString(unhex(t, fraction4))), {0xff, 0}, nil, []byte(strings.Repeat("z", 9000))}
	const alphabet = "/ab01?*."
	for round := range 40 {
		var reqs []protocol.Request
		for range 60 {
			key := make([]byte, 1+rng.IntN(6))
			for i := range key {
				key[i] = alphabet[rng.IntN(len(alphabet))]
			}
			if rng.IntN(2) == 0 {
				key = append([]byte("/"), key...)
			}
			switch rng.IntN(4) {
			case 0:
				reqs = append(reqs, protocol.Request{Op: protocol.OpGet, Key: key})
			case 1:
				reqs = append(reqs, protocol.Request{Op: protocol.OpAdd, Key: key, Int: 1})
			default:
				reqs = append(reqs, protocol.Request{Op: protocol.OpSet, Key: key, Value: values[rng.IntN(len(values))]})
			}
		}
		rules := learn(t, reqs).Rules()
		if f := judge(t, rules, "", reqs); len(f) > 0 {
			t.Fatalf("round %d: %d findings, the first %+v; rules %+v", round, len(f), f[0], rules)
		}
	}
}

// TestLearnedFileReadsBack: the YAML is a policy file that ParseFile reads back to the same rules,
// keys that are not UTF-8 or hold a newline included.
func TestLearnedFileReadsBack(t *testing.T) {
	reqs := append(jobTraffic(t), setReq("/odd\n\xff\x00key", "v"), setReq("/quote\"'#: x", "v"))
	l := learn(t, reqs)
	b, err := l.YAML("learned in a test\nreview before enforcing")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), "# learned in a test\n# review before enforcing\n") {
		t.Errorf("no header:\n%s", b)
	}
	if !strings.Contains(string(b), "  # 4 keys, such as /broadcast/0 /broadcast/1 /broadcast/2\n  # set 4, get 4, wait 4; 4 values of pickle, the largest 85 bytes\n  - name: learned-") {
		t.Errorf("no note on /broadcast/*:\n%s", b)
	}
	rules, err := ParseFile(b, "learned.yaml")
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if want := l.Rules(); !reflect.DeepEqual(rules, want) {
		t.Errorf("read back\n%+v\nwant\n%+v\n%s", rules, want, b)
	}
	if f := judge(t, rules, "", reqs); len(f) > 0 {
		t.Errorf("the file read back gives %d findings, the first %+v", len(f), f[0])
	}
}

func TestLearnerBounds(t *testing.T) {
	var reqs []protocol.Request
	name := func(i int) string { // distinct patterns: letters only
		var b []byte
		for ; ; i /= 26 {
			b = append(b, byte('a'+i%26))
			if i < 26 {
				return "/" + string(b)
			}
		}
	}
	for i := range MaxLearnedPatterns + 10 {
		reqs = append(reqs, protocol.Request{Op: protocol.OpGet, Key: []byte(name(i))})
	}
	reqs = append(reqs, protocol.Request{Op: protocol.OpGet, Key: []byte{}})
	l := learn(t, reqs)
	if s := l.Stats(); s.Patterns != MaxLearnedPatterns || s.Dropped != 11 {
		t.Fatalf("stats %+v, want %d patterns and 11 dropped", s, MaxLearnedPatterns)
	}
	b, err := l.YAML("")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "11 key uses were not learned") {
		t.Error("the file does not say what was not learned")
	}
}

// TestLearnerConcurrent: streams check messages from many goroutines at once (run with -race).
func TestLearnerConcurrent(t *testing.T) {
	reqs := jobTraffic(t)
	l := NewLearner()
	c := Defaults()
	c.Learn = l
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]Message, len(reqs))
	for i, r := range reqs {
		msg, b := message(t, r)
		msgs[i] = Message{Msg: msg, Bytes: protocol.Split{B: b}}
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for _, m := range msgs {
				p.Check(m, nil)
			}
			_ = l.Rules()
		})
	}
	wg.Wait()
	if s := l.Stats(); s.Messages != uint64(8*len(reqs)) {
		t.Fatalf("%d messages, want %d", s.Messages, 8*len(reqs))
	}
	if f := judge(t, l.Rules(), "", reqs); len(f) > 0 {
		t.Fatalf("%d findings", len(f))
	}
}

// TestEmptyKeyWhereverTheSplitFalls: an empty key is a key that "*" matches, whether the message's
// bytes came in one part or two (the walker gave nil, no key at all, when the key began the second).
func TestEmptyKeyWhereverTheSplitFalls(t *testing.T) {
	p, err := New(Config{Rules: []Rule{{Name: "no-empty", Keys: []string{"*"}, Ops: []string{"set"}, Action: "deny"}}})
	if err != nil {
		t.Fatal(err)
	}
	msg, b := message(t, setReq("", "v"))
	for cut := 0; cut <= len(b); cut++ {
		if f, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{A: b[:cut], B: b[cut:]}}, nil); !broke || f.Rule != protocol.RulePolicyDenied {
			t.Errorf("cut %d: %v %+v, want policy_denied", cut, broke, f)
		}
	}
}

// realStateTZ is torch 2.15's rendezvous state of a two-node job as C10dRendezvousBackend writes it:
// from 2.6 its heartbeats are datetime.now(timezone.utc), and the pickle imports datetime.timezone
// and datetime.timedelta too. (The first real torchrun capture learned from was rejected as
// rendezvous_state_invalid: "imports datetime.timezone: not a torch rendezvous state".)
const realStateTZ = "gASViwEAAAAAAACMN3RvcmNoLmRpc3RyaWJ1dGVkLmVsYXN0aWMucmVuZGV6dm91cy5keW5hbWljX3JlbmRlenZvdXOUjBBfUmVuZGV6dm91c1N0YXRllJOUKYGUfZQojAVyb3VuZJRLAYwIY29tcGxldGWUiIwIZGVhZGxpbmWUTowGY2xvc2VklImMDHBhcnRpY2lwYW50c5R9lChoAIwJX05vZGVEZXNjlJOUKYGUfZQojARhZGRylIwGbm9kZS1hlIwDcGlklE2SEIwIbG9jYWxfaWSUSwB1YksAaAwpgZR9lChoD4wGbm9kZS1ilGgRTfcQaBJLAHViSwF1jAl3YWl0X2xpc3SUj5SMD3JlZHVuZGFuY3lfbGlzdJSPlIwPbGFzdF9oZWFydGJlYXRzlH2UKGgNjAhkYXRldGltZZSMCGRhdGV0aW1llJOUQwoH6gsaBTcBAeJAlGgcjAh0aW1lem9uZZSTlGgcjAl0aW1lZGVsdGGUk5RLAEsASwCHlFKUhZRSlIaUUpRoE2gpdXViLg=="

func TestRendezvousStateWithTimezones(t *testing.T) {
	p, err := New(Defaults())
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []protocol.Request{setReq(stateKey, realStateTZ),
		{Op: protocol.OpCompareSet, Key: []byte(stateKey), Value: []byte("Y2FuaW1hZGFt"), Desired: []byte(realStateTZ)}} {
		msg, b := message(t, req)
		if f, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}}, nil); broke {
			t.Errorf("%s of torch 2.15's state: %s (%s)", req.Op, f.Rule, f.Detail)
		}
	}
}
