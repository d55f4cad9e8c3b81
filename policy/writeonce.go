package policy

import (
	"bytes"
	"sync"

	"github.com/storeguard/storeguard/internal/glob"
	"github.com/storeguard/storeguard/protocol"
)

// Keys torch writes once per rendezvous round, from one writer, and never rewrites or deletes:
// each round of torchrun's c10d rendezvous has a key prefix of its own (dynamic_rendezvous.py
// _get_store: "torch.rendezvous.<run_id>.<round>", joined with "/" by PrefixStore), under which
// group rank 0 writes MASTER_ADDR and MASTER_PORT (rendezvous/api.py RendezvousStoreInfo.build) and
// the assigned ranks (agent/server/api.py _assign_worker_ranks), and each agent its role info. A
// second write is an intruder's (T3, T7): workers would bootstrap against its store, or take
// duplicate ranks.
var writeOnceKeys = [][]byte{
	[]byte("torch.rendezvous.*/MASTER_ADDR"),
	[]byte("torch.rendezvous.*/MASTER_PORT"),
	[]byte("torch.rendezvous.*/torchelastic/assigned_ranks/*"),
	[]byte("torch.rendezvous.*/torchelastic/role_info/*"),
}

// modifies reports whether op changes the value of its key (or removes it).
func modifies(op protocol.Op) bool {
	switch op {
	case protocol.OpSet, protocol.OpCompareSet, protocol.OpAdd, protocol.OpDeleteKey, protocol.OpAppend,
		protocol.OpMultiSet, protocol.OpQueuePush, protocol.OpQueuePop:
		return true
	}
	return false
}

// Written remembers the write-once keys written through the guard: one for a server, shared by its
// streams and kept across reloads. It is bounded; the oldest key is forgotten first, and a
// forgotten key is looked up in the store again.
type Written struct {
	mu   sync.Mutex
	keys recent[string, struct{}]
	// runs are the rendezvous runs whose state a message through the guard wrote, each with the
	// agents who wrote it (agent.go): a round's keys are written by one of them. A run and its
	// agents are forgotten together; agents counts their names in all, at most maxAgents.
	runs      recent[string, *runAgents]
	agents    int
	maxAgents int
}

// NewWritten remembers at most n keys, and the agents of at most n/64 runs, n/4 names in all.
func NewWritten(n int) *Written {
	return &Written{keys: newRecent[string, struct{}](n), runs: newRecent[string, *runAgents](max(n/64, 16)),
		maxAgents: max(n/4, 64)}
}

func (w *Written) has(key []byte) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.keys.get(string(key))
	return ok
}

func (w *Written) add(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.keys.put(key, struct{}{})
}

// Reset forgets every key and agent: the store went away.
func (w *Written) Reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.keys.reset()
	w.runs.reset()
	w.agents = 0
}

// Len is how many keys w remembers.
func (w *Written) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.keys.m)
}

// Lookup asks the store whether key (as the wire has it) exists. In a transparent sidecar the
// master host's own ranks write over loopback, past the guard: a write-once key the guard never
// saw written may exist all the same. An error lets the write through (the guard never becomes
// the job's weak point) and is counted by the caller.
type Lookup func(key []byte) (exists bool, err error)

// Store is what the streams of one server share about the store behind them, kept across reloads.
type Store struct {
	Written *Written // the write-once keys written through the guard
	Lookup  Lookup   // asks the store about keys not seen written; nil: no store to ask (replay)
	Quota   *Quota   // the store quota's account; nil: no quota
	Count   Count    // asks the store how many keys it holds, when the quota refuses; nil: never
	// JobStores is told where each rendezvous round sends its ranks (jobstore.go); nil: nobody asks
	JobStores *JobStores
	// Appends remembers the keys written whole and appended to (append.go); nil: APPEND unjudged
	Appends *Appends
	// Value asks the store for a key's value, to judge an APPEND with it; nil: no store to ask (replay)
	Value Value
}

// WithStore returns a copy of p that keeps what it learns of the store in s.
func (p *Policy) WithStore(s Store) *Policy {
	q := *p
	q.written, q.lookup, q.quota, q.count, q.jobStores = s.Written, s.Lookup, s.Quota, s.Count, s.JobStores
	q.appends, q.value = s.Appends, s.Value
	return &q
}

// writeOnce is one write-once rule: the default's or a policy file's.
type writeOnce struct {
	name string // "" for the default rule
	keys [][]byte
	mode Mode
}

func (r *writeOnce) matches(key []byte) bool {
	bare := bytes.TrimPrefix(key, []byte("/"))
	for _, k := range r.keys {
		if glob.Match(k, bare) || glob.Match(k, key) {
			return true
		}
	}
	return false
}

// checkWriteOnce applies r to one view of m. A first write is remembered in marks, which Check
// keeps only if the whole message passes: a blocked message wrote nothing.
func (p *Policy) checkWriteOnce(r *writeOnce, v *fieldView, m *Message, marks *[]string) (Finding, bool) {
	if r.mode == Off || p.written == nil || v.key == nil || !modifies(v.op) || !r.matches(v.key) {
		return Finding{}, false
	}
	fail := func(detail string) (Finding, bool) {
		if r.name != "" {
			detail = "rule " + r.name + ": " + detail
		}
		return Finding{Rule: protocol.RuleKeyWriteOnce, Field: v.keyField, Key: protocol.ShowKey(v.key),
			Detail: v.op.String() + " of a key written once, " + detail, Mode: r.mode}, true
	}
	if why := p.notAnAgent(v.key, m); why != "" {
		return fail(why)
	}
	if p.written.has(v.key) && !p.lostByStore(v.key) {
		return fail("already written through the guard")
	}
	for _, m := range *marks {
		if m == string(v.key) {
			return fail("written earlier in the same message")
		}
	}
	if p.lookup != nil {
		if exists, err := p.lookup(v.key); err == nil && exists {
			p.written.add(string(v.key))
			return fail("already in the store")
		}
	}
	if v.op != protocol.OpDeleteKey {
		*marks = append(*marks, string(v.key))
	}
	return Finding{}, false
}

// lostByStore reports whether the store says it does not hold key, a key written through the
// guard: it went away since (a store restarted under a guard that did not see it go, or a job
// started anew on the same port), and the next write is a first one. An error is no answer.
func (p *Policy) lostByStore(key []byte) bool {
	if p.lookup == nil {
		return false
	}
	exists, err := p.lookup(key)
	return err == nil && !exists
}
