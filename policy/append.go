package policy

import (
	"fmt"
	"hash/maphash"
	"sync"

	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// A reader loads a key's whole value; APPEND makes it of pieces, each harmless alone (the
// os.system pickle as b"co", then the rest). Torch and the frameworks measured never APPEND
// (interop/results/policy-facts.md: SET, COMPARE_SET, MULTI_SET, ADD only); the TCPStore API has it
// all the same. So an APPEND is judged as the value it leaves: the store's value (asked on the
// guard's own connection), the bytes of APPENDs the guard passed that the store does not show yet,
// and the appended bytes, together; and the appended bytes alone (the key may be deleted before
// they land). Each must pass the pickle rule.
//
// What the store's value cannot show is a write on its way. The messages of one stream reach the
// store in order, so the bytes its own earlier APPENDs add are put in (Message.Stream). An APPEND
// of another stream still on its way (the store's value is shorter than the APPENDs passed make
// it) may land before or after this one: both are let through only when each leaves a settled
// value, one that no bytes appended later change (pickle.Extendable), so that whichever lands first
// decides, and was judged. A write of the whole value (SET, COMPARE_SET, MULTI_SET) cannot be seen
// on its way either: an APPEND to a key written whole through the guard is refused (value_split).
// A whole write judged after another stream's APPEND passed (it may land before it) is judged
// with that APPEND's bytes after it, as the value they leave: the os.system pickle's first bytes
// by SET and the rest by APPEND on another connection, judged in that order, ran in a reader when
// the APPEND happened to be judged first. A whole write is refused only when that value is a
// pickle the rule refuses: torch writes complete values, and a pickle's reader stops at its STOP,
// so an intruder's bytes appended to a key the job writes later cannot make the job's write look
// like one.

// appendValueLimit bounds the store's value the guard reads to judge an APPEND, and the bytes of
// APPENDs on their way it keeps for a key: past it the APPEND is refused.
const appendValueLimit = 16 << 20

// Value asks the store for key's value, as the wire has it, if key exists and the value is at most
// limit bytes long (storeinfo.Learner.Value).
type Value func(key []byte, limit int) (value []byte, exists bool, err error)

// Appends remembers the keys written whole and the keys appended to through the guard, with the
// APPENDs on their way: one for a server, shared by its streams and kept across reloads; bounded,
// the oldest key forgotten first.
type Appends struct {
	judging  sync.Mutex // held while an APPEND is judged
	mu       sync.Mutex
	seed     maphash.Seed
	written  recent[uint64, struct{}]
	appended recent[uint64, *appendState] // by key hash; nil: appended, nothing passed on its way
	kept     int                          // bytes of pending kept, in all states
}

// Bounds on the bytes of APPENDs on their way that Appends keeps: a key's past pendingKept, or
// all keys' past pendingTotal, are not kept (appendState.lost), and the stream's next APPEND to the
// key before the store shows them is refused.
const (
	pendingKept  = 64 << 10
	pendingTotal = 16 << 20
)

// appendState is what the guard passed to a key by APPEND that the store may not show yet.
type appendState struct {
	stream  uint64 // the stream of the last APPEND passed
	base    int    // the value's length when that stream's first APPEND still on its way was judged
	pending []byte // what that stream appended since base (nil when lost)
	n       int    // how many bytes that is
	lost    bool   // pending was not kept: past pendingKept or pendingTotal
	settled bool   // the value the last APPEND leaves is settled
}

func (st *appendState) end() int { return st.base + st.n }

// NewAppends remembers at most n keys of each kind.
func NewAppends(n int) *Appends {
	return &Appends{seed: maphash.MakeSeed(), written: newRecent[uint64, struct{}](n),
		appended: newRecent[uint64, *appendState](n)}
}

// Reset forgets every key: the store behind the guard is another.
func (a *Appends) Reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.written.reset()
	a.appended.reset()
	a.kept = 0
}

