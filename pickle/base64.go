package pickle

// b64dec is binascii.a2b_base64 in non-strict mode (what base64.b64decode(s) runs), as a resumable
// state machine over text held in two parts: characters outside the alphabet are skipped, a '='
// ends the data once it completes a quad that holds at least two characters (pads seen before that
// are skipped too), and text that ends inside a quad is an error ("Incorrect padding", or one
// character more than a multiple of 4). CPython 3.8 to 3.13 agree on all of this.
type b64dec struct {
	a, b  []byte
	pos   int   // text offset, over a then b
	quad  uint8 // characters of the current quad seen (quad_pos)
	left  byte  // bits carried to the next character (leftchar)
	pads  uint8 // '=' counted toward closing the quad
	done  bool  // a complete padding ended the data
	out   int   // decoded bytes produced
	clean int   // decoded bytes produced before the first skipped character, or -1 while none
}

// Decoded alphabet values; b64Pad and b64Skip are not data.
const (
	b64Pad  = 0xfe
	b64Skip = 0xff
)

var b64Table = func() (t [256]byte) {
	for i := range t {
		t[i] = b64Skip
	}
	for i, c := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") {
		t[c] = byte(i)
	}
	t['='] = b64Pad
	return t
}()

func (d *b64dec) init(a, b []byte) {
	*d = b64dec{a: a, b: b, clean: -1}
}

// segment is the rest of the text from pos in one contiguous piece, empty at the end.
func (d *b64dec) segment() []byte {
	if d.pos < len(d.a) {
		return d.a[d.pos:]
	}
	return d.b[d.pos-len(d.a):]
}

func (d *b64dec) skipped() {
	if d.clean < 0 {
		d.clean = d.out
	}
}

// decode writes the next decoded bytes into dst and returns how many: 0 only at the end of the
// data (a complete padding, or the end of the text).
func (d *b64dec) decode(dst []byte) int {
	n := 0
	for n < len(dst) && !d.done {
		seg := d.segment()
		if len(seg) == 0 {
			break
		}
		i := 0
		for i < len(seg) && n < len(dst) {
			// Fast path: a whole quad of alphabet characters.
			if d.quad == 0 && i+4 <= len(seg) && n+3 <= len(dst) {
				c0, c1, c2, c3 := b64Table[seg[i]], b64Table[seg[i+1]], b64Table[seg[i+2]], b64Table[seg[i+3]]
				if c0|c1|c2|c3 < 64 {
					dst[n] = c0<<2 | c1>>4
					dst[n+1] = c1<<4 | c2>>2
					dst[n+2] = c2<<6 | c3
					n += 3
					i += 4
					d.out += 3
					d.pads = 0
					continue
				}
			}
			c := b64Table[seg[i]]
			i++
			if c == b64Pad {
				d.skipped()
				if d.quad >= 2 {
					d.pads++
					if d.quad+d.pads >= 4 {
						d.done = true
						break
					}
				}
				continue
			}
			if c == b64Skip {
				d.skipped()
				for i < len(seg) && b64Table[seg[i]] == b64Skip { // a run of binary: one load a byte
					i++
				}
				continue
			}
			d.pads = 0
			switch d.quad {
			case 0:
				d.quad, d.left = 1, c
			case 1:
				dst[n] = d.left<<2 | c>>4
				n++
				d.out++
				d.quad, d.left = 2, c&0x0f
			case 2:
				dst[n] = d.left<<4 | c>>2
				n++
				d.out++
				d.quad, d.left = 3, c&0x03
			case 3:
				dst[n] = d.left<<6 | c
				n++
				d.out++
				d.quad, d.left = 0, 0
			}
		}
		d.pos += i
	}
	return n
}

// countTo advances without output until at least want bytes were produced or the data ended.
func (d *b64dec) countTo(want int) {
	var sink [512]byte
	for d.out < want {
		if d.decode(sink[:min(len(sink), want-d.out)]) == 0 {
			return
		}
	}
}

// finish runs to the end of the data and reports whether b64decode would return (not raise).
func (d *b64dec) finish() bool {
	var sink [512]byte
	for d.decode(sink[:]) > 0 {
	}
	return d.done || d.quad == 0
}

// bytesAt copies the decoded bytes [off, off+len(dst)) of text that had no skipped character up
// to there (off+len(dst) <= clean, or clean < 0 and they were produced): decoded offset j is bits
// of the characters at text offsets 4*(j/3) + j%3 and the one after it.
func bytesAt(a, b []byte, off int, dst []byte) {
	at := func(p int) byte {
		if p < len(a) {
			return b64Table[a[p]]
		}
		return b64Table[b[p-len(a)]]
	}
	for k := range dst {
		j := off + k
		p := 4*(j/3) + j%3
		c0, c1 := at(p), at(p+1)
		switch j % 3 {
		case 0:
			dst[k] = c0<<2 | c1>>4
		case 1:
			dst[k] = c0<<4 | c1>>2
		default:
			dst[k] = c0<<6 | c1
		}
	}
}

// DecodeBase64 is base64.b64decode(a+b) in full: the decoded bytes and whether it would return.
// Scans never need it (they decode as they read); it allocates the decoded size, for a caller that
// must read a base64 pickle's literals (Report.Bytes) and for the decoder's tests.
func DecodeBase64(a, b []byte) ([]byte, bool) { return decodeBase64(a, b) }

func decodeBase64(a, b []byte) ([]byte, bool) {
	var d b64dec
	d.init(a, b)
	out := make([]byte, 0, (len(a)+len(b))/4*3+3)
	var buf [4096]byte
	for {
		n := d.decode(buf[:])
		if n == 0 {
			break
		}
		out = append(out, buf[:n]...)
	}
	if !(d.done || d.quad == 0) {
		return nil, false
	}
	return out, true
}
