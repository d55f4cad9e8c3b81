package policy

import (
	"fmt"
	"hash/maphash"
	"net/netip"
	"sync"

	"github.com/storeguard/storeguard/protocol"
)

// The store keeps every key it is sent until a DELETE_KEY: a source that SETs distinct keys with
// the largest legal values fills the store's host (100 × 8 MiB took a 2.15 store from 620 MB to
// 1.4 GB in 1.2 s), the #106294 outcome reached with valid messages. The quota is an account of
// what each source has made the store hold, and a write that would take a source, or everyone,
// past its cap is refused before a byte of it reaches the store (store_quota_exceeded). Only growth
// is checked: a write that leaves its source and the store holding no more than before (an
// overwrite as long or shorter, a DELETE_KEY, an ADD to a key that exists) always passes.

// QuotaLimits are the caps of the account (quota.* of the configuration); a zero cap is none.
type QuotaLimits struct {
	SourceBytes, TotalBytes int64 // bytes the store holds for one source, and for all of them
	SourceKeys, TotalKeys   int64 // keys, likewise
	Mode                    Mode
}

// entryCost is what a key costs the store besides its key's and value's bytes, as measured on
// real stores (docs/policy.md, "The store quota": 200 bytes on torch 1.13, 106 on 2.15 with
// either backend, for 200,000 keys of 20 bytes). A queue item is charged the same.
const entryCost = 200

// addValueBytes is what ADD stores on a key it creates: the counter as decimal text.
const addValueBytes = 20

// QuotaSource is the unit the account charges: an IPv4 address, or an IPv6 /64 (one host's
// addresses: a host on a /64 has 2^64 of them).
func QuotaSource(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p
	}
	return netip.PrefixFrom(a, a.BitLen())
}

// Quota is the account: one for a server, shared by its streams and kept across reloads (the
// caps come with each Policy). Keys are kept as 64-bit hashes with a random seed, so that the
// account's memory is about 40 bytes a key whatever the keys' lengths, and no client can choose
// keys that collide. Its size is bounded by the key caps.
type Quota struct {
	seed maphash.Seed
	mu   sync.Mutex
	keys map[uint64]held
	srcs map[netip.Prefix]*usage
	all  usage
	kv   int64 // keys that are not queues: what the store's GETNUMKEYS counts
}

// held is one key as the account knows it: the bytes it charges and to whom (nil: no such key).
type held struct {
	bytes int64
	base  int64 // what the key costs with no value: its length and entryCost
	items int64 // a queue's items (QUEUE_PUSH), whose average size a QUEUE_POP gives back
	queue bool
	owner *usage
}

// usage is what one source (or all) has made the store hold.
type usage struct {
	src   netip.Prefix
	bytes int64
	keys  int64
}

// NewQuota is an empty account.
func NewQuota() *Quota {
	return &Quota{seed: maphash.MakeSeed(), keys: map[uint64]held{}, srcs: map[netip.Prefix]*usage{}}
}

// Reset forgets everything: the store went away (a restart holds no key).
func (q *Quota) Reset() {
	q.mu.Lock()
	defer q.mu.Unlock()
	clear(q.keys)
	clear(q.srcs)
	q.all, q.kv = usage{}, 0
}

// Count asks the store how many keys it holds (GETNUMKEYS), to find an account that outlived the
// store's keys. An error is no answer.
type Count func() (int64, error)

// stale reports whether the store holds fewer keys than the account says it was made to: it
// restarted (a new job on the same port) or lost keys past the guard. Only a key the store
// creates is counted as one (a COMPARE_SET on a key the account does not know is not, queues are
// apart), so no client can make the account count keys the store does not have.
func (q *Quota) stale(storeKeys int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return storeKeys < q.kv
}

// QuotaStats is a snapshot of the account, for gauges.
type QuotaStats struct {
	Bytes, Keys, Sources int64
}

// Stats returns the account's totals.
func (q *Quota) Stats() QuotaStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return QuotaStats{Bytes: q.all.bytes, Keys: q.all.keys, Sources: int64(len(q.srcs))}
}

