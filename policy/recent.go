package policy

// recent is a map that keeps at most n keys, forgetting the oldest first: what the policy
// remembers of the store (Written, JobStores, Appends) is bounded by configuration, never by the
// wire. Not safe for concurrent use; its owner locks.
type recent[K comparable, V any] struct {
	m    map[K]V
	ring []K // the keys in the order they came
	used int // slots of ring taken
	next int
}

func newRecent[K comparable, V any](n int) recent[K, V] {
	return recent[K, V]{m: make(map[K]V), ring: make([]K, max(n, 1))}
}

func (r *recent[K, V]) get(k K) (V, bool) {
	v, ok := r.m[k]
	return v, ok
}

// put sets k's value; a new key takes the oldest one's place when all n are taken, and that one's
// value is returned (evicted true).
func (r *recent[K, V]) put(k K, v V) (old V, evicted bool) {
	if _, ok := r.m[k]; !ok {
		if r.used == len(r.ring) {
			old, evicted = r.m[r.ring[r.next]], true
			delete(r.m, r.ring[r.next])
		} else {
			r.used++
		}
		r.ring[r.next] = k
		r.next = (r.next + 1) % len(r.ring)
	}
	r.m[k] = v
	return old, evicted
}

func (r *recent[K, V]) reset() {
	clear(r.m)
	clear(r.ring)
	r.used, r.next = 0, 0
}
