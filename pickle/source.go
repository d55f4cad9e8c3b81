package pickle

// source supplies the pickle bytes to the scanner one window at a time: for a raw pickle the two
// buffers themselves, for base64 a fixed buffer the decoder refills. Offsets are logical: over the
// whole (decoded) byte string.
type source struct {
	win  []byte
	i    int // next byte in win
	base int // offset of win[0]

	enc   Encoding
	a, b  []byte // raw: the pickle; base64: its text
	inB   bool   // raw: win is b, or the input ended
	total int    // raw: len(a) + len(b)

	dec   b64dec // base64: decodes the text into buf
	ahead b64dec // base64: counts decoded bytes ahead of the scan, for FRAME
	fill  int    // base64: bytes the next refill decodes; grows, so that a non-pickle costs little
	buf   [4096]byte
	tmp   [8]byte
}

func (s *source) initRaw(a, b []byte) {
	s.enc, s.a, s.b = Raw, a, b
	s.win, s.i, s.base, s.inB, s.total = a, 0, 0, false, len(a)+len(b)
}

func (s *source) initBase64(a, b []byte) {
	s.enc, s.a, s.b = Base64, a, b
	s.win, s.i, s.base, s.fill = s.buf[:0], 0, 0, 64
	s.dec.init(a, b)
	s.ahead.init(a, b)
}

// release drops the references to the input, so that a pooled scanner does not keep it alive.
func (s *source) release() {
	s.a, s.b, s.win = nil, nil, nil
	s.dec.a, s.dec.b, s.ahead.a, s.ahead.b = nil, nil, nil, nil
}

// off is the offset of the next byte.
func (s *source) off() int { return s.base + s.i }

// refill moves to the next window once win is used up; false at the end of the input.
func (s *source) refill() bool {
	for s.i >= len(s.win) {
		s.base += len(s.win)
		s.i = 0
		if s.enc == Raw {
			if s.inB {
				s.win = nil
				return false
			}
			s.inB, s.win = true, s.b
			continue
		}
		n := s.dec.decode(s.buf[:s.fill])
		s.fill = min(4*s.fill, len(s.buf))
		s.win = s.buf[:n]
		if n == 0 {
			return false
		}
	}
	return true
}

func (s *source) readByte() (byte, bool) {
	if s.i >= len(s.win) && !s.refill() {
		return 0, false
	}
	c := s.win[s.i]
	s.i++
	return c, true
}

// read returns the next n (at most 8) bytes, valid until the next read.
func (s *source) read(n int) ([]byte, bool) {
	if s.i+n <= len(s.win) {
		p := s.win[s.i : s.i+n]
		s.i += n
		return p, true
	}
	for k := range n {
		c, ok := s.readByte()
		if !ok {
			return nil, false
		}
		s.tmp[k] = c
	}
	return s.tmp[:n], true
}

// chunk consumes and returns the next contiguous bytes, at most max of them; nil at the end.
func (s *source) chunk(max int) []byte {
	if s.i >= len(s.win) && !s.refill() {
		return nil
	}
	n := min(max, len(s.win)-s.i)
	p := s.win[s.i : s.i+n]
	s.i += n
	return p
}

// skip consumes n bytes; false when the input ends first.
func (s *source) skip(n uint64) bool {
	for n > 0 {
		p := s.chunk(int(min(n, 1<<30)))
		if p == nil {
			return false
		}
		n -= uint64(len(p))
	}
	return true
}

// rewindTo sets the offset reported as consumed back to off, once the scan is over; only the
// report reads it then.
func (s *source) rewindTo(off int) {
	s.win, s.i, s.base = nil, 0, off
}

// avail reports whether at least n more bytes follow, without consuming them.
func (s *source) avail(n uint64) bool {
	if s.enc == Raw {
		return uint64(s.total-s.off()) >= n
	}
	// Decoded bytes are fewer than text bytes, which bounds n before the addition.
	if n > uint64(len(s.a)+len(s.b)) {
		return false
	}
	want := s.off() + int(n)
	s.ahead.countTo(want)
	return s.ahead.out >= want
}

// cleanUpTo reports whether the decoded bytes before end can be found again from their offset
// alone (bytesAt): always for raw input, for base64 while no character was skipped before them.
func (s *source) cleanUpTo(end int) bool {
	return s.enc == Raw || s.dec.clean < 0 || end <= s.dec.clean
}

// copyOut copies the bytes at [off, off+len(dst)) of the input into dst; for base64 they must be
// cleanUpTo their end.
func (s *source) copyOut(off int, dst []byte) {
	if s.enc == Base64 {
		bytesAt(s.a, s.b, off, dst)
		return
	}
	n := 0
	if off < len(s.a) {
		n = copy(dst, s.a[off:])
	}
	if n < len(dst) {
		copy(dst[n:], s.b[off+n-len(s.a):])
	}
}
