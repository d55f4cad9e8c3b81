package policy

import (
	"bytes"
	"sync"

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
	set  map[string]struct{}
	ring []string
	next int
}

// NewWritten remembers at most n keys.
func NewWritten(n int) *Written {
	return &Written{set: make(map[string]struct{}), ring: make([]string, max(n, 1))}
}

func (w *Written) has(key []byte) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.set[string(key)]
	return ok
}

func (w *Written) add(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.set[key]; ok {
		return
	}
	if old := w.ring[w.next]; old != "" {
		delete(w.set, old)
	}
	w.ring[w.next] = key
	w.next = (w.next + 1) % len(w.ring)
	w.set[key] = struct{}{}
}

// Len is how many keys w remembers.
func (w *Written) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.set)
}

// Lookup asks the store whether key (as the wire has it) exists. In a transparent sidecar the
// master host's own ranks write over loopback, past the guard: a write-once key the guard never
// saw written may exist all the same. An error lets the write through (the guard never becomes
// the job's weak point) and is counted by the caller.
type Lookup func(key []byte) (exists bool, err error)

// WithStore returns a copy of p that remembers write-once keys in w and asks lookup (nil: no store
// to ask, as in replay) about keys it has not seen written.
func (p *Policy) WithStore(w *Written, lookup Lookup) *Policy {
	q := *p
	q.written, q.lookup = w, lookup
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
		if glob(k, bare) || glob(k, key) {
			return true
		}
	}
	return false
}

// checkWriteOnce applies r to one view. A first write is remembered in marks, which Check keeps
// only if the whole message passes: a blocked message wrote nothing.
func (p *Policy) checkWriteOnce(r *writeOnce, v *fieldView, marks *[]string) (Finding, bool) {
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
	if p.written.has(v.key) {
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
