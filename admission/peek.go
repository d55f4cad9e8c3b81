package admission

import "time"

// A banned source's connection is refused, yet its first bytes say what it came with: the probes a
// scanner sends after its ban (nmap's TerminalServer, the #106294 ADD, comes 22nd) would otherwise
// never be named. serve reads them for ban.peek, never forwarding them; replay takes the same
// bytes from a capture.
const (
	// PeekBytes is how much of a banned source's connection is read: enough to name a probe and to
	// see the lengths of a first message.
	PeekBytes = 64
	// PeekRest is how long it is read for once its first bytes came: a probe comes in one write.
	PeekRest = 100 * time.Millisecond
	// MaxPeeks bounds the banned connections read at once; beyond it they are closed at once.
	MaxPeeks = 256
)

// Ban reports whether a connection refused for r was refused for its source's ban (refused
// outright, or throttled while the source serves a job): its first bytes are read for ban.peek.
func (r Reason) Ban() bool { return r == Banned || r == BanThrottled }
