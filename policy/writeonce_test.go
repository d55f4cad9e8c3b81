package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/storeguard/storeguard/protocol"
)

const masterAddr = "/torch.rendezvous.job-7.0/MASTER_ADDR"

// TestWriteOnce: a key torch writes once a round may be written once, through the guard or past
// it (the store says it exists); not again, not deleted; a blocked message marks nothing.
func TestWriteOnce(t *testing.T) {
	inStore := map[string]bool{}
	lookups := 0
	var lookupErr error
	lookup := func(key []byte) (bool, error) {
		lookups++
		return inStore[string(key)], lookupErr
	}
	p, err := New(Defaults())
	if err != nil {
		t.Fatal(err)
	}
	p = p.WithStore(Store{Written: NewWritten(16), Lookup: lookup})
	check := func(r protocol.Request) (protocol.Rule, string) {
		t.Helper()
		msg, b := message(t, r)
		f, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}}, nil)
		if !broke {
			for _, k := range append([][]byte{r.Key}, r.Keys...) { // the store now holds them
				inStore[string(k)] = r.Op != protocol.OpDeleteKey
			}
			return "", ""
		}
		return f.Rule, f.Detail
	}
	del := func(key string) protocol.Request { return protocol.Request{Op: protocol.OpDeleteKey, Key: []byte(key)} }
	inStore["/torch.rendezvous.job-7"] = true // the run's agents joined past the guard

	if r, _ := check(setReq(masterAddr, "10.0.0.1")); r != "" {
		t.Fatalf("first write: %s", r)
	}
	if r, d := check(setReq(masterAddr, "6.6.6.6")); r != protocol.RuleKeyWriteOnce || !strings.Contains(d, "already written through the guard") {
		t.Fatalf("second write: %s %q", r, d)
	}
	if r, _ := check(del(masterAddr)); r != protocol.RuleKeyWriteOnce {
		t.Fatalf("delete: %s", r)
	}
	if r, _ := check(protocol.Request{Op: protocol.OpGet, Key: []byte(masterAddr)}); r != "" {
		t.Fatalf("a read: %s", r)
	}
	// Written past the guard: the store has it.
	port := "/torch.rendezvous.job-7.0/MASTER_PORT"
	inStore[port] = true
	if r, d := check(setReq(port, "1")); r != protocol.RuleKeyWriteOnce || !strings.Contains(d, "already in the store") {
		t.Fatalf("overwrite of a key written past the guard: %s %q", r, d)
	}
	// The next round's keys are new.
	if r, _ := check(setReq("/torch.rendezvous.job-7.1/MASTER_ADDR", "10.0.0.1")); r != "" {
		t.Fatalf("next round: %s", r)
	}
	// A MULTI_SET of assigned ranks, then one of them again in another.
	ranks := protocol.Request{Op: protocol.OpMultiSet,
		Keys:   [][]byte{[]byte("/torch.rendezvous.job-7.1/torchelastic/assigned_ranks/0"), []byte("/torch.rendezvous.job-7.1/torchelastic/assigned_ranks/1")},
		Values: [][]byte{[]byte("[0]"), []byte("[1]")}}
	if r, _ := check(ranks); r != "" {
		t.Fatalf("assigned ranks: %s", r)
	}
	ranks.Keys, ranks.Values = ranks.Keys[1:], ranks.Values[1:]
	if r, _ := check(ranks); r != protocol.RuleKeyWriteOnce {
		t.Fatalf("assigned rank rewritten: %s", r)
	}
	// A message blocked by another rule writes nothing: the key stays writable by its writer.
	evil := protocol.Request{Op: protocol.OpMultiSet,
		Keys:   [][]byte{[]byte("/torch.rendezvous.job-7.2/MASTER_ADDR"), []byte("/x")},
		Values: [][]byte{[]byte("10.0.0.1"), unhex(t, evil4)}}
	if r, _ := check(evil); r != protocol.RulePickleGlobalDenied {
		t.Fatalf("evil: %s", r)
	}
	if r, _ := check(setReq("/torch.rendezvous.job-7.2/MASTER_ADDR", "10.0.0.1")); r != "" {
		t.Fatalf("the writer after a blocked message: %s", r)
	}
	// A store that does not answer lets a first write through.
	lookupErr = errors.New("slow")
	if r, _ := check(setReq("/torch.rendezvous.job-7.3/MASTER_ADDR", "10.0.0.1")); r != "" {
		t.Fatalf("store not answering: %s", r)
	}
	// A store that does not answer is no proof that a key written through the guard went away.
	if r, _ := check(setReq(masterAddr, "6.6.6.6")); r != protocol.RuleKeyWriteOnce {
		t.Fatalf("second write, store not answering: %s", r)
	}
	// The store restarted (a new job on the same port) without the guard noticing: it holds none
	// of the keys, and the new job's first writes pass.
	lookupErr = nil
	clear(inStore)
	inStore["/torch.rendezvous.job-7"] = true // its agents joined
	if r, _ := check(setReq(masterAddr, "10.0.0.2")); r != "" {
		t.Fatalf("first write to a restarted store: %s", r)
	}
	if r, _ := check(setReq(masterAddr, "6.6.6.6")); r != protocol.RuleKeyWriteOnce {
		t.Fatalf("second write to the restarted store: %s", r)
	}
	// Other keys are never looked up.
	before := lookups
	check(setReq("/torch.rendezvous.job-7.3/other", "x"))
	check(setReq("/rank_0", "x"))
	if lookups != before {
		t.Fatal("a key no write-once rule names was looked up")
	}
}

