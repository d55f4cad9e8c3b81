package protocol

import "encoding/binary"

// Split is one message's bytes held in two parts, A then B: the start a caller held from earlier
// reads, and the rest in the read that completed it. Offsets are relative to the message's opcode
// byte, as Field.Off is.
type Split struct{ A, B []byte }

// Len is the number of bytes in s.
func (s Split) Len() uint64 { return uint64(len(s.A) + len(s.B)) }

// Parts returns the n bytes at off as the part in A and the part in B; off+n must be within s.
func (s Split) Parts(off, n uint64) (x, y []byte) {
	la := uint64(len(s.A))
	switch {
	case off >= la:
		return nil, s.B[off-la : off-la+n]
	case off+n <= la:
		return s.A[off : off+n], nil
	}
	return s.A[off:], s.B[:off+n-la]
}

// AppendTo appends the n bytes at off to dst.
func (s Split) AppendTo(dst []byte, off, n uint64) []byte {
	x, y := s.Parts(off, n)
	return append(append(dst, x...), y...)
}

func (s Split) uint(off, width uint64) uint64 {
	var b [8]byte
	x, y := s.Parts(off, width)
	copy(b[copy(b[:], x):], y)
	if width == 4 {
		return uint64(binary.LittleEndian.Uint32(b[:]))
	}
	return binary.LittleEndian.Uint64(b[:])
}

// EachField calls fn with every field of m, a complete message whose bytes are s, in wire order,
// the keys and values of a list op included (Message.Fields records only the first
// MaxRecordedFields). It stops early when fn returns false, and at any length that does not fit
// in s: the decoder checked every one, so that happens only when s is not m's bytes.
func (m *Message) EachField(s Split, fn func(Field) bool) {
	if m.Op >= numOps || opLayouts[m.Op] == nil {
		return
	}
	lay, off := opLayouts[m.Op], uint64(1)
	step := func(k FieldKind) bool {
		w := k.width()
		if off+w > s.Len() {
			return false
		}
		f := Field{Kind: k, Off: off}
		v := s.uint(off, w)
		off += w
		if k.hasBody() {
			if v > s.Len()-off {
				return false
			}
			f.Len = v
			off += v
		} else {
			f.Int = v
		}
		return fn(f)
	}
	count := uint64(0)
	for _, k := range lay.head {
		if !step(k) {
			return
		}
		if k == FieldCount {
			count = s.uint(off-8, 8)
		}
	}
	for i := uint64(0); i < count && len(lay.loop) > 0; i++ {
		for _, k := range lay.loop {
			if !step(k) {
				return
			}
		}
	}
}
