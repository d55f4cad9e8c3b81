package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/storeguard/storeguard/protocol"
)

// quotaPolicy is the default policy with the store quota's caps lim, on a fresh account.
func quotaPolicy(t testing.TB, lim QuotaLimits) (*Policy, *Quota) {
	t.Helper()
	c := Defaults()
	c.Quota = lim
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	q := NewQuota()
	return p.WithStore(Store{Written: NewWritten(16), Quota: q}), q
}

// send checks r from src: the rule it broke ("" for none) and the finding's detail; warned says
// whether a monitored rule was reported.
func send(t testing.TB, p *Policy, src string, r protocol.Request) (rule protocol.Rule, detail string, warned bool) {
	t.Helper()
	msg, b := message(t, r)
	f, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}, Src: netip.MustParseAddr(src)},
		func(w Finding) { warned, detail = true, w.Detail })
	if broke {
		return f.Rule, f.Detail, warned
	}
	return "", detail, warned
}

func valueOf(n int) []byte { return make([]byte, n) }

// cost is what a SET of a key of k bytes and a value of v bytes is charged.
func cost(k, v int) int64 { return int64(k+v) + entryCost }

// TestQuotaSourceCap: one source's distinct keys fill its share and the next write is refused with
// the cap named, charging nothing; overwrites and deletes never accumulate; another source still
// writes.
func TestQuotaSourceCap(t *testing.T) {
	const v = 1 << 20
	key := func(i int) string { return fmt.Sprintf("/flood/%04d", i) } // 11 bytes
	p, q := quotaPolicy(t, QuotaLimits{SourceBytes: 4 * cost(11, v), TotalKeys: 1 << 20, Mode: Enforce})
	for i := range 4 {
		if r, d, _ := send(t, p, "10.0.0.9", setReq(key(i), string(valueOf(v)))); r != "" {
			t.Fatalf("write %d within the cap: %s %s", i, r, d)
		}
	}
	r, d, _ := send(t, p, "10.0.0.9", setReq(key(4), string(valueOf(v))))
	if r != protocol.RuleStoreQuota || !strings.Contains(d, "10.0.0.9 would hold") || !strings.Contains(d, "quota.per-source-store-bytes") {
		t.Fatalf("write over the cap: %q %q", r, d)
	}
	if b, k := q.Holding(netip.MustParseAddr("10.0.0.9")); b != 4*cost(11, v) || k != 4 {
		t.Fatalf("the refused write was charged: %d bytes, %d keys", b, k)
	}
	// Overwriting its own keys, even a thousand times, holds no more.
	for range 1000 {
		if r, _, _ := send(t, p, "10.0.0.9", setReq(key(3), string(valueOf(v)))); r != "" {
			t.Fatalf("overwrite: %s", r)
		}
	}
	// A shorter value, a DELETE_KEY: room again.
	if r, _, _ := send(t, p, "10.0.0.9", protocol.Request{Op: protocol.OpDeleteKey, Key: []byte(key(0))}); r != "" {
		t.Fatalf("delete: %s", r)
	}
	if r, _, _ := send(t, p, "10.0.0.9", setReq(key(4), string(valueOf(v)))); r != "" {
		t.Fatalf("a write after a delete: %s", r)
	}
	// Another source has a share of its own.
	if r, _, _ := send(t, p, "10.0.0.10", setReq(key(5), string(valueOf(v)))); r != "" {
		t.Fatalf("another source: %s", r)
	}
	if s := q.Stats(); s.Bytes != 5*cost(11, v) || s.Keys != 5 || s.Sources != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// TestQuotaTotalCap: past the total, a write that grows the store is refused whoever sends it; one
// that holds no more than before (a shorter overwrite, an ADD to a counter that exists) passes.
func TestQuotaTotalCap(t *testing.T) {
	p, _ := quotaPolicy(t, QuotaLimits{TotalBytes: 3 * cost(2, 1000), TotalKeys: 1 << 20, Mode: Enforce})
	for i, src := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		if r, _, _ := send(t, p, src, setReq(fmt.Sprintf("/%d", i), string(valueOf(1000)))); r != "" {
			t.Fatalf("within the total: %s", r)
		}
	}
	if r, d, _ := send(t, p, "10.0.0.4", setReq("/9", "x")); r != protocol.RuleStoreQuota || !strings.Contains(d, "quota.store-bytes") {
		t.Fatalf("past the total: %q %q", r, d)
	}
	if r, _, _ := send(t, p, "10.0.0.4", protocol.Request{Op: protocol.OpAdd, Key: []byte("/new"), Int: 1}); r != protocol.RuleStoreQuota {
		t.Fatalf("an ADD that creates a key past the total: %s", r)
	}
	if r, _, _ := send(t, p, "10.0.0.4", protocol.Request{Op: protocol.OpAdd, Key: []byte("/1"), Int: 1}); r != "" {
		t.Fatalf("an ADD to a key that exists: %s", r)
	}
	if r, _, _ := send(t, p, "10.0.0.4", setReq("/0", "shorter")); r != "" {
		t.Fatalf("a shorter overwrite past the total: %s", r)
	}
}

