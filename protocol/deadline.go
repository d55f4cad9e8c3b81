package protocol

import "time"

// Deadlines are serve's time limits on a stream. serve applies them on the wall clock and replay
// on capture time, so that a recorded stream is judged as serve would have judged it live.
type Deadlines struct {
	Message      time.Duration // a started message must complete within this; 0 = off
	FirstMessage time.Duration // a stream must send its first byte within this; 0 = off
}

// Next is when the stream's next deadline falls, zero for none: the message deadline while a
// message is in progress (it began at msgStart), else the first-message deadline while the stream
// (begun at start) has sent nothing, unless that deadline was waived.
func (dl Deadlines) Next(d *Decoder, start, msgStart time.Time, waived bool) time.Time {
	switch {
	case d.InMessage() && dl.Message > 0:
		return msgStart.Add(dl.Message)
	case d.Offset() == 0 && dl.FirstMessage > 0 && !waived:
		return start.Add(dl.FirstMessage)
	}
	return time.Time{}
}

// Expire stops d at a deadline that Next returned and that has passed: RuleMessageTimeout for the
// message in progress, RuleFirstMessageTimeout for a stream that sent nothing.
func (dl Deadlines) Expire(d *Decoder) *Violation {
	if d.InMessage() {
		return d.Expire(RuleMessageTimeout)
	}
	return d.Expire(RuleFirstMessageTimeout)
}

// MaySpareSilent reports whether a stream that sent nothing by its first-message deadline may be
// let live: torch <= 2.0 (G0, and so auto) opens a second connection per store that never sends a
// byte, which is expected when its source already has a working connection.
func MaySpareSilent(g GenSetting, sourceHasWorkingStream bool) bool {
	return (g.Auto || g.Gen == G0) && sourceHasWorkingStream
}
