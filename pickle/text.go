package pickle

import (
	"bytes"
	"math"
	"strconv"
	"unicode/utf8"
)

// The text opcodes' arguments, read as CPython reads them. Their parsers see the line without its
// '\n' and, like the C functions they mirror, stop at a NUL byte: the C code reads a NUL-terminated
// copy of the line.

func beforeNUL(p []byte) []byte {
	if i := bytes.IndexByte(p, 0); i >= 0 {
		return p[:i]
	}
	return p
}

// isCSpace is C isspace in the C locale, and CPython's Py_ISSPACE.
func isCSpace(c byte) bool { return c == ' ' || (c >= '\t' && c <= '\r') }

// digitValue is CPython's _PyLong_DigitValue: 0-9, then letters as 10-35, else 37.
func digitValue(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'z':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'Z':
		return int(c-'A') + 10
	}
	return 37
}

// intLineOK is load_int: strtol(s, &end, 0) must end at the line's end without overflow, or else
// PyLong_FromString(s, NULL, 0) must accept it.
func intLineOK(line []byte) bool {
	s := beforeNUL(line)
	return strtolWhole(s) || pyLongOK(s, 0)
}

// strtolWhole is glibc strtol with base 0 consuming all of s without ERANGE. With no digits at
// all strtol leaves its end pointer at the start, which passes only when s is empty (a NUL).
func strtolWhole(s []byte) bool {
	if len(s) == 0 {
		return true
	}
	i := 0
	for i < len(s) && isCSpace(s[i]) {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	base := uint64(10)
	if i < len(s) && s[i] == '0' {
		base = 8
		if i+2 < len(s) && s[i+1]|0x20 == 'x' && digitValue(s[i+2]) < 16 {
			base = 16
			i += 2
		}
	}
	start := i
	var v uint64
	over := false
	for i < len(s) && uint64(digitValue(s[i])) < base {
		d := uint64(digitValue(s[i]))
		if v > (math.MaxUint64-d)/base {
			over = true
		} else {
			v = v*base + d
		}
		i++
	}
	if i == start || i != len(s) {
		return false
	}
	if over || v > math.MaxInt64+1 || (v == math.MaxInt64+1 && !neg) {
		return false
	}
	return true
}

// pyLong is PyLong_FromString(s, NULL, base) for base 0 or 10: whether it accepts s, and the value
// saturated past MaxInt64 (magnitude; neg set for a nonzero negative value). CPython 3.11 also
// refuses more than 4300 decimal digits (sys.get_int_max_str_digits); earlier releases do not, and
// neither does this, so a scan never stops where some Python would go on.
func pyLong(s []byte, base int) (v uint64, neg, ok bool) {
	i := 0
	for i < len(s) && isCSpace(s[i]) {
		i++
	}
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	at := func(k int) byte {
		if k < len(s) {
			return s[k]
		}
		return 0
	}
	nonzeroIsError := false
	if base == 0 {
		switch {
		case at(i) != '0':
			base = 10
		case at(i+1)|0x20 == 'x':
			base = 16
		case at(i+1)|0x20 == 'o':
			base = 8
		case at(i+1)|0x20 == 'b':
			base = 2
		default:
			nonzeroIsError = true // an old C-style octal literal: only zero passes
			base = 10
		}
		if base != 10 {
			i += 2
			if at(i) == '_' {
				i++
			}
		}
	}
	if at(i) == '_' {
		return 0, false, false
	}
	start := i
	var prev byte
	nonzero := false
	for i < len(s) && (digitValue(s[i]) < base || s[i] == '_') {
		c := s[i]
		if c == '_' {
			if prev == '_' {
				return 0, false, false
			}
		} else {
			d := uint64(digitValue(c))
			if d != 0 {
				nonzero = true
			}
			if v > (math.MaxUint64-d)/uint64(base) {
				v = math.MaxUint64
			} else {
				v = v*uint64(base) + d
			}
		}
		prev = c
		i++
	}
	if prev == '_' || i == start || (nonzeroIsError && nonzero) {
		return 0, false, false
	}
	for i < len(s) && isCSpace(s[i]) {
		i++
	}
	if i != len(s) {
		return 0, false, false
	}
	return v, neg && nonzero, true
}

func pyLongOK(s []byte, base int) bool {
	_, _, ok := pyLong(s, base)
	return ok
}

// longLineOK is load_long: a trailing 'L' is cut, then PyLong_FromString(s, NULL, 0).
func longLineOK(line []byte) bool {
	if n := len(line); n > 0 && line[n-1] == 'L' {
		line = line[:n-1]
	}
	return pyLongOK(beforeNUL(line), 0)
}

// memoKeyLine is the GET and PUT argument: PyLong_FromString(s, NULL, 10) then PyLong_AsSsize_t.
// ok is false where Python raises (not a number, or past Py_ssize_t); neg for a negative key.
func memoKeyLine(line []byte) (key uint64, neg, ok bool) {
	v, neg, ok := pyLong(beforeNUL(line), 10)
	if !ok {
		return 0, false, false
	}
	if (!neg && v > math.MaxInt64) || (neg && v > math.MaxInt64+1) {
		return 0, false, false // OverflowError
	}
	return v, neg, true
}

// floatLineOK is load_float: PyOS_string_to_double must consume the whole line (up to a NUL) and
// raises OverflowError for a finite literal too large for a double.
func floatLineOK(line []byte) bool {
	s := beforeNUL(line)
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	// _Py_dg_strtod: digits, optional '.', digits, at least one digit in all.
	intStart := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	intDigits := s[intStart:i]
	var fracDigits []byte
	if i < len(s) && s[i] == '.' {
		i++
		f := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		fracDigits = s[f:i]
	}
	if len(intDigits)+len(fracDigits) == 0 {
		return infOrNaN(s)
	}
	exp := int64(0)
	if i < len(s) && s[i]|0x20 == 'e' {
		j := i + 1
		eneg := false
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			eneg = s[j] == '-'
			j++
		}
		d := j
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			if exp < 1<<40 {
				exp = exp*10 + int64(s[j]-'0')
			}
			j++
		}
		if j > d { // an exponent needs a digit, else the 'e' is not part of the number
			i = j
			if eneg {
				exp = -exp
			}
		} else {
			exp = 0
		}
	}
	if i != len(s) {
		return false
	}
	return !floatOverflows(intDigits, fracDigits, exp)
}