// TestQuotaOwnership: a key is charged to whoever wrote it last; IPv6 addresses of one /64 are one
// source; keys are capped like bytes.
func TestQuotaOwnership(t *testing.T) {
	p, q := quotaPolicy(t, QuotaLimits{SourceKeys: 2, TotalKeys: 1 << 20, Mode: Enforce})
	send(t, p, "10.0.0.1", setReq("/a", "1"))
	send(t, p, "10.0.0.2", setReq("/a", "22"))
	if b, k := q.Holding(netip.MustParseAddr("10.0.0.1")); b != 0 || k != 0 {
		t.Fatalf("the first writer still holds %d bytes, %d keys", b, k)
	}
	if b, _ := q.Holding(netip.MustParseAddr("10.0.0.2")); b != cost(2, 2) {
		t.Fatalf("the last writer holds %d", b)
	}
	send(t, p, "2001:db8:1:2::1", setReq("/b", "1"))
	send(t, p, "2001:db8:1:2:ffff::7", setReq("/c", "1"))
	if r, d, _ := send(t, p, "2001:db8:1:2:dead::1", setReq("/d", "1")); r != protocol.RuleStoreQuota ||
		!strings.Contains(d, "2001:db8:1:2::/64 would hold 3 keys") {
		t.Fatalf("a third key from one /64: %q %q", r, d)
	}
	if r, _, _ := send(t, p, "2001:db8:1:3::1", setReq("/d", "1")); r != "" {
		t.Fatalf("another /64: %s", r)
	}
}

// TestQuotaOps: what each op charges: APPEND and QUEUE_PUSH grow a key, QUEUE_POP gives an item
// back, a MULTI_SET that names a key twice is charged as the store ends up, a COMPARE_SET as a SET
// of its desired value.
func TestQuotaOps(t *testing.T) {
	p, q := quotaPolicy(t, QuotaLimits{TotalKeys: 1 << 20, Mode: Enforce})
	src := netip.MustParseAddr("10.0.0.1")
	held := func() int64 { b, _ := q.Holding(src); return b }
	send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpAppend, Key: []byte("/l"), Value: valueOf(10)})
	send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpAppend, Key: []byte("/l"), Value: valueOf(10)})
	if held() != cost(2, 20) {
		t.Fatalf("APPEND: %d", held())
	}
	send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpDeleteKey, Key: []byte("/l")})
	for range 3 {
		send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpQueuePush, Key: []byte("/q"), Value: valueOf(100)})
	}
	if want := cost(2, 0) + 3*(entryCost+100); held() != want {
		t.Fatalf("QUEUE_PUSH: %d, want %d", held(), want)
	}
	send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpQueuePop, Key: []byte("/q")})
	if want := cost(2, 0) + 2*(entryCost+100); held() != want {
		t.Fatalf("QUEUE_POP: %d, want %d", held(), want)
	}
	// A store keeps queues apart from keys: a DELETE_KEY of the name leaves the queue.
	send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpDeleteKey, Key: []byte("/q")})
	if want := cost(2, 0) + 2*(entryCost+100); held() != want {
		t.Fatalf("DELETE_KEY of a queue's name: %d, want %d", held(), want)
	}
	send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpQueuePop, Key: []byte("/q")})
	send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpQueuePop, Key: []byte("/q")})
	if want := cost(2, 0); held() != want {
		t.Fatalf("an empty queue: %d, want %d", held(), want)
	}
	base := held()
	held = func() int64 { b, _ := q.Holding(src); return b - base }
	send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpMultiSet, Keys: [][]byte{[]byte("/m"), []byte("/n"), []byte("/m")},
		Values: [][]byte{valueOf(1000), valueOf(5), valueOf(7)}})
	if want := cost(2, 5) + cost(2, 7); held() != want {
		t.Fatalf("MULTI_SET: %d, want %d", held(), want)
	}
	send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpCompareSet, Key: []byte("/m"), Value: valueOf(7), Desired: valueOf(70)})
	if want := cost(2, 5) + cost(2, 70); held() != want {
		t.Fatalf("COMPARE_SET: %d, want %d", held(), want)
	}
	// A COMPARE_SET creates a key the store does not have only with an empty expected value.
	send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpCompareSet, Key: []byte("/x"), Value: valueOf(3), Desired: valueOf(70)})
	if s := q.Stats(); s.Keys != 3 {
		t.Fatalf("keys %d, want 3 (/q, /m, /n)", s.Keys)
	}
	send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpCompareSet, Key: []byte("/x"), Desired: valueOf(70)})
	if s := q.Stats(); s.Keys != 4 {
		t.Fatalf("keys %d, want 4", s.Keys)
	}
	q.Reset()
	if s := q.Stats(); s != (QuotaStats{}) || held() != -base {
		t.Fatalf("after Reset: %+v", s)
	}
}

