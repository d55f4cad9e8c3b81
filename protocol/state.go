package protocol

import "fmt"

// The state of a stream's decoder and of its replies, as one process hands a live connection to
// another (serve's upgrade in place): plain data, with no pointers into either side.

// DecoderState is a decoder's state at the start of its message in progress, or between messages:
// what a new decoder needs to go on where the old one stands once it is fed the bytes of that
// message again. The bytes of a message in progress are the caller's (serve holds them), so
// nothing of the message itself is in here.
type DecoderState struct {
	Config    Config
	Gen       Generation
	Validated bool   // the VALIDATE handshake is done (2.2+ generations)
	Offset    uint64 // stream offset of the message in progress, or of the next message
	Index     uint64 // index of that message
}

// State is d's state at the start of its message in progress. d must be of one generation (not
// auto, or resolved) and not stopped by a violation.
func (d *Decoder) State() (DecoderState, error) {
	switch {
	case d.err != nil:
		return DecoderState{}, fmt.Errorf("decoder: stopped by %s", d.err.Rule)
	case !d.resolved || d.detecting:
		return DecoderState{}, fmt.Errorf("decoder: generation not known yet")
	}
	st := DecoderState{Config: d.cfg, Gen: d.gen, Validated: d.validated, Offset: d.off, Index: d.index}
	if d.inMsg {
		st.Offset = d.msg.Offset
		if d.msg.Op == OpValidate {
			st.Validated = false // completing it validates the stream
		}
	}
	return st, nil
}

// Restore readies d to go on from st: the next bytes it is fed are the message at st.Offset.
func (d *Decoder) Restore(st DecoderState) {
	cfg := st.Config
	cfg.Gen = GenSetting{Gen: st.Gen}
	d.Reset(cfg)
	d.validated, d.off, d.index = st.Validated, st.Offset, st.Index
}

// RepliesState is a Replies' whole state.
type RepliesState struct {
	Awaited     []AwaitedReply
	Part        uint8
	Need        uint64
	Num         [8]byte
	NumN        int
	Items       uint64
	Opaque      bool
	Unsolicited uint64
}

// AwaitedReply is one reply a Replies awaits: its shape and size (replyShape and awaited.n).
type AwaitedReply struct {
	Shape uint8
	N     uint64
}

// State is r's whole state.
func (r *Replies) State() RepliesState {
	st := RepliesState{Part: uint8(r.part), Need: r.need, Num: r.num, NumN: r.numN, Items: r.items,
		Opaque: r.opaque, Unsolicited: r.Unsolicited}
	for i := 0; i < r.n; i++ {
		a := r.q[(r.head+i)%MaxAwaited]
		st.Awaited = append(st.Awaited, AwaitedReply{Shape: uint8(a.shape), N: a.n})
	}
	return st
}

// Restore sets r to st. A state that could not have come from State (more replies awaited than
// MaxAwaited, a number longer than 8 bytes) is an error, and r is then Reset.
func (r *Replies) Restore(st RepliesState) error {
	*r = Replies{}
	if len(st.Awaited) > MaxAwaited || st.NumN < 0 || st.NumN > len(st.Num) || st.Part > uint8(partCount) {
		return fmt.Errorf("replies: state out of range (%d awaited, part %d, %d number bytes)",
			len(st.Awaited), st.Part, st.NumN)
	}
	for i, a := range st.Awaited {
		if a.Shape == uint8(replyNone) || a.Shape > uint8(replyListKeys) {
			return fmt.Errorf("replies: reply shape %d out of range", a.Shape)
		}
		r.q[i] = awaited{shape: replyShape(a.Shape), n: a.N}
	}
	r.n = len(st.Awaited)
	if r.n > 0 { // else what is left of the last reply read is stale, and begin sets it anew
		r.part, r.need, r.num, r.numN, r.items = replyPart(st.Part), st.Need, st.Num, st.NumN, st.Items
	}
	r.opaque, r.Unsolicited = st.Opaque, st.Unsolicited
	return nil
}