// infOrNaN is _Py_parse_inf_or_nan on the whole of s.
func infOrNaN(s []byte) bool {
	if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
		s = s[1:]
	}
	w := string(bytes.ToLower(s))
	return w == "inf" || w == "infinity" || w == "nan"
}

// floatOverflows reports whether CPython's load_float raises OverflowError for the literal. dtoa
// raises for a value of 1e309 or more, never for one up to the largest double, and in between it
// depends on the digits (1.7976931348623159e308 raises, the 309-digit halfway point to 2**1024
// does not): there the scan goes on, as Python may.
func floatOverflows(intDigits, fracDigits []byte, exp int64) bool {
	mag := int64(-1) // decimal exponent of the first nonzero digit, relative to the point
	for i, c := range intDigits {
		if c != '0' {
			mag = int64(len(intDigits) - i - 1)
			break
		}
	}
	if mag < 0 {
		i := 0
		for i < len(fracDigits) && fracDigits[i] == '0' {
			i++
		}
		if i == len(fracDigits) {
			return false // zero
		}
		mag = -int64(i) - 1
	}
	return mag+exp >= 309
}

// utf8Check validates UTF-8 the way CPython's decoder does in strict mode, or with surrogatepass
// (what BINUNICODE uses), fed in pieces.
type utf8Check struct {
	need   uint8
	lo, hi byte
	bad    bool
}