// checkSplit applies the rule to one field of a message. What it learns it records at once, under
// the lock that its question was asked under, so that no other stream's write slips between them;
// a message refused later for another rule leaves its marks, which can only refuse more APPENDs.
func (p *Policy) checkSplit(m *Message, v *fieldView) (Finding, bool) {
	if p.appends == nil || p.cfg.ValueSplit == Off || v.key == nil || !v.hasValue() {
		return Finding{}, false
	}
	a := p.appends
	h := maphash.Bytes(a.seed, v.key)
	fail := func(rule protocol.Rule, detail string) (Finding, bool) {
		return Finding{Rule: rule, Field: v.val, Key: protocol.ShowKey(v.key), Detail: detail, Mode: p.cfg.ValueSplit}, true
	}
	switch v.op {
	case protocol.OpSet, protocol.OpCompareSet, protocol.OpMultiSet:
		a.mu.Lock()
		a.written.put(h, struct{}{})
		var pending []byte
		if st, ok := a.appended.get(h); ok && st != nil && st.stream != m.Stream && !st.lost {
			pending = append([]byte(nil), st.pending...)
		}
		a.mu.Unlock()
		if len(pending) == 0 {
			return Finding{}, false
		}
		// Another stream's APPEND passed, judged before this write was seen: it may land after it.
		whole := append(append(append([]byte(nil), v.va...), v.vb...), pending...)
		if why, _ := p.pickleUnsafe(whole, nil, v.pickleAllow); why != "" {
			return fail(protocol.RulePickleGlobalDenied, "a whole write while another connection's append to the key may be on its way: the value they leave: "+why)
		}
		return Finding{}, false
	case protocol.OpAppend:
	default:
		return Finding{}, false
	}
	// One APPEND judged at a time: the store's value it reads and the state it leaves go together.
	a.judging.Lock()
	defer a.judging.Unlock()
	a.mu.Lock()
	_, written := a.written.get(h)
	var st appendState
	if s, ok := a.appended.get(h); ok && s != nil {
		st = *s
	} else if !ok {
		a.keep(h, nil)
	}
	a.mu.Unlock()
	if written {
		return fail(protocol.RuleValueSplit, "append to a key written whole through the guard: the reader loads both as one value")
	}
	var stored []byte
	if p.value != nil {
		var err error
		if stored, _, err = p.value(v.key, appendValueLimit); err != nil {
			return fail(protocol.RuleValueSplit, "append to a key whose value the store did not tell: "+err.Error())
		}
	}
	prefix, mustSettle := stored, false
	if n := len(stored); st.stream != 0 && n < st.end() {
		switch {
		case st.stream == m.Stream && n >= st.base && !st.lost: // its own APPENDs, on their way in order
			prefix = append(stored[:n:n], st.pending[n-st.base:]...)
		case st.stream == m.Stream && n >= st.base:
			return fail(protocol.RuleValueSplit, fmt.Sprintf("append while the connection's earlier appends to the key, more than %d bytes, are on their way", pendingKept))
		case st.stream != m.Stream && st.settled: // another's, settled: whichever lands first decides
			mustSettle = true
		case st.stream != m.Stream:
			return fail(protocol.RuleValueSplit, "append while another connection's append to the key, which leaves it unsettled, is on its way")
		default:
			return fail(protocol.RuleValueSplit, "append to a key whose value shrank while an append to it was on its way")
		}
	}
	if len(prefix)+len(v.va)+len(v.vb) > appendValueLimit {
		return fail(protocol.RuleValueSplit, fmt.Sprintf("append that leaves a value of more than %d bytes, which the guard does not judge", appendValueLimit))
	}
	whole := append(append(prefix[:len(prefix):len(prefix)], v.va...), v.vb...)
	settled := !pickle.Extendable(whole, nil, p.cfg.Pickle)
	next := appendState{stream: m.Stream, base: len(stored), settled: settled}
	if st.stream == m.Stream && len(stored) < st.end() {
		next.base = st.base
	}
	next.pending = whole[next.base:]
	next.n = len(next.pending)
	for _, c := range []struct {
		what  string
		value []byte
	}{{"the value it leaves", whole}, {"the appended bytes alone", whole[len(prefix):]}} {
		if why, _ := p.pickleUnsafe(c.value, nil, v.pickleAllow); why != "" {
			return fail(protocol.RulePickleGlobalDenied, "append: "+c.what+": "+why)
		}
	}
	if mustSettle && !settled {
		return fail(protocol.RuleValueSplit, "append that leaves an unsettled value while another connection's append to the key is on its way")
	}
	// Recorded now, while APPENDs wait: a rule after this one may still refuse the message, and then
	// the state claims bytes that never land, which can only refuse more APPENDs to the key. Unless
	// a whole write of the key was judged while this APPEND asked the store: that write did not see
	// this APPEND's bytes, and may land before them.
	if !a.record(h, next) {
		return fail(protocol.RuleValueSplit, "append to a key written whole through the guard while the append was judged: the reader loads both as one value")
	}
	return Finding{}, false
}

// record keeps st as key hash h's state, its pending bytes within pendingKept and pendingTotal,
// and reports true; false, recording nothing, when the key was written whole meanwhile.
func (a *Appends) record(h uint64, st appendState) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, written := a.written.get(h); written {
		return false
	}
	if st.n > pendingKept || a.kept+st.n > pendingTotal {
		st.pending, st.lost = nil, true
	} else {
		st.pending = append([]byte(nil), st.pending...)
	}
	a.keep(h, &st)
	return true
}

// keep sets key hash h's state, and accounts for the pending bytes it and what it displaces hold;
// a.mu is held.
func (a *Appends) keep(h uint64, st *appendState) {
	if old, ok := a.appended.get(h); ok && old != nil {
		a.kept -= len(old.pending)
	}
	if st != nil {
		a.kept += len(st.pending)
	}
	if old, evicted := a.appended.put(h, st); evicted && old != nil {
		a.kept -= len(old.pending)
	}
}
