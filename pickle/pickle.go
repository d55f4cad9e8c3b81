// Package pickle inspects Python pickles, protocols 0 to 5, and reports what unpickling them would
// do: every global the unpickler would import (each find_class call) and every call it would make.
// It reads the bytes as pickle.loads reads them, which is CPython's C unpickler (Modules/_pickle.c)
// with its defaults: fix_imports=True, encoding="ASCII", errors="strict", no out-of-band buffers.
// testdata/corpus holds the proof: pickles, hostile and real (torch's rendezvous state from each
// release), each with what pickle.loads did with it.
//
// It never runs anything: no import, no call, no object is built. Values are tracked only as far
// as the answer needs them: the strings STACK_GLOBAL takes its module and name from (through the
// stack and the memo), which global a call's result came from, and the type of literal values
// (str, tuple, list, ...) on which Python itself raises, so that a scan stops where Python stops.
// Where the outcome depends on what a global is at run time, or on the Python release, the scan
// assumes the unpickler goes on: it may report more than Python would do, never less. Where it
// cannot know, it says so rather than guess: an EXT opcode (Report.Ext: the copyreg extension
// registry of the loading process), a persistent id (Report.Persistent: its persistent_load), a
// STACK_GLOBAL on strings it did not keep (Global.Resolved false), a call on something that is not
// a known global (Call.Callee -1). A caller that fails closed treats all of these as unknown.
//
// A scan is bounded whatever the input: each byte is read a fixed number of times at most, the
// tables are capped by Limits (stack and marks, memo entries, globals and calls) and by fixed
// sizes (kept strings of at most MaxStrLen bytes, 256 KiB of copied strings), nothing recurses,
// and nothing allocated grows with the input. The base64 form is decoded as it is read, through a
// fixed buffer, so a value that is not a pickle costs about the few bytes it takes to see that.
package pickle

import (
	"errors"
	"strconv"
)

// Limits bound one scan's work and memory. A zero or negative field takes its DefaultLimits value.
type Limits struct {
	MaxOps     int // opcodes read before the scan stops with ErrLimit
	MaxStack   int // entries of stack plus metastack (marks) tracked before ErrLimit
	MaxMemo    int // memo entries tracked; past it a GET yields a value of unknown kind (never an error)
	MaxGlobals int // globals and calls recorded; past it Report.Truncated is set, scanning goes on
}

// DefaultLimits are sized for the torchrun rendezvous state and the values that go with it, with
// room to spare: a scan within them holds at most about 3 MiB.
func DefaultLimits() Limits {
	return Limits{MaxOps: 1 << 22, MaxStack: 1 << 16, MaxMemo: 1 << 16, MaxGlobals: 256}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxOps <= 0 {
		l.MaxOps = d.MaxOps
	}
	if l.MaxStack <= 0 {
		l.MaxStack = d.MaxStack
	}
	if l.MaxMemo <= 0 {
		l.MaxMemo = d.MaxMemo
	}
	if l.MaxGlobals <= 0 {
		l.MaxGlobals = d.MaxGlobals
	}
	return l
}

// MaxStrLen is the longest string, in bytes of its UTF-8 form, that a scan keeps for STACK_GLOBAL
// and for GLOBAL and INST names. A longer one is "not kept": a global named by it is unresolved.
const MaxStrLen = 1024

// Global is one find_class call the unpickler would make, in order.
type Global struct {
	// Module and Name are what find_class passes on to the import, after _compat_pickle's
	// fix_imports mapping (applied while the pickle's protocol is below 3, as pickle.loads does by
	// default); "" when not Resolved. With protocol 4 and later a dotted Name is an attribute path.
	Module, Name string
	// Resolved is false when the scanner did not keep the strings: a STACK_GLOBAL whose operands
	// are longer than MaxStrLen, were dropped for the memo bound, or are values whose type only the
	// run time knows; a GLOBAL or INST line longer than MaxStrLen. The caller treats it as unknown.
	Resolved bool
	Op       string // "GLOBAL", "STACK_GLOBAL" or "INST"
	Offset   int    // offset of the opcode in the (decoded) pickle bytes
}

// Call is one call the unpickler would make.
type Call struct {
	// Op is the opcode: "REDUCE", "NEWOBJ", "NEWOBJ_EX", "INST", "OBJ", "BUILD" (__setstate__ or
	// the default state update), or "APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS" when
	// their target is not a plain list, dict or set, so that Python calls the target's own
	// extend/append, __setitem__ or add.
	Op string
	// Callee indexes Report.Globals: for REDUCE, INST and OBJ the callable, for NEWOBJ and
	// NEWOBJ_EX the class; for BUILD and the container ops the global whose call made the target
	// object. -1 when not known: the callable or target is not a global or the result of calling
	// one (for example the result of another call), or the global was past MaxGlobals.
	Callee int
	Offset int
}

// Encoding is how the pickle was carried.
type Encoding uint8

const (
	Raw    Encoding = iota // the bytes as pickle.dumps wrote them
	Base64                 // base64.b64encode of them, as torch's C10dRendezvousBackend stores its state
)

func (e Encoding) String() string {
	switch e {
	case Raw:
		return "raw"
	case Base64:
		return "base64"
	}
	return "Encoding(" + strconv.Itoa(int(e)) + ")"
}