func (u *utf8Check) feed(p []byte, surrogates bool) {
	if u.bad || (u.need == 0 && utf8.Valid(p)) {
		return // Go's UTF-8 is CPython's strict UTF-8: no surrogates, no overlongs
	}
	for i := 0; i < len(p); {
		c := p[i]
		i++
		if u.need > 0 {
			if c < u.lo || c > u.hi {
				u.bad = true
				return
			}
			u.need--
			u.lo, u.hi = 0x80, 0xbf
			continue
		}
		if c < 0x80 {
			continue
		}
		u.lo, u.hi = 0x80, 0xbf
		switch {
		case c >= 0xc2 && c <= 0xdf:
			u.need = 1
		case c == 0xe0:
			u.need, u.lo = 2, 0xa0
		case c == 0xed && !surrogates:
			u.need, u.hi = 2, 0x9f
		case c >= 0xe1 && c <= 0xef:
			u.need = 2
		case c == 0xf0:
			u.need, u.lo = 3, 0x90
		case c >= 0xf1 && c <= 0xf3:
			u.need = 3
		case c == 0xf4:
			u.need, u.hi = 3, 0x8f
		default:
			u.bad = true
			return
		}
	}
}

func (u *utf8Check) ok() bool { return !u.bad && u.need == 0 }

