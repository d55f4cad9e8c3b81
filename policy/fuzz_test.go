package policy

import (
	"testing"

	"github.com/storeguard/storeguard/protocol"
)

// FuzzCheck: any value on the state key or another, split anywhere, is judged without a panic,
// and alike wherever the split falls.
func FuzzCheck(f *testing.F) {
	for _, c := range defaultCases(f) {
		if len(c.req.Value) > 0 {
			f.Add(string(c.req.Key), c.req.Value, uint16(len(c.req.Value)/2))
		}
	}
	p, err := New(Defaults())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key string, value []byte, cut uint16) {
		if len(key) > 8192 {
			return
		}
		msg, b := message(t, protocol.Request{Op: protocol.OpQueuePush, Key: []byte(key), Value: value})
		// Each judgement with write-once keys of its own: the first would mark the key for the second.
		whole, wholeBroke := p.WithStore(Store{Written: NewWritten(4), Quota: NewQuota()}).Check(Message{Msg: msg, Bytes: protocol.Split{B: b}}, nil)
		at := int(cut) % (len(b) + 1)
		split, splitBroke := p.WithStore(Store{Written: NewWritten(4), Quota: NewQuota()}).Check(Message{Msg: msg, Bytes: protocol.Split{A: b[:at], B: b[at:]}}, nil)
		if wholeBroke != splitBroke || whole.Rule != split.Rule || whole.Detail != split.Detail {
			t.Fatalf("whole: %v %s %q; split at %d: %v %s %q", wholeBroke, whole.Rule, whole.Detail, at, splitBroke, split.Rule, split.Detail)
		}
	})
}