// Holding returns what src's source has made the store hold.
func (q *Quota) Holding(src netip.Addr) (bytes, keys int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if u := q.srcs[QuotaSource(src)]; u != nil {
		return u.bytes, u.keys
	}
	return 0, 0
}

// change is what one view of a message does to the account.
type change struct {
	hash     uint64
	op       protocol.Op
	base     int64 // len(key) + entryCost
	val      int64 // the value's length
	keyField protocol.Field
	key      []byte // for the finding only: valid while the message is
	expected int64  // COMPARE_SET's expected value's length
}

// queueSpace sets the hash of a queue's key apart from the same key's value: a store keeps its
// queues in a map of their own.
const queueSpace = 0x9e3779b97f4a7c15

// note adds v's change to cs if the quota is on and v changes what the store holds.
func (q *Quota) note(v *fieldView, cs []change) []change {
	if q == nil || v.key == nil || !modifies(v.op) {
		return cs
	}
	c := change{hash: maphash.Bytes(q.seed, v.key), op: v.op, base: int64(len(v.key)) + entryCost,
		val: int64(v.val.Len), keyField: v.keyField, key: v.key}
	if v.op == protocol.OpQueuePush || v.op == protocol.OpQueuePop {
		c.hash ^= queueSpace
	}
	if v.op == protocol.OpCompareSet {
		c.expected = v.expected
	}
	return append(cs, c)
}

// after is what a key holds once c is applied to h (no owner: no entry): its bytes and items, and
// whether it exists. A COMPARE_SET on a key the account knows is taken to succeed (one that fails
// overcharges its writer by a value until the key's next write); on a key it does not know, the
// store creates it only with an empty expected value.
func (c *change) after(h held) (bytes, items int64, exists bool) {
	cur, n, had := h.bytes, h.items, h.owner != nil
	switch c.op {
	case protocol.OpDeleteKey:
		return 0, 0, false
	case protocol.OpAdd:
		if had {
			return cur, n, true
		}
		return c.base + addValueBytes, 0, true
	case protocol.OpAppend:
		if !had {
			return c.base + c.val, 0, true
		}
		return cur + c.val, n, true
	case protocol.OpQueuePush:
		if !had {
			return c.base + entryCost + c.val, 1, true
		}
		return cur + entryCost + c.val, n + 1, true
	case protocol.OpCompareSet:
		if !had && c.expected > 0 {
			return 0, 0, false
		}
	case protocol.OpQueuePop:
		if !had || n == 0 {
			return cur, n, had
		}
		return cur - (cur-h.base)/n, n - 1, true
	}
	return c.base + c.val, 0, true // SET, COMPARE_SET, a MULTI_SET pair
}

// charge applies cs, the changes of one message from src, if they keep src and everyone within
// the caps; otherwise it applies none and returns the finding (in monitor mode it applies them
// all the same: the message is forwarded). A message's changes apply in order, so a MULTI_SET
// that names a key twice is charged as the store ends up.
func (q *Quota) charge(lim QuotaLimits, src netip.Addr, cs []change) (f Finding, found bool) {
	if len(cs) == 0 {
		return Finding{}, false
	}
	p := QuotaSource(src)
	q.mu.Lock()
	defer q.mu.Unlock()
	me := q.srcs[p]
	if me == nil {
		me = &usage{src: p}
	}
	// First the totals as they would be; then, if within the caps, the entries.
	myBytes, myKeys, allBytes, allKeys := me.bytes, me.keys, q.all.bytes, q.all.keys
	my0, myKeys0, all0, allKeys0 := myBytes, myKeys, allBytes, allKeys
	var overlay map[uint64]held // entries as earlier changes of this message leave them
	look := func(h uint64) held {
		if e, ok := overlay[h]; ok {
			return e
		}
		return q.keys[h]
	}
	for i := range cs {
		c := &cs[i]
		h := look(c.hash)
		bytes, items, exists := c.after(h)
		owner := me // the writer owns what it wrote
		if h.owner != nil && !c.writes() {
			owner = h.owner
		}
		if h.owner != nil {
			allBytes -= h.bytes
			allKeys--
			if h.owner == me {
				myBytes -= h.bytes
				myKeys--
			}
		}
		var next held
		if exists {
			allBytes += bytes
			allKeys++
			if owner == me {
				myBytes += bytes
				myKeys++
			}
			next = held{bytes: bytes, base: c.base, items: items, queue: c.op == protocol.OpQueuePush || c.op == protocol.OpQueuePop, owner: owner}
		}
		// Only what grows is checked: a write that leaves its source and the store holding no
		// more than before the message passes.
		if !found {
			u := usage{bytes: grown(myBytes, my0), keys: grown(myKeys, myKeys0)}
			a := usage{bytes: grown(allBytes, all0), keys: grown(allKeys, allKeys0)}
			if f, found = lim.over(c, u, a, p); found && lim.Mode != Monitor {
				return f, true
			}
		}
		if len(cs) > 1 {
			if overlay == nil {
				overlay = map[uint64]held{}
			}
			overlay[c.hash] = next
		} else {
			q.apply(c.hash, h, next)
		}
	}
	for hash, next := range overlay {
		q.apply(hash, q.keys[hash], next)
	}
	return f, found
}