// TestQuotaMonitorAndOtherRules: in monitor mode a write over the cap is reported and charged (it
// reaches the store); a message another rule blocks is charged nothing.
func TestQuotaMonitorAndOtherRules(t *testing.T) {
	p, q := quotaPolicy(t, QuotaLimits{SourceBytes: cost(2, 10), TotalKeys: 1 << 20, Mode: Monitor})
	send(t, p, "10.0.0.1", setReq("/a", string(valueOf(10))))
	r, d, warned := send(t, p, "10.0.0.1", setReq("/b", string(valueOf(10))))
	if r != "" || !warned || !strings.Contains(d, "per-source-store-bytes") {
		t.Fatalf("monitor: rule %q, warned %v %q", r, warned, d)
	}
	if _, k := q.Holding(netip.MustParseAddr("10.0.0.1")); k != 2 {
		t.Fatalf("a monitored write is not charged: %d keys", k)
	}
	evil := protocol.Request{Op: protocol.OpMultiSet, Keys: [][]byte{[]byte("/c"), []byte("/d")},
		Values: [][]byte{[]byte("ok"), unhex(t, evil4)}}
	if r, _, _ := send(t, p, "10.0.0.2", evil); r != protocol.RulePickleGlobalDenied {
		t.Fatalf("evil: %s", r)
	}
	if b, _ := q.Holding(netip.MustParseAddr("10.0.0.2")); b != 0 {
		t.Fatalf("a blocked message was charged %d", b)
	}
}

func BenchmarkQuota(b *testing.B) {
	p, _ := quotaPolicy(b, QuotaLimits{SourceBytes: 1 << 28, TotalBytes: 1 << 30, SourceKeys: 1 << 18, TotalKeys: 1 << 20, Mode: Enforce})
	for _, bc := range []struct {
		name string
		req  protocol.Request
	}{
		{"ADD", protocol.Request{Op: protocol.OpAdd, Key: []byte("/torch.rendezvous.job-7.0/counter"), Int: 1}},
		{"small SET", setReq("/torch.rendezvous.job-7.0/MASTER_ADDR_x", "10.1.2.3")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			msg, raw := message(b, bc.req)
			m := Message{Msg: msg, Bytes: protocol.Split{B: raw}, Src: netip.MustParseAddr("10.0.0.1")}
			b.ReportAllocs()
			for b.Loop() {
				p.Check(m, nil)
			}
		})
	}
}

// TestQuotaOutlivedStore: an account that outlived the store's keys (the store restarted, a new
// job on the same port) starts afresh when the store, asked before a refusal, holds fewer keys
// than the account counts; a store that holds them all, or does not answer, keeps the refusal.
func TestQuotaOutlivedStore(t *testing.T) {
	c := Defaults()
	c.Quota = QuotaLimits{SourceKeys: 2, TotalKeys: 1 << 20, Mode: Enforce}
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	var storeKeys int64
	var countErr error
	asked := 0
	q := NewQuota()
	p = p.WithStore(Store{Written: NewWritten(16), Quota: q, Count: func() (int64, error) { asked++; return storeKeys, countErr }})
	send(t, p, "10.0.0.1", setReq("/a", "1"))
	send(t, p, "10.0.0.1", setReq("/b", "1"))
	if asked != 0 {
		t.Fatal("the store was asked before any refusal")
	}
	storeKeys = 2 // the store holds them
	if r, _, _ := send(t, p, "10.0.0.1", setReq("/c", "1")); r != protocol.RuleStoreQuota || asked != 1 {
		t.Fatalf("over the cap, the store holding every key: %q, asked %d", r, asked)
	}
	countErr = errors.New("slow")
	storeKeys = 0
	if r, _, _ := send(t, p, "10.0.0.1", setReq("/c", "1")); r != protocol.RuleStoreQuota {
		t.Fatalf("over the cap, the store not answering: %q", r)
	}
	countErr = nil // the store restarted: it holds nothing the account counts
	if r, _, _ := send(t, p, "10.0.0.1", setReq("/c", "1")); r != "" {
		t.Fatalf("the account outlived the store: %q", r)
	}
	if s := q.Stats(); s.Keys != 1 {
		t.Fatalf("after starting afresh the account holds %d keys, want 1", s.Keys)
	}
	// Queues are not keys to GETNUMKEYS, and a COMPARE_SET that cannot create a key is not one to
	// the account: neither makes the account look outlived.
	q.Reset()
	send(t, p, "10.0.0.2", protocol.Request{Op: protocol.OpQueuePush, Key: []byte("/q1"), Value: valueOf(1)})
	send(t, p, "10.0.0.2", protocol.Request{Op: protocol.OpCompareSet, Key: []byte("/x"), Value: valueOf(1), Desired: valueOf(9)})
	send(t, p, "10.0.0.2", protocol.Request{Op: protocol.OpQueuePush, Key: []byte("/q2"), Value: valueOf(1)})
	if r, _, _ := send(t, p, "10.0.0.2", protocol.Request{Op: protocol.OpQueuePush, Key: []byte("/q3"), Value: valueOf(1)}); r != protocol.RuleStoreQuota {
		t.Fatalf("a third queue, the store holding no key: %q", r)
	}
}