func isASCII(p []byte) bool {
	for _, c := range p {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// strOut collects a decoded str value, keeping its first MaxStrLen bytes.
type strOut struct {
	buf [MaxStrLen]byte
	n   int // bytes decoded in all
}

func (o *strOut) byte(c byte) {
	if o.n < len(o.buf) {
		o.buf[o.n] = c
	}
	o.n++
}

// rune appends r in UTF-8, surrogates included (as Python's str holds them).
func (o *strOut) rune(r rune) {
	switch {
	case r < 0x80:
		o.byte(byte(r))
	case r < 0x800:
		o.byte(0xc0 | byte(r>>6))
		o.byte(0x80 | byte(r)&0x3f)
	case r < 0x10000:
		o.byte(0xe0 | byte(r>>12))
		o.byte(0x80 | byte(r>>6)&0x3f)
		o.byte(0x80 | byte(r)&0x3f)
	default:
		o.byte(0xf0 | byte(r>>18))
		o.byte(0x80 | byte(r>>12)&0x3f)
		o.byte(0x80 | byte(r>>6)&0x3f)
		o.byte(0x80 | byte(r)&0x3f)
	}
}

func (o *strOut) kept() []byte {
	if o.n > len(o.buf) {
		return nil
	}
	return o.buf[:o.n]
}

// escapeDecoder is _PyBytes_DecodeEscape (the STRING opcode's argument between its quotes), fed a
// byte at a time. Unknown escapes stay as they are (Python warns, does not raise).
type escapeDecoder struct {
	state    uint8 // 0 plain, 1 after '\', 2 octal, 3 hex
	acc      int
	count    int
	bad      bool
	nonASCII bool
}

func (d *escapeDecoder) emit(o *strOut, c byte) {
	if c >= 0x80 {
		d.nonASCII = true
	}
	o.byte(c)
}

func (d *escapeDecoder) feed(o *strOut, c byte) {
	if d.bad {
		return
	}
	switch d.state {
	case 2:
		if c >= '0' && c <= '7' && d.count < 3 {
			d.acc = d.acc<<3 + int(c-'0')
			d.count++
			return
		}
		d.emit(o, byte(d.acc))
		d.state = 0
	case 3:
		v := digitValue(c)
		if v >= 16 {
			d.bad = true
			return
		}
		d.acc = d.acc<<4 + v
		d.count++
		if d.count == 2 {
			d.emit(o, byte(d.acc))
			d.state = 0
		}
		return
	case 1:
		d.state = 0
		switch c {
		case '\n':
		case '\\', '\'', '"':
			d.emit(o, c)
		case 'b':
			d.emit(o, '\b')
		case 'f':
			d.emit(o, '\f')
		case 't':
			d.emit(o, '\t')
		case 'n':
			d.emit(o, '\n')
		case 'r':
			d.emit(o, '\r')
		case 'v':
			d.emit(o, '\v')
		case 'a':
			d.emit(o, '\a')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			d.state, d.acc, d.count = 2, int(c-'0'), 1
		case 'x':
			d.state, d.acc, d.count = 3, 0, 0
		default:
			d.emit(o, '\\')
			d.emit(o, c)
		}
		return
	}
	if c == '\\' {
		d.state = 1
		return
	}
	d.emit(o, c)
}

// end finishes the argument; false where Python raises (a trailing '\', a short \x escape).
func (d *escapeDecoder) end(o *strOut) bool {
	switch d.state {
	case 1, 3:
		d.bad = true
	case 2:
		d.emit(o, byte(d.acc))
	}
	d.state = 0
	return !d.bad
}

// rawUnicodeDecoder is the raw-unicode-escape codec (the UNICODE opcode): bytes are Latin-1 code
// points, except \uXXXX and \UXXXXXXXX; any other backslash stays with the byte after it.
type rawUnicodeDecoder struct {
	state uint8 // 0 plain, 1 after '\', 2 in hex digits
	acc   rune
	need  int
	bad   bool
}

func (d *rawUnicodeDecoder) feed(o *strOut, c byte) {
	if d.bad {
		return
	}
	switch d.state {
	case 1:
		switch c {
		case 'u':
			d.state, d.acc, d.need = 2, 0, 4
		case 'U':
			d.state, d.acc, d.need = 2, 0, 8
		default:
			d.state = 0
			o.byte('\\')
			o.rune(rune(c))
		}
		return
	case 2:
		v := digitValue(c)
		if v >= 16 {
			d.bad = true
			return
		}
		d.acc = d.acc<<4 | rune(v)
		d.need--
		if d.need == 0 {
			if d.acc > 0x10ffff {
				d.bad = true
				return
			}
			o.rune(d.acc)
			d.state = 0
		}
		return
	}
	if c == '\\' {
		d.state = 1
		return
	}
	o.rune(rune(c))
}

func (d *rawUnicodeDecoder) end(o *strOut) bool {
	switch d.state {
	case 1:
		o.byte('\\') // a backslash that ends the string is itself
	case 2:
		d.bad = true // truncated \u or \U escape
	}
	d.state = 0
	return !d.bad
}

// Latin1 returns the bytes _codecs.encode(s, "latin1") makes of the str literal whose encoded
// bytes are p (t: how the pickle encodes it), the way pickle protocols 0 to 2 carry a bytes object;
// ok is false when that call would raise (a code point above U+00FF) or p does not decode.
func Latin1(p []byte, t Text) (out []byte, ok bool) {
	out = make([]byte, 0, len(p))
	put := func(r rune) bool {
		if r < 0 || r > 0xff {
			return false
		}
		out = append(out, byte(r))
		return true
	}
	switch t {
	case TextUTF8:
		for len(p) > 0 {
			r, n := utf8.DecodeRune(p)
			if r == utf8.RuneError && n <= 1 || !put(r) {
				return nil, false
			}
			p = p[n:]
		}
		return out, true
	case TextRawUnicodeEscape:
		for i := 0; i < len(p); {
			if p[i] != '\\' {
				out = append(out, p[i]) // a byte is the code point of the same value
				i++
				continue
			}
			// \u and \U escape only after an odd run of backslashes (CPython's raw_unicode_escape).
			j := i
			for j < len(p) && p[j] == '\\' {
				j++
			}
			out = append(out, p[i:j]...)
			run := j - i
			i = j
			if run&1 == 0 || j >= len(p) || p[j] != 'u' && p[j] != 'U' {
				continue
			}
			out = out[:len(out)-1]
			n := 4
			if p[j] == 'U' {
				n = 8
			}
			if j+1+n > len(p) {
				return nil, false
			}
			v, err := strconv.ParseUint(string(p[j+1:j+1+n]), 16, 32)
			if err != nil || !put(rune(v)) {
				return nil, false
			}
			i = j + 1 + n
		}
		return out, true
	}
	return nil, false
}
