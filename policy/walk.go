package policy

import "github.com/storeguard/storeguard/protocol"

// fieldView is one thing a message does, as rules see it: its op on one key (none for GETNUMKEYS,
// LIST_KEYS, PING ...), with the value it writes there, if any. A MULTI_SET of n pairs is n of them;
// a MULTI_GET of n keys too.
type fieldView struct {
	op       protocol.Op
	key      []byte         // contiguous; nil for an op without keys
	keyField protocol.Field // Kind FieldNone for an op without keys
	val      protocol.Field // the value written (FieldValue, or COMPARE_SET's FieldDesired); Kind FieldNone if none
	va, vb   []byte         // the value's bytes in two parts
	expected int64          // COMPARE_SET's expected value's length
	// pickleJudged: the rendezvous state's own allow-list judged the value's pickle, in place of
	// the default pickle rule: one scan, not two.
	pickleJudged bool
	statePickle  bool       // the rendezvous state's rule passed a state pickle (base64)
	pickleKind   PickleKind // the pickle rule passed a complete pickle of this kind
	// pickleAllow is a policy file's value.globals for the key: what its pickles may import beyond
	// the default allow-list.
	pickleAllow *globalAllow
}

func (v *fieldView) hasValue() bool { return v.val.Kind != protocol.FieldNone }

// walker turns a message into fieldViews.
type walker struct {
	m       Message
	scratch []byte // a key that straddles the two parts of the message, copied
}

// each calls fn with every fieldView of the message, in wire order, until fn returns false.
func (w *walker) each(fn func(fieldView) bool) {
	msg, s := w.m.Msg, w.m.Bytes
	var cur fieldView
	pending, stop := false, false
	emit := func() {
		if pending && !stop {
			stop = !fn(cur)
		}
		pending = false
	}
	msg.EachField(s, func(f protocol.Field) bool {
		switch f.Kind {
		case protocol.FieldKey:
			emit()
			cur = fieldView{op: msg.Op, keyField: f}
			x, y := s.Parts(f.BodyOff(), f.Len)
			if len(y) == 0 {
				cur.key = x
			} else if len(x) == 0 {
				cur.key = y
			} else {
				w.scratch = append(append(w.scratch[:0], x...), y...)
				cur.key = w.scratch
			}
			if cur.key == nil {
				cur.key = []byte{} // an empty key is a key, wherever the split fell
			}
			pending = true
		case protocol.FieldExpected:
			cur.expected = int64(f.Len)
		case protocol.FieldValue, protocol.FieldDesired:
			cur.val = f
			cur.va, cur.vb = s.Parts(f.BodyOff(), f.Len)
		}
		return !stop
	})
	if !pending && cur.keyField.Kind == protocol.FieldNone && !stop {
		// no key at all: one view of the op itself
		fn(fieldView{op: msg.Op})
		return
	}
	emit()
}
