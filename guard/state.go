package guard

import (
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// StreamState is a stream's state at the start of its message in progress (or between messages):
// what serve hands to the process that takes the connection over. The held bytes of the message in
// progress go with it, and are fed again to the restored stream (Restore).
type StreamState struct {
	Decoder  protocol.DecoderState // unset while Passing
	Start    time.Time
	MsgStart time.Time // when the message in progress began
	Spared   bool
	Passing  bool
	Talked   bool
	Bytes    uint64 // judged before the message in progress
	Counts   [32]uint64
}

// State is s's state at the start of its message in progress.
func (s *Stream) State() (StreamState, error) {
	st := StreamState{Start: s.start, Spared: s.spared, Passing: s.passing, Talked: s.talked,
		Bytes: s.bytes - s.Held(), Counts: s.counts}
	if s.InMessage() {
		st.MsgStart = s.msgStart
	}
	if s.passing {
		return st, nil
	}
	var err error
	st.Decoder, err = s.dec.State()
	return st, err
}

// Restore readies s to go on from st under pol: the next bytes it is fed are those of the message
// in progress then (the held bytes), and the message keeps the deadline it had.
func (s *Stream) Restore(st StreamState, pol *Policy) {
	*s = Stream{pol: pol, start: st.Start, spared: st.Spared, passing: st.Passing, talked: st.Talked,
		bytes: st.Bytes, counts: st.Counts, resumed: st.MsgStart}
	if !st.Passing {
		s.dec.Restore(st.Decoder)
	}
}
