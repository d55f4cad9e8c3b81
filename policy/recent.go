package policy

// recent is a map that keeps at most n keys, forgetting the oldest first: what the policy
// remembers of the store (Written, JobStores) is bounded by configuration, never by the wire. Not
// safe for concurrent use; its owner locks.
type recent[V any] struct {
	m    map[string]V
	ring []string // the keys in the order they came; "" is a free slot
	next int
}

func newRecent[V any](n int) recent[V] {
	return recent[V]{m: make(map[string]V), ring: make([]string, max(n, 1))}
}

func (r *recent[V]) get(k string) (V, bool) {
	v, ok := r.m[k]
	return v, ok
}

// put sets k's value; a new key takes the oldest one's place when all n are taken.
func (r *recent[V]) put(k string, v V) {
	if _, ok := r.m[k]; !ok {
		if old := r.ring[r.next]; old != "" {
			delete(r.m, old)
		}
		r.ring[r.next] = k
		r.next = (r.next + 1) % len(r.ring)
	}
	r.m[k] = v
}

func (r *recent[V]) reset() {
	clear(r.m)
	clear(r.ring)
	r.next = 0
}