// grown is now if it is more than before, else 0: what a cap is checked against.
func grown(now, before int64) int64 {
	if now > before {
		return now
	}
	return 0
}

// writes reports whether c sets what its key holds, so that its writer owns the key: an ADD to a
// counter that exists or a QUEUE_POP leaves the key its owner's.
func (c *change) writes() bool { return c.op != protocol.OpAdd && c.op != protocol.OpQueuePop }

// apply replaces the entry prev of hash with next (no owner: removed), moving the charges.
func (q *Quota) apply(hash uint64, prev, next held) {
	if prev.owner != nil {
		q.uncharge(prev)
		delete(q.keys, hash)
	}
	me := next.owner
	if me == nil {
		return
	}
	if me.keys == 0 {
		q.srcs[me.src] = me
	}
	me.bytes += next.bytes
	me.keys++
	q.all.bytes += next.bytes
	q.all.keys++
	if !next.queue {
		q.kv++
	}
	q.keys[hash] = next
}

func (q *Quota) uncharge(h held) {
	u := h.owner
	u.bytes -= h.bytes
	u.keys--
	q.all.bytes -= h.bytes
	q.all.keys--
	if !h.queue {
		q.kv--
	}
	if u.keys <= 0 {
		delete(q.srcs, u.src)
	}
}

// over reports the cap that src's account u, or everyone's a, breaks after c, if any: each holds
// a total that grew, zero for one that did not.
func (l QuotaLimits) over(c *change, u, a usage, src netip.Prefix) (Finding, bool) {
	var what string
	switch {
	case l.SourceBytes > 0 && u.bytes > l.SourceBytes:
		what = fmt.Sprintf("%s would hold %d bytes in the store, over quota.per-source-store-bytes %d", showSource(src), u.bytes, l.SourceBytes)
	case l.SourceKeys > 0 && u.keys > l.SourceKeys:
		what = fmt.Sprintf("%s would hold %d keys in the store, over quota.per-source-store-keys %d", showSource(src), u.keys, l.SourceKeys)
	case l.TotalBytes > 0 && a.bytes > l.TotalBytes:
		what = fmt.Sprintf("the store would hold %d bytes, over quota.store-bytes %d", a.bytes, l.TotalBytes)
	case l.TotalKeys > 0 && a.keys > l.TotalKeys:
		what = fmt.Sprintf("the store would hold %d keys, over quota.store-keys %d", a.keys, l.TotalKeys)
	default:
		return Finding{}, false
	}
	return Finding{Rule: protocol.RuleStoreQuota, Field: c.keyField, Key: protocol.ShowKey(c.key),
		Detail: c.op.String() + ": " + what, Mode: l.Mode}, true
}

// showSource is a source as the account counts it: an address, or an IPv6 /64.
func showSource(p netip.Prefix) string {
	if p.Bits() == p.Addr().BitLen() {
		return p.Addr().String()
	}
	return p.String()
}