// TestWriteOnceOnlyAnAgentWritesARound: an intruder's early write of a round's key (before the run's
// rendezvous began, or from a source that never wrote its state) is refused and named, so the
// agent's own write is the first and passes; then the key is protected as before. Before, the
// intruder's write was the first and the agent's was refused: torchrun died.
func TestWriteOnceOnlyAnAgentWritesARound(t *testing.T) {
	inStore := map[string]bool{}
	p, err := New(Defaults())
	if err != nil {
		t.Fatal(err)
	}
	p = p.WithStore(Store{Written: NewWritten(1024), Lookup: func(key []byte) (bool, error) { return inStore[string(key)], nil }})
	var state []byte
	for name, v := range corpusFiles(t, "torch-") {
		if strings.Contains(name, "rdzv_state") && strings.HasSuffix(name, ".b64") {
			state = v
			break
		}
	}
	if state == nil {
		t.Fatal("no rendezvous state in the corpus")
	}
	check := func(src, identity string, r protocol.Request) (protocol.Rule, string) {
		t.Helper()
		msg, b := message(t, r)
		f, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}, Src: netip.MustParseAddr(src), Identity: identity}, nil)
		if !broke {
			inStore[string(r.Key)] = true
			return "", ""
		}
		return f.Rule, f.Detail
	}
	const intruder, agentA, agentB = "10.0.0.66", "10.0.0.1", "10.0.0.2"
	for _, key := range []string{masterAddr, strings.TrimPrefix(masterAddr, "/")} {
		if r, d := check(intruder, "", setReq(key, "10.6.6.6")); r != protocol.RuleKeyWriteOnce || !strings.Contains(d, "before run job-7's rendezvous began") {
			t.Fatalf("a write of %s before the run's state: %s %q", key, r, d)
		}
	}
	if r, d := check(agentA, "", setReq("/torch.rendezvous.job-7", string(state))); r != "" {
		t.Fatalf("the agent's join: %s %q", r, d)
	}
	if r, d := check(intruder, "", setReq(masterAddr, "10.6.6.6")); r != protocol.RuleKeyWriteOnce || !strings.Contains(d, "by 10.0.0.66, which has not joined run job-7") {
		t.Fatalf("a write by a source that never joined: %s %q", r, d)
	}
	if r, d := check(agentA, "", setReq(masterAddr, "10.0.0.1")); r != "" {
		t.Fatalf("the agent's own write: %s %q", r, d)
	}
	if r, d := check(agentA, "", setReq(masterAddr, "10.6.6.6")); r != protocol.RuleKeyWriteOnce || !strings.Contains(d, "already written") {
		t.Fatalf("a second write: %s %q", r, d)
	}
	// An identity a handshake proved is an agent from any address; a key of another run is not.
	if r, d := check(agentB, "spiffe://job.test/agent", setReq("/torch.rendezvous.job-7", string(state))); r != "" {
		t.Fatalf("agent B's join: %s %q", r, d)
	}
	if r, d := check("10.0.0.3", "spiffe://job.test/agent", setReq("/torch.rendezvous.job-7.0/MASTER_PORT", "29500")); r != "" {
		t.Fatalf("agent B's identity from another address: %s %q", r, d)
	}
	inStore["/torch.rendezvous.job-8"] = true // joined past the guard: nothing known of its agents
	if r, d := check(intruder, "", setReq("/torch.rendezvous.job-8.0/MASTER_ADDR", "10.0.0.9")); r != "" {
		t.Fatalf("a round of a run whose agents write past the guard: %s %q", r, d)
	}
	// Replay asks no store: a first write passes.
	q := p.WithStore(Store{Written: NewWritten(16)})
	msg, b := message(t, setReq("/torch.rendezvous.job-9.0/MASTER_ADDR", "10.0.0.1"))
	if f, broke := q.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}, Src: netip.MustParseAddr(intruder)}, nil); broke {
		t.Fatalf("replay, a first write: %s %q", f.Rule, f.Detail)
	}
}