// Report is what one scan found.
type Report struct {
	Encoding Encoding
	Protocol int   // argument of the last PROTO opcode read (the unpickler's protocol), 0 without one
	Complete bool  // the scan reached STOP, and Python would return a value
	Err      error // why it stopped before STOP: errors.Is ErrMalformed or ErrLimit; a *Error
	// RanOut: the scan stopped because the input ended inside the pickle (Python's "ran out of
	// input", "pickle data was truncated"): more bytes after these could have gone on with it.
	RanOut    bool
	Globals   []Global // in the order the unpickler would import them, including those before an error
	Calls     []Call
	Truncated bool // more than MaxGlobals globals or calls: the rest were not recorded
	// UnknownCalls counts the calls whose Callee is -1, those past MaxGlobals included: a call on
	// something that is not a known global (a call's result, a value the scan did not keep).
	UnknownCalls int
	Ext          bool // an EXT1/EXT2/EXT4 opcode (copyreg extension registry) was read
	Persistent   bool // PERSID/BINPERSID read
	// ExtOffset and PersistentOffset are where the first of each lies, when Ext or Persistent.
	ExtOffset, PersistentOffset int
	End                         int // bytes consumed: the offset just past STOP when Complete
	// Bytes are where the bytes and bytearray literals lie in the (decoded) pickle, at most
	// MaxGlobals of them (then BytesTruncated): a caller can inspect what a global such as
	// torch.storage._load_from_bytes will load from one.
	Bytes          []Span
	BytesTruncated bool
	// Strs are where the str literals lie (BINUNICODE's UTF-8, UNICODE's raw-unicode-escape line),
	// at most MaxGlobals of them (then StrsTruncated), in a pickle that imports _codecs.encode (nil
	// in any other): at protocols 0 to 2 a bytes object is pickled as _codecs.encode(str, "latin1"),
	// so a caller can read such bytes from one (Latin1).
	Strs          []Span
	StrsTruncated bool
}

// Span is a range of the (decoded) pickle's bytes.
type Span struct {
	Off, Len int
	Text     Text // for a str literal, how its bytes encode it
}

// Text is how a str literal's bytes encode it.
type Text uint8

const (
	TextNone             Text = iota // not a str: a bytes literal
	TextUTF8                         // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
	TextRawUnicodeEscape             // UNICODE: Python's raw-unicode-escape, one line
)

var (
	// ErrMalformed: Python's unpickler would raise here; what it did before (Globals) still ran.
	ErrMalformed = errors.New("pickle: malformed")
	// ErrLimit: a Limits bound stopped the scan; Python would go on, so what follows is unknown.
	ErrLimit = errors.New("pickle: scan limit")
)

// Error says where and why a scan stopped. errors.Is(err, ErrMalformed) or ErrLimit tells which.
type Error struct {
	Kind   error // ErrMalformed or ErrLimit
	Op     byte  // the opcode being read, 0 when the input ended before one
	Offset int   // offset of that opcode
	Reason string
}

func (e *Error) Error() string {
	return e.Kind.Error() + ": " + e.Reason + " at offset " + strconv.Itoa(e.Offset) +
		" (opcode 0x" + strconv.FormatUint(uint64(e.Op), 16) + ")"
}

func (e *Error) Unwrap() error { return e.Kind }

// Scan reads a followed by b (one byte string split in two: a network message held in two buffers)
// as a raw pickle.
func Scan(a, b []byte, lim Limits) Report {
	s := getScanner(lim)
	defer putScanner(s)
	s.src.initRaw(a, b)
	s.run()
	s.r.Encoding = Raw
	return s.r
}

// ScanBase64 decodes a then b exactly as Python's base64.b64decode(s) does (validate=False:
// characters outside the alphabet are discarded, padding as binascii.a2b_base64 treats it in
// non-strict mode, data after a complete padding ignored) and scans the result as a raw pickle.
// It decodes as it reads, in a fixed buffer.
//
// ok is false when b64decode would raise, and then the Report is zero: pickle.loads never runs.
// Deciding that takes one more pass over the text, without allocating, which is skipped in one
// case: when the scan stopped on malformed data before anything that could run (no global, call,
// EXT or persistent id), nothing runs whether or not the text is valid base64, and ok is true with
// that Report. So a value that is not a pickle costs about the bytes it took to see so.
func ScanBase64(a, b []byte, lim Limits) (r Report, ok bool) {
	s := getScanner(lim)
	defer putScanner(s)
	s.src.initBase64(a, b)
	s.run()
	s.r.Encoding = Base64
	nothingRan := len(s.r.Globals) == 0 && len(s.r.Calls) == 0 && !s.r.Truncated && !s.r.Ext && !s.r.Persistent
	if !s.r.Complete && errors.Is(s.r.Err, ErrMalformed) && nothingRan {
		return s.r, true
	}
	if !s.src.dec.finish() {
		return Report{}, false
	}
	return s.r, true
}

// Extendable reports whether bytes written after a+b (a TCPStore APPEND) could change what loading
// the value does. Read raw, the pickle ran out of input; read as base64 (Python's b64decode), no
// padding ends the text and either a quantum is under way (b64decode raises now, and may not
// then) or the decoded pickle ran out of input. Otherwise loading stops where it does now whatever
// follows: at STOP (pickle.loads ignores what comes after it), at a malformed byte, or at the
// padding (b64decode ignores what comes after it).
func Extendable(a, b []byte, lim Limits) bool {
	if r := Scan(a, b, lim); r.RanOut {
		return true
	}
	s := getScanner(lim)
	defer putScanner(s)
	s.src.initBase64(a, b)
	s.run()
	d := &s.src.dec
	d.finish()
	return !d.done && (d.quad != 0 || s.r.RanOut)
}