// TestQuotaInvariants: any sequence of writes, overwrites, deletes and queue ops from several
// sources, some refused, leaves the account consistent: the total is the sum of the sources', each
// source holds keys, nothing is negative, the caps hold, and deleting everything empties it.
func TestQuotaInvariants(t *testing.T) {
	lim := QuotaLimits{SourceBytes: 20_000, TotalBytes: 50_000, SourceKeys: 30, TotalKeys: 80, Mode: Enforce}
	p, q := quotaPolicy(t, lim)
	rng := rand.New(rand.NewPCG(7, 25))
	srcs := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "2001:db8::1", "2001:db8::2"}
	key := func() []byte { return fmt.Appendf(nil, "/k%d", rng.IntN(60)) }
	ops := []protocol.Op{protocol.OpSet, protocol.OpSet, protocol.OpCompareSet, protocol.OpAdd, protocol.OpDeleteKey,
		protocol.OpAppend, protocol.OpMultiSet, protocol.OpQueuePush, protocol.OpQueuePop}
	check := func(step int) {
		q.mu.Lock()
		defer q.mu.Unlock()
		var bytes, keys, kv int64
		for _, h := range q.keys {
			if h.owner == nil || h.bytes < h.base-entryCost || h.items < 0 {
				t.Fatalf("step %d: entry %+v", step, h)
			}
			if !h.queue {
				kv++
			}
		}
		for p, u := range q.srcs {
			if u.src != p || u.keys <= 0 || u.bytes <= 0 {
				t.Fatalf("step %d: source %v %+v", step, p, u)
			}
			if u.bytes > lim.SourceBytes || u.keys > lim.SourceKeys {
				t.Fatalf("step %d: source %v over its caps: %+v", step, p, u)
			}
			bytes += u.bytes
			keys += u.keys
		}
		if bytes != q.all.bytes || keys != q.all.keys || keys != int64(len(q.keys)) || kv != q.kv {
			t.Fatalf("step %d: sources %d bytes %d keys, total %+v, %d entries, kv %d/%d", step, bytes, keys, q.all, len(q.keys), kv, q.kv)
		}
		if q.all.bytes > lim.TotalBytes || q.all.keys > lim.TotalKeys {
			t.Fatalf("step %d: total over the caps: %+v", step, q.all)
		}
	}
	refused := 0
	for step := range 20000 {
		r := protocol.Request{Op: ops[rng.IntN(len(ops))], Key: key(), Value: valueOf(rng.IntN(3000))}
		switch r.Op {
		case protocol.OpCompareSet:
			r.Value, r.Desired = valueOf(rng.IntN(2)), valueOf(rng.IntN(3000))
		case protocol.OpAdd:
			r.Value, r.Int = nil, 1
		case protocol.OpDeleteKey, protocol.OpQueuePop:
			r.Value = nil
		case protocol.OpMultiSet:
			r.Keys, r.Values = [][]byte{r.Key, key(), r.Key}, [][]byte{r.Value, valueOf(rng.IntN(500)), valueOf(rng.IntN(500))}
			r.Key, r.Value = nil, nil
		}
		if rule, _, _ := send(t, p, srcs[rng.IntN(len(srcs))], r); rule == protocol.RuleStoreQuota {
			refused++
		}
		check(step)
	}
	if refused == 0 {
		t.Fatal("no write was refused: the caps were never reached")
	}
	for i := range 60 {
		send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpDeleteKey, Key: fmt.Appendf(nil, "/k%d", i)})
		for range 200 {
			send(t, p, "10.0.0.1", protocol.Request{Op: protocol.OpQueuePop, Key: fmt.Appendf(nil, "/k%d", i)})
		}
	}
	check(-1)
	if s := q.Stats(); s.Bytes != int64(q.queueBases()) {
		t.Fatalf("after deleting everything: %+v", s)
	}
}

// queueBases is what the emptied queues still hold: each costs its key and entryCost.
func (q *Quota) queueBases() (n int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, h := range q.keys {
		if !h.queue || h.items != 0 {
			return -1
		}
		n += h.base
	}
	return n
}
