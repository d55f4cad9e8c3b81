package verdict

import (
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/admission"
)

// Peeks counts the refused connections being read for ban.peek, at most admission.MaxPeeks at
// once. The zero value is ready and safe for concurrent use.
type Peeks struct{ n atomic.Int32 }

// Peeked reports whether a connection refused for reason is read for peek (ban.peek): a banned
// source's, throttled too, with ban.peek set.
func Peeked(reason admission.Reason, peek time.Duration) bool { return reason.Ban() && peek > 0 }

// Take takes one for a connection to read, unless admission.MaxPeeks are being read: then it is
// closed at once. Done gives it back.
func (p *Peeks) Take() bool {
	if p.n.Add(1) > admission.MaxPeeks {
		p.n.Add(-1)
		return false
	}
	return true
}

// Done gives back one that Take took.
func (p *Peeks) Done() { p.n.Add(-1) }

// Peek is what a refused connection sent first, read for ban.peek: at most admission.PeekBytes,
// until ban.peek after its accept and, once its first bytes came, admission.PeekRest after them at
// most (a probe comes in one write). It is never forwarded: its flow record holds it.
type Peek struct {
	buf   [admission.PeekBytes]byte
	n     int
	until time.Time
}

// NewPeek starts reading at start, for peek (ban.peek).
func NewPeek(start time.Time, peek time.Duration) *Peek { return &Peek{until: start.Add(peek)} }

// Room is where the next bytes go; empty once the peek is full.
func (p *Peek) Room() []byte { return p.buf[p.n:] }

// Took records n bytes put in Room at now, and reports whether Until moved (the first bytes came).
func (p *Peek) Took(n int, now time.Time) (moved bool) {
	first := p.n == 0 && n > 0
	p.n += n
	if first {
		if rest := now.Add(admission.PeekRest); rest.Before(p.until) {
			p.until = rest
			return true
		}
	}
	return false
}

// Read takes what of b fits, at now, and reports whether the peek is full.
func (p *Peek) Read(b []byte, now time.Time) (full bool) {
	p.Took(copy(p.Room(), b), now)
	return p.Full()
}

// Full reports whether admission.PeekBytes came.
func (p *Peek) Full() bool { return p.n == len(p.buf) }

// Until is when reading stops.
func (p *Peek) Until() time.Time { return p.until }

// Bytes is what came; nil for a connection not read (p nil).
func (p *Peek) Bytes() []byte {
	if p == nil {
		return nil
	}
	return p.buf[:p.n]
}
