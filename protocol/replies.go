package protocol

import "encoding/binary"

// Replies follows the store-to-client half of one connection: which forwarded requests still await
// their replies, and where each reply ends. Replies are unframed, so where one ends is known only
// from the request it answers (docs/protocol.md, the response column): Expect is told each request
// as it is forwarded, Feed the store's bytes in order.
//
// It never rejects anything: a reply that does not parse as expected only shifts where it thinks
// replies end. Legitimate clients wait for each reply before the next request, so bytes that come
// while nothing is awaited are passed as Unsolicited and the count starts afresh from there: a
// shift heals at the next reply. Reset clears it for a caller that sees no progress at all.
type Replies struct {
	q    [MaxAwaited]awaited
	head int
	n    int
	// The reply at the head of q, in progress: what it is reading, the bytes of that part still
	// to come, and the items after it.
	part   replyPart
	need   uint64
	num    [8]byte // an i64 or u64 length being read
	numN   int
	items  uint64
	opaque bool // WATCH_KEY was forwarded: the store pushes notifications nobody asked for

	Unsolicited uint64 // bytes that came while no reply was awaited
}

// MaxAwaited is the most requests a Replies follows at once: serve never forwards more before
// their replies (limits.max-pending-replies is validated against it).
const MaxAwaited = 64

type replyShape uint8

const (
	replyNone     replyShape = iota
	replyFixed               // n bytes
	replyWait                // WAIT or BARRIER: 00, deferred; 01 if a CANCEL_WAIT behind it cancelled it
	replyCancel              // CANCEL_WAIT: 01
	replyBytes               // u64 length, then that many bytes
	replyBytesN              // count × (u64 length, bytes)
	replyQueuePop            // i64 queue length before the pop; if > 0, u64 length and the item
	replyListKeys            // i64 n, then n × (u64 length, bytes)
)

type awaited struct {
	shape replyShape
	n     uint64 // replyFixed: bytes; replyBytesN: items
}

type replyPart uint8

const (
	partFixed replyPart = iota + 1 // need bytes of a fixed reply
	partByte                       // WAIT/BARRIER/CANCEL's one byte
	partLen                        // a u64 length (items left after this value: items)
	partBody                       // need bytes of a value
	partCount                      // LIST_KEYS's i64 count or QUEUE_POP's i64 length
)

// shapeOf is the reply op gets; count is a list op's key count.
func shapeOf(op Op, count uint64) awaited {
	switch op {
	case OpAdd, OpGetNumKeys, OpDeleteKey, OpQueueLen:
		return awaited{shape: replyFixed, n: 8}
	case OpCheck:
		return awaited{shape: replyFixed, n: 1}
	case OpPing:
		return awaited{shape: replyFixed, n: 4}
	case OpWait, OpBarrier:
		return awaited{shape: replyWait}
	case OpCancelWait:
		return awaited{shape: replyCancel}
	case OpGet, OpCompareSet:
		return awaited{shape: replyBytes}
	case OpMultiGet:
		return awaited{shape: replyBytesN, n: count}
	case OpQueuePop:
		return awaited{shape: replyQueuePop}
	case OpListKeys:
		return awaited{shape: replyListKeys}
	}
	return awaited{} // VALIDATE, SET, APPEND, MULTI_SET, QUEUE_PUSH: no reply
}

// Awaits reports whether op is answered (a MULTI_GET of no keys gets an empty reply: none).
func Awaits(op Op, count uint64) bool {
	a := shapeOf(op, count)
	return a.shape != replyNone && !(a.shape == replyBytesN && a.n == 0)
}

// AnswersAtOnce reports whether a store answers op as soon as it reads it: answered, and not a
// WAIT or BARRIER (answered when their keys are set) or a CANCEL_WAIT.
func AnswersAtOnce(op Op, count uint64) bool {
	switch shapeOf(op, count).shape {
	case replyWait, replyCancel:
		return false
	}
	return Awaits(op, count)
}

