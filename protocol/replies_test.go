package protocol

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func vec(b string) []byte { return append(u64(uint64(len(b))), b...) }

func TestRepliesEndWhereTheStoreEndsThem(t *testing.T) {
	msg := func(op Op, count uint64) *Message { return &Message{Op: op, Count: count, Generation: G6} }
	for _, tc := range []struct {
		name    string
		reqs    []*Message
		reply   []byte
		wantEnd int // Pending() once the whole reply came, and not before
	}{
		{"get", []*Message{msg(OpGet, 0)}, vec("value"), 0},
		{"get empty", []*Message{msg(OpGet, 0)}, u64(0), 0},
		{"add", []*Message{msg(OpAdd, 0)}, u64(7), 0},
		{"ping", []*Message{msg(OpPing, 0)}, []byte{1, 2, 3, 4}, 0},
		{"check", []*Message{msg(OpCheck, 2)}, []byte{1}, 0},
		{"multi_get", []*Message{msg(OpMultiGet, 3)}, bytes.Join([][]byte{vec("a"), vec(""), vec("ccc")}, nil), 0},
		{"queue_pop empty", []*Message{msg(OpQueuePop, 0)}, u64(0), 0},
		{"queue_pop item", []*Message{msg(OpQueuePop, 0)}, append(u64(3), vec("x")...), 0},
		{"list_keys", []*Message{msg(OpListKeys, 0)}, append(u64(2), append(vec("/a"), vec("/b")...)...), 0},
		{"list_keys none", []*Message{msg(OpListKeys, 0)}, u64(0), 0},
		{"wait then cancel, cancelled", []*Message{msg(OpWait, 1), msg(OpCancelWait, 0)}, []byte{1}, 0},
		{"wait then cancel, raced", []*Message{msg(OpWait, 1), msg(OpCancelWait, 0)}, []byte{0, 1}, 0},
		{"barrier pending", []*Message{msg(OpBarrier, 0)}, nil, 1},
		{"set has none", []*Message{msg(OpSet, 0), msg(OpGet, 0)}, vec("v"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Every split of the reply into two feeds ends the same way.
			for cut := 0; cut <= len(tc.reply); cut++ {
				var r Replies
				for _, m := range tc.reqs {
					r.Expect(m)
				}
				r.Feed(tc.reply[:cut])
				if cut < len(tc.reply) && r.Pending() <= tc.wantEnd {
					t.Fatalf("cut %d: the reply ended before its last byte", cut)
				}
				r.Feed(tc.reply[cut:])
				if r.Pending() != tc.wantEnd || r.Unsolicited != 0 {
					t.Fatalf("cut %d: pending %d unsolicited %d, want %d and 0", cut, r.Pending(), r.Unsolicited, tc.wantEnd)
				}
			}
		})
	}
}

func TestRepliesCountAnsweredAndUnsolicited(t *testing.T) {
	var r Replies
	get := &Message{Op: OpGet, Generation: G6}
	r.Expect(get)
	r.Expect(get)
	if r.Pending() != 2 {
		t.Fatalf("pending %d", r.Pending())
	}
	if n := r.Feed(append(vec("abc"), vec("d")...)); n != 2 || r.Pending() != 0 {
		t.Fatalf("answered %d pending %d", n, r.Pending())
	}
	r.Feed([]byte{0, 9})
	if r.Unsolicited != 2 {
		t.Fatalf("unsolicited %d", r.Unsolicited)
	}
}

func TestRepliesG0GivenUpWaitIsForgotten(t *testing.T) {
	// torch 1.13 has no CANCEL_WAIT: after wait() times out the client just sends its next request,
	// and the WAIT's 00 may come much later or never.
	var r Replies
	r.Expect(&Message{Op: OpWait, Count: 1, Generation: G0})
	r.Expect(&Message{Op: OpGetNumKeys, Generation: G0})
	if r.Pending() != 1 {
		t.Fatalf("pending %d, want the GETNUMKEYS only", r.Pending())
	}
	r.Feed(u64(4))
	if r.Pending() != 0 {
		t.Fatalf("pending %d", r.Pending())
	}
}

func TestRepliesWatchKeyMakesThemOpaque(t *testing.T) {
	var r Replies
	r.Expect(&Message{Op: OpWatchKey, Generation: G0})
	r.Expect(&Message{Op: OpGet, Generation: G0})
	if r.Pending() != 0 {
		t.Fatalf("pending %d after WATCH_KEY", r.Pending())
	}
}

func TestRepliesFeedAllocatesNothing(t *testing.T) {
	var r Replies
	get := &Message{Op: OpGet, Generation: G6}
	reply := vec("value")
	if a := testing.AllocsPerRun(100, func() { r.Expect(get); r.Feed(reply) }); a != 0 {
		t.Fatalf("%v allocs", a)
	}
}