func TestRoundRun(t *testing.T) {
	for key, want := range map[string]string{
		"/torch.rendezvous.none.0/MASTER_ADDR": "none", "torch.rendezvous.a.b.12/torchelastic/role_info/0": "a.b",
		"/torch.rendezvous.none/MASTER_ADDR": "", "/torch.rendezvous.none.x/MASTER_ADDR": "", "/torch.rendezvous.none": "",
		"/torch.rendezvous..0/MASTER_ADDR": "", "/other.none.0/MASTER_ADDR": "",
	} {
		run, _, ok := roundRun([]byte(key))
		if string(run) != want || ok != (want != "") {
			t.Errorf("roundRun(%q) = %q, %v; want %q", key, run, ok, want)
		}
	}
}

func TestWriteOnceFileRuleAndBound(t *testing.T) {
	c := Defaults()
	c.WriteOnce = Off
	c.Rules = []Rule{{Name: "nccl-id", Keys: []string{"0/cuda/*"}, Action: "write-once"}}
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	w := NewWritten(2)
	p = p.WithStore(Store{Written: w})
	check := func(key string) protocol.Rule {
		msg, b := message(t, setReq(key, "id"))
		f, _ := p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}}, nil)
		return f.Rule
	}
	if check("/0/cuda/0") != "" || check("/0/cuda/0") != protocol.RuleKeyWriteOnce {
		t.Fatal("the file's write-once rule")
	}
	if check(masterAddr) != "" || check(masterAddr) != "" {
		t.Fatal("the default rule is off")
	}
	check("/0/cuda/1")
	check("/0/cuda/2") // the oldest, /0/cuda/0, is forgotten
	if w.Len() != 2 || check("/0/cuda/0") != "" {
		t.Fatalf("bound: %d keys", w.Len())
	}
	if _, err := New(Config{Rules: []Rule{{Name: "x", Action: "write-once"}}}); err == nil {
		t.Fatal("a write-once rule without keys")
	}
}

// A run's agents are bounded with the run: past Written's bound of names, nothing is known of who
// is not an agent (the first write counts, as before), and a forgotten run takes its names along.
func TestWrittenAgentsBound(t *testing.T) {
	w := NewWritten(256) // 16 runs, 64 names
	src := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}) }
	for i := range 64 {
		w.joined([]byte("big"), src(i), "")
	}
	if known, isAgent := w.agent([]byte("big"), src(63), ""); !known || !isAgent {
		t.Fatalf("an agent within the bound: known %v, agent %v", known, isAgent)
	}
	if known, _ := w.agent([]byte("big"), src(999), ""); !known {
		t.Fatal("a stranger to a run within the bound is not known as one")
	}
	w.joined([]byte("big"), src(64), "")
	if known, _ := w.agent([]byte("big"), src(64), ""); known {
		t.Fatal("past the bound, the run's agents are still taken as known")
	}
	for i := range 16 { // 16 more runs: the last forgets "big", and its names with it
		w.joined([]byte{'r', byte('a' + i)}, src(i), "")
	}
	if known, _ := w.agent([]byte("big"), src(0), ""); known || w.agents != 1 {
		t.Fatalf("a forgotten run: known %v, %d names kept, want the last run's 1", known, w.agents)
	}
	if known, isAgent := w.agent([]byte{'r', 'a' + 15}, src(15), ""); !known || !isAgent {
		t.Fatalf("the run after: known %v, agent %v", known, isAgent)
	}
}