// Expect records that m was forwarded. A G0 client has no CANCEL_WAIT: a request while its WAIT is
// unanswered means the client gave the WAIT up (its reply, if it ever comes, is unsolicited).
func (r *Replies) Expect(m *Message) {
	if m.Op == OpWatchKey {
		r.opaque = true
	}
	if r.opaque {
		return
	}
	if m.Generation == G0 {
		r.dropWaits()
	}
	if !Awaits(m.Op, m.Count) || r.n == MaxAwaited {
		return
	}
	r.q[(r.head+r.n)%MaxAwaited] = shapeOf(m.Op, m.Count)
	r.n++
	if r.n == 1 {
		r.begin()
	}
}

// dropWaits forgets unanswered WAITs (G0 only has WAIT among deferred replies).
func (r *Replies) dropWaits() {
	headWait := r.n > 0 && r.q[r.head].shape == replyWait
	k := 0
	for i := 0; i < r.n; i++ {
		if a := r.q[(r.head+i)%MaxAwaited]; a.shape != replyWait {
			r.q[(r.head+k)%MaxAwaited] = a
			k++
		}
	}
	r.n = k
	if headWait && r.n > 0 {
		r.begin() // the reply in progress was the WAIT's, which has no bytes in progress
	}
}

// Pending is how many forwarded requests await their replies; 0 once WATCH_KEY made it opaque.
func (r *Replies) Pending() int { return r.n }

// Reset forgets every awaited reply, as if the stream had just begun.
func (r *Replies) Reset() {
	opaque, un := r.opaque, r.Unsolicited
	*r = Replies{opaque: opaque, Unsolicited: un}
}

// begin starts reading the reply at the head of q.
func (r *Replies) begin() {
	a := r.q[r.head]
	r.numN, r.items = 0, 0
	switch a.shape {
	case replyFixed:
		r.part, r.need = partFixed, a.n
	case replyWait, replyCancel:
		r.part = partByte
	case replyBytes:
		r.part, r.items = partLen, 0
	case replyBytesN:
		r.part, r.items = partLen, a.n-1
	case replyQueuePop, replyListKeys:
		r.part = partCount
	}
}

// done ends the reply at the head of q; it returns how many requests that answered (a WAIT
// cancelled by the CANCEL_WAIT behind it answers both).
func (r *Replies) done(k int) int {
	r.head = (r.head + k) % MaxAwaited
	r.n -= k
	if r.n > 0 {
		r.begin()
	}
	return k
}

// Feed reads p, the store's next bytes to the client, and returns how many awaited replies it
// completed.
func (r *Replies) Feed(p []byte) (answered int) {
	for len(p) > 0 {
		if r.n == 0 || r.opaque {
			r.Unsolicited += uint64(len(p))
			return answered
		}
		a := r.q[r.head]
		switch r.part {
		case partFixed, partBody:
			k := min(r.need, uint64(len(p)))
			r.need -= k
			p = p[k:]
			if r.need > 0 {
				return answered
			}
			if r.part == partBody && r.items > 0 {
				r.items--
				r.part, r.numN = partLen, 0
				continue
			}
			answered += r.done(1)
		case partByte:
			b := p[0]
			p = p[1:]
			if a.shape == replyWait && b == 1 && r.n > 1 && r.q[(r.head+1)%MaxAwaited].shape == replyCancel {
				answered += r.done(2) // WAIT_CANCELED answers the WAIT and its cancel
				continue
			}
			answered += r.done(1)
		case partLen, partCount:
			k := copy(r.num[r.numN:], p)
			r.numN += k
			p = p[k:]
			if r.numN < 8 {
				return answered
			}
			v := binary.LittleEndian.Uint64(r.num[:])
			r.numN = 0
			if r.part == partLen {
				r.part, r.need = partBody, v
				if v == 0 {
					if r.items > 0 {
						r.items--
						r.part = partLen
						continue
					}
					answered += r.done(1)
				}
				continue
			}
			// partCount: QUEUE_POP's length before the pop, or LIST_KEYS's count.
			switch {
			case int64(v) <= 0:
				answered += r.done(1)
			case a.shape == replyQueuePop:
				r.part, r.items = partLen, 0
			default:
				r.part, r.items = partLen, v-1
			}
		}
	}
	return answered
}
