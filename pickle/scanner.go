package pickle

import (
	"encoding/binary"
	"math"
	"sync"
)

// kind is what the scan knows of a value's type. Literals are values whose type the opcode that
// made them fixes; Python raises on some operations on them whatever the globals are.
type kind uint8

const (
	kAbsent    kind = iota // an empty memo slot; never on the stack
	kAny                   // type known only at run time: a call's result, a persistent id, an untracked memo entry
	kGlobal                // what find_class returned (or an EXT opcode)
	kStr                   // str
	kBytes                 // bytes
	kByteArray             // bytearray
	kView                  // read-only memoryview (READONLY_BUFFER of a bytearray)
	kScalar                // int, bool, float, None
	kTuple
	kList
	kDict
	kSet
	kFrozenSet
)

// literal: the opcode that made the value fixed its type.
func (k kind) literal() bool { return k >= kStr }

// Where a str value's bytes are.
const (
	refNone  uint8 = iota // not kept: longer than MaxStrLen, or no room
	refInput              // at offset x of the input (raw, or base64 decodable from the offset)
	refArena              // at offset x of the scanner's arena
)

// Hashability, for the literal checks Python makes when it builds a dict, set or frozenset.
const (
	hashYes uint8 = iota
	hashNo
	hashMaybe
)

// val is one stack or memo entry.
type val struct {
	k    kind
	ref  uint8 // kStr: refNone, refInput or refArena
	hash uint8 // kTuple: hashYes, hashNo or hashMaybe from its items
	n    int32 // kStr: length of its UTF-8 form
	x    int   // kStr: offset per ref; kGlobal: index into Report.Globals; kAny: index of the global whose call made it; -1 none
}

func (v val) hashable() uint8 {
	switch v.k {
	case kAny, kGlobal:
		return hashMaybe
	case kByteArray, kList, kDict, kSet:
		return hashNo
	case kTuple:
		return v.hash
	}
	return hashYes
}

// maker is the global whose call made v (for BUILD and the container ops), -1 if none is known.
func (v val) maker() int {
	if v.k == kAny {
		return v.x
	}
	return -1
}

// callee is v as a callable: its global index, -1 when not a known global.
func (v val) callee() int {
	if v.k == kGlobal {
		return v.x
	}
	return -1
}

// Pickle opcodes (Lib/pickle.py, Lib/pickletools.py).
const (
	opMARK             = '('
	opSTOP             = '.'
	opPOP              = '0'
	opPOP_MARK         = '1'
	opDUP              = '2'
	opFLOAT            = 'F'
	opINT              = 'I'
	opBININT           = 'J'
	opBININT1          = 'K'
	opLONG             = 'L'
	opBININT2          = 'M'
	opNONE             = 'N'
	opPERSID           = 'P'
	opBINPERSID        = 'Q'
	opREDUCE           = 'R'
	opSTRING           = 'S'
	opBINSTRING        = 'T'
	opSHORT_BINSTRING  = 'U'
	opUNICODE          = 'V'
	opBINUNICODE       = 'X'
	opAPPEND           = 'a'
	opBUILD            = 'b'
	opGLOBAL           = 'c'
	opDICT             = 'd'
	opEMPTY_DICT       = '}'
	opAPPENDS          = 'e'
	opGET              = 'g'
	opBINGET           = 'h'
	opINST             = 'i'
	opLONG_BINGET      = 'j'
	opLIST             = 'l'
	opEMPTY_LIST       = ']'
	opOBJ              = 'o'
	opPUT              = 'p'
	opBINPUT           = 'q'
	opLONG_BINPUT      = 'r'
	opSETITEM          = 's'
	opTUPLE            = 't'
	opEMPTY_TUPLE      = ')'
	opSETITEMS         = 'u'
	opBINFLOAT         = 'G'
	opPROTO            = 0x80
	opNEWOBJ           = 0x81
	opEXT1             = 0x82
	opEXT2             = 0x83
	opEXT4             = 0x84
	opTUPLE1           = 0x85
	opTUPLE2           = 0x86
	opTUPLE3           = 0x87
	opNEWTRUE          = 0x88
	opNEWFALSE         = 0x89
	opLONG1            = 0x8a
	opLONG4            = 0x8b
	opBINBYTES         = 'B'
	opSHORT_BINBYTES   = 'C'
	opSHORT_BINUNICODE = 0x8c
	opBINUNICODE8      = 0x8d
	opBINBYTES8        = 0x8e
	opEMPTY_SET        = 0x8f
	opADDITEMS         = 0x90
	opFROZENSET        = 0x91
	opNEWOBJ_EX        = 0x92
	opSTACK_GLOBAL     = 0x93
	opMEMOIZE          = 0x94
	opFRAME            = 0x95
	opBYTEARRAY8       = 0x96
	opNEXT_BUFFER      = 0x97
	opREADONLY_BUFFER  = 0x98
)

const highestProtocol = 5

// arenaMax bounds the bytes of str values copied for STACK_GLOBAL (text opcodes, and base64 text
// with skipped characters); past it such strings are not kept.
const arenaMax = 256 << 10

// lineMax is how much of a text number argument is read into memory; a longer one is accepted
// unchecked (a memo key of that length is unknown), which can only make the scan go on further.
const lineMax = 4096

// fault is why an opcode stopped the scan; 0 is none. It is a number, not a string, so that the
// opcode loop's frame holds no pointers to clear on every call.
type fault uint8

const (
	fUnderflow fault = iota + 1
	fNoMark
	fTruncated
	fEOF
	fUnknownOp
	fProtocol
	fSize
	fNegativeLong
	fStrDecode
	fStringQuote
	fStringDecode
	fUnicodeDecode
	fNameDecode
	fNumber
	fMemoKey
	fMemoMissing
	fNegativePut
	fStackGlobalStr
	fDictOdd
	fSetitemsOdd
	fUnhashable
	fNoExtend
	fNoSetitem
	fNoAdd
	fArgsNotTuple
	fNotCallable
	fNotType
	fKwargsNotDict
	fPersidASCII
	fExtCode
	fNoBuffers
	fNotBuffer
	fShortFrame
	fLimitOps
	fLimitStack
)

var faultText = [...]string{
	fUnderflow:      "unpickling stack underflow",
	fNoMark:         "could not find MARK",
	fTruncated:      "pickle data was truncated",
	fEOF:            "ran out of input",
	fUnknownOp:      "invalid load key",
	fProtocol:       "unsupported pickle protocol",
	fSize:           "size exceeds the system's maximum",
	fNegativeLong:   "LONG pickle has negative byte count",
	fStrDecode:      "str argument does not decode",
	fStringQuote:    "the STRING opcode argument must be quoted",
	fStringDecode:   "STRING argument does not decode",
	fUnicodeDecode:  "UNICODE argument does not decode",
	fNameDecode:     "module or name line does not decode",
	fNumber:         "could not convert the text argument",
	fMemoKey:        "invalid memo key",
	fMemoMissing:    "memo value not found",
	fNegativePut:    "negative PUT argument",
	fStackGlobalStr: "STACK_GLOBAL requires str",
	fDictOdd:        "odd number of items for DICT",
	fSetitemsOdd:    "odd number of items for SETITEMS",
	fUnhashable:     "unhashable key or item",
	fNoExtend:       "target has no extend or append",
	fNoSetitem:      "target does not support item assignment",
	fNoAdd:          "target has no add",
	fArgsNotTuple:   "argument list must be a tuple",
	fNotCallable:    "callable is not callable",
	fNotType:        "class argument must be a type",
	fKwargsNotDict:  "kwargs argument must be a dict",
	fPersidASCII:    "persistent IDs in protocol 0 must be ASCII strings",
	fExtCode:        "EXT specifies code <= 0",
	fNoBuffers:      "pickle stream refers to out-of-band data but no buffers argument was given",
	fNotBuffer:      "READONLY_BUFFER of an object without the buffer protocol",
	fShortFrame:     "pickle data was truncated",
	fLimitOps:       "MaxOps opcodes read",
	fLimitStack:     "MaxStack entries on the stack",
}

// limit: a Limits bound, not something Python raises on.
func (f fault) limit() bool { return f >= fLimitOps }

// pendingFrame is a FRAME whose size the scan has not checked yet, and the report as it was then.
type pendingFrame struct {
	at, end                      int // offset of the FRAME opcode, and of the frame's end; at -1: none
	proto, globals, calls, bytes int
	strs, unknownCalls           int
	strsTruncated                bool
	truncated, ext, persistent   bool
}

type scanner struct {
	lim Limits
	src source
	r   Report

	globals []Global
	calls   []Call
	bytes   []Span
	strs    []Span

	proto int
	stack []val
	marks []int // stack lengths at each MARK; the top one is the fence

	memo     []val // dense part, indexed by key
	sparse   map[uint64]val
	memoLen  int // entries Python holds (memo_len): where MEMOIZE puts the next one
	memoLost bool

	pend pendingFrame

	arena []byte
	nameL nameLine
	strL  stringLine
	uniL  unicodeLine
	line  [lineMax]byte
	out   strOut
	strb  [MaxStrLen]byte
}

var scannerPool = sync.Pool{New: func() any { return new(scanner) }}

func getScanner(lim Limits) *scanner {
	s := scannerPool.Get().(*scanner)
	s.lim = lim.withDefaults()
	s.r = Report{}
	s.globals, s.calls, s.bytes, s.strs = s.globals[:0], s.calls[:0], s.bytes[:0], s.strs[:0]
	s.proto = 0
	s.stack, s.marks = s.stack[:0], s.marks[:0]
	clear(s.memo)
	s.memo = s.memo[:0]
	clear(s.sparse)
	s.memoLen, s.memoLost = 0, false
	s.pend = pendingFrame{at: -1}
	s.arena = s.arena[:0]
	return s
}

func putScanner(s *scanner) {
	s.src.release()
	// A hostile pickle can grow the tables to their limits; do not keep that in the pool.
	if cap(s.stack) > 4096 || cap(s.memo) > 4096 || len(s.sparse) > 1024 || cap(s.arena) > 64<<10 {
		s.stack, s.memo, s.sparse, s.arena = nil, nil, nil, nil
	}
	scannerPool.Put(s)
}

func (s *scanner) fence() int {
	if len(s.marks) == 0 {
		return 0
	}
	return s.marks[len(s.marks)-1]
}

func (s *scanner) push(v val) fault {
	if len(s.stack)+len(s.marks) >= s.lim.MaxStack {
		return fLimitStack
	}
	s.stack = append(s.stack, v)
	return 0
}

func (s *scanner) pop() (val, fault) {
	if len(s.stack) <= s.fence() {
		return val{}, fUnderflow
	}
	v := s.stack[len(s.stack)-1]
	s.stack = s.stack[:len(s.stack)-1]
	return v, 0
}

// marker pops the top MARK and returns the stack length it recorded.
func (s *scanner) marker() (int, fault) {
	if len(s.marks) == 0 {
		return 0, fNoMark
	}
	m := s.marks[len(s.marks)-1]
	s.marks = s.marks[:len(s.marks)-1]
	return m, 0
}

func (s *scanner) addGlobal(g Global) int {
	if len(s.globals) >= s.lim.MaxGlobals {
		s.r.Truncated = true
		return -1
	}
	s.globals = append(s.globals, g)
	return len(s.globals) - 1
}

// persistentAt records a persistent id read at offset at.
func (s *scanner) persistentAt(at int) {
	if !s.r.Persistent {
		s.r.Persistent, s.r.PersistentOffset = true, at
	}
}

// encodes reports whether the pickle imports _codecs.encode, the one reader of Report.Strs: the
// strs are copied out for it alone.
func (s *scanner) encodes() bool {
	for _, g := range s.globals {
		if g.Resolved && g.Module == "_codecs" && g.Name == "encode" {
			return true
		}
	}
	return false
}

// addStr records where a str literal lies, up to MaxGlobals of them (then StrsTruncated).
func (s *scanner) addStr(sp Span) {
	if len(s.strs) >= s.lim.MaxGlobals {
		s.r.StrsTruncated = true
		return
	}
	s.strs = append(s.strs, sp)
}

func (s *scanner) addCall(op string, callee, at int) {
	if callee < 0 {
		s.r.UnknownCalls++ // counted past the bound too: a fail-closed caller needs every one
	}
	if len(s.calls) >= s.lim.MaxGlobals {
		s.r.Truncated = true
		return
	}
	s.calls = append(s.calls, Call{Op: op, Callee: callee, Offset: at})
}

//go:generate python3 testdata/gen_compat.py

// global records a find_class(module, name) call, applying fix_imports as find_class does.
func (s *scanner) global(op string, at int, module, name []byte, resolved bool) int {
	if len(s.globals) >= s.lim.MaxGlobals {
		s.r.Truncated = true
		return -1
	}
	g := Global{Op: op, Offset: at, Resolved: resolved}
	if resolved {
		g.Module, g.Name = string(module), string(name)
		if s.proto < 3 {
			if m, ok := compatNames[[2]string{g.Module, g.Name}]; ok {
				g.Module, g.Name = m[0], m[1]
			} else if m, ok := compatModules[g.Module]; ok {
				g.Module = m
			}
		}
	}
	return s.addGlobal(g)
}

// strBytes returns a kept str value's bytes, valid until the next call.
func (s *scanner) strBytes(v val) ([]byte, bool) {
	switch v.ref {
	case refInput:
		p := s.strb[:v.n]
		s.src.copyOut(v.x, p)
		return p, true
	case refArena:
		return s.arena[v.x : v.x+int(v.n)], true
	}
	return nil, false
}

// keepArena copies a decoded str value into the arena, if there is room.
func (s *scanner) keepArena(p []byte) val {
	v := val{k: kStr, n: int32(len(p))}
	if len(s.arena)+len(p) <= arenaMax {
		v.ref, v.x = refArena, len(s.arena)
		s.arena = append(s.arena, p...)
	}
	return v
}

func (s *scanner) memoPut(key uint64, v val) {
	if s.memoLost {
		return
	}
	if key == uint64(len(s.memo)) && s.memoLen < s.lim.MaxMemo && key < uint64(s.lim.MaxMemo) {
		s.memo = append(s.memo, v) // MEMOIZE and the picklers' PUTs: the next key in order
		s.memoLen++
		return
	}
	if key < uint64(len(s.memo)) {
		if s.memo[key].k == kAbsent {
			if s.memoFull() {
				return
			}
			s.memoLen++
		}
		s.memo[key] = v
		return
	}
	if key <= uint64(2*len(s.memo)+1024) && key < uint64(s.lim.MaxMemo) {
		if s.memoFull() {
			return
		}
		for uint64(len(s.memo)) < key {
			s.memo = append(s.memo, val{})
		}
		s.memo = append(s.memo, v)
		s.memoLen++
		return
	}
	if _, ok := s.sparse[key]; !ok {
		if s.memoFull() {
			return
		}
		s.memoLen++
	}
	if s.sparse == nil {
		s.sparse = make(map[uint64]val)
	}
	s.sparse[key] = v
}

// memoFull marks the memo lost when one more entry would pass MaxMemo: from then on the scan no
// longer knows which keys hold what (nor where MEMOIZE writes), and every GET is of unknown kind.
func (s *scanner) memoFull() bool {
	if s.memoLen >= s.lim.MaxMemo {
		s.memoLost = true
	}
	return s.memoLost
}

// memoGet: ok false where Python raises (no such entry).
func (s *scanner) memoGet(key uint64) (val, bool) {
	if s.memoLost {
		return val{k: kAny, x: -1}, true
	}
	if key < uint64(len(s.memo)) {
		v := s.memo[key]
		return v, v.k != kAbsent
	}
	v, ok := s.sparse[key]
	return v, ok
}

// run reads opcodes until STOP, an error, or a limit.
func (s *scanner) run() {
	for {
		at := s.src.off()
		if s.ops() {
			s.stop(0, at, fLimitOps)
			return
		}
		op, ok := s.src.readByte()
		if !ok {
			s.stop(0, at, fEOF)
			return
		}
		if op == opSTOP {
			if _, f := s.pop(); f != 0 {
				s.stop(op, at, f)
				return
			}
			s.r.Complete = true
			s.settleFrame()
			s.finish()
			return
		}
		if f := s.step(op, at); f != 0 {
			s.stop(op, at, f)
			return
		}
	}
}

// frame checks that a FRAME's size bytes follow. For base64 text, where that means decoding
// ahead, the check waits: the scan goes on, and settleFrame decides once the scan has read past
// the frame (then it was there) or stopped before its end (then it looks ahead, and if the frame
// is short undoes what the scan recorded after the FRAME, where Python raises).
func (s *scanner) frame(at int, size uint64) fault {
	if s.src.enc == Raw {
		if !s.src.avail(size) {
			return fTruncated
		}
		return 0
	}
	if s.pend.at >= 0 && s.src.off() < s.pend.end && !s.src.avail(uint64(s.pend.end-s.src.off())) {
		return fShortFrame // a FRAME inside an unchecked one settles the first now (no real pickle does)
	}
	if size > uint64(len(s.src.a)+len(s.src.b)) {
		return fTruncated // more than the text could ever decode to
	}
	s.pend = pendingFrame{at: at, end: s.src.off() + int(size), proto: s.proto, globals: len(s.globals),
		calls: len(s.calls), bytes: len(s.bytes), strs: len(s.strs), strsTruncated: s.r.StrsTruncated, unknownCalls: s.r.UnknownCalls, truncated: s.r.Truncated, ext: s.r.Ext,
		persistent: s.r.Persistent}
	return 0
}

// settleFrame decides the pending FRAME check when the scan stops.
func (s *scanner) settleFrame() {
	if s.pend.at < 0 || s.src.off() >= s.pend.end {
		return
	}
	s.src.dec.countTo(s.pend.end) // the scan is over: the main decoder can run on
	if s.src.dec.out < s.pend.end {
		s.rollback()
	}
}

// rollback makes the report what it was when the pending FRAME raised.
func (s *scanner) rollback() {
	p := s.pend
	s.pend.at = -1
	s.globals, s.calls, s.bytes, s.strs = s.globals[:p.globals], s.calls[:p.calls], s.bytes[:p.bytes], s.strs[:p.strs]
	s.r.StrsTruncated = p.strsTruncated
	s.proto, s.r.Truncated, s.r.Ext, s.r.Persistent = p.proto, p.truncated, p.ext, p.persistent
	s.r.UnknownCalls = p.unknownCalls
	s.r.Complete = false
	s.r.Err = &Error{Kind: ErrMalformed, Op: opFRAME, Offset: p.at, Reason: faultText[fTruncated]}
	s.r.RanOut = true
	s.src.rewindTo(p.at + 9)
}

func (s *scanner) ops() bool {
	if s.lim.MaxOps <= 0 {
		return true
	}
	s.lim.MaxOps--
	return false
}

func (s *scanner) stop(op byte, at int, f fault) {
	if f == fShortFrame {
		s.rollback()
		s.finish()
		return
	}
	kind := ErrMalformed
	if f.limit() {
		kind = ErrLimit
	}
	s.r.Err = &Error{Kind: kind, Op: op, Offset: at, Reason: faultText[f]}
	s.r.RanOut = f == fEOF || f == fTruncated
	s.settleFrame()
	s.finish()
}

func (s *scanner) finish() {
	s.r.End = s.src.off()
	s.r.Protocol = s.proto
	if len(s.globals) > 0 {
		s.r.Globals = append([]Global(nil), s.globals...)
	}
	if len(s.calls) > 0 {
		s.r.Calls = append([]Call(nil), s.calls...)
	}
	if len(s.bytes) > 0 {
		s.r.Bytes = append([]Span(nil), s.bytes...)
	}
	if len(s.strs) > 0 && s.encodes() {
		s.r.Strs = append([]Span(nil), s.strs...)
	}
}

// step runs one opcode (not STOP) whose byte was read at offset at.
func (s *scanner) step(op byte, at int) fault {
	switch op {
	case opMARK:
		if len(s.stack)+len(s.marks) >= s.lim.MaxStack {
			return fLimitStack
		}
		s.marks = append(s.marks, len(s.stack))
		return 0

	case opPOP:
		if len(s.marks) > 0 && s.marks[len(s.marks)-1] == len(s.stack) {
			s.marks = s.marks[:len(s.marks)-1]
			return 0
		}
		_, f := s.pop()
		return f

	case opPOP_MARK:
		i, f := s.marker()
		if f == 0 {
			s.stack = s.stack[:i]
		}
		return f

	case opDUP:
		if len(s.stack) <= s.fence() {
			return fUnderflow
		}
		return s.push(s.stack[len(s.stack)-1])

	case opNONE, opNEWTRUE, opNEWFALSE:
		return s.push(val{k: kScalar})

	case opBININT1:
		return s.fixedThen(1, val{k: kScalar})
	case opBININT2:
		return s.fixedThen(2, val{k: kScalar})
	case opBININT:
		return s.fixedThen(4, val{k: kScalar})
	case opBINFLOAT:
		return s.fixedThen(8, val{k: kScalar})

	case opINT, opLONG, opFLOAT:
		return s.numberLine(op)

	case opLONG1, opLONG4:
		n := 1
		if op == opLONG4 {
			n = 4
		}
		p, ok := s.src.read(n)
		if !ok {
			return fTruncated
		}
		size := int64(p[0])
		if n == 4 {
			size = int64(int32(binary.LittleEndian.Uint32(p)))
			if size < 0 {
				return fNegativeLong
			}
		}
		if !s.src.skip(uint64(size)) {
			return fTruncated
		}
		return s.push(val{k: kScalar})

	case opSHORT_BINBYTES, opBINBYTES, opBINBYTES8, opBYTEARRAY8:
		k := kBytes
		if op == opBYTEARRAY8 {
			k = kByteArray
		}
		size, f := s.size(op)
		if f != 0 {
			return f
		}
		start := s.src.off()
		if !s.src.skip(size) {
			return fTruncated
		}
		if len(s.bytes) < s.lim.MaxGlobals {
			s.bytes = append(s.bytes, Span{Off: start, Len: int(size)})
		} else {
			s.r.BytesTruncated = true
		}
		return s.push(val{k: k})

	case opSHORT_BINSTRING, opBINSTRING, opSHORT_BINUNICODE, opBINUNICODE, opBINUNICODE8:
		size, f := s.size(op)
		if f != 0 {
			return f
		}
		start := s.src.off()
		utf8 := op == opSHORT_BINUNICODE || op == opBINUNICODE || op == opBINUNICODE8
		v, f := s.strPayload(size, utf8)
		if f != 0 {
			return f
		}
		if utf8 {
			s.addStr(Span{Off: start, Len: int(size), Text: TextUTF8})
		}
		return s.push(v)

	case opSTRING, opUNICODE:
		start := s.src.off()
		v, f := s.strLine(op)
		if f != 0 {
			return f
		}
		if op == opUNICODE {
			s.addStr(Span{Off: start, Len: s.src.off() - 1 - start, Text: TextRawUnicodeEscape})
		}
		return s.push(v)

	case opEMPTY_TUPLE:
		return s.push(val{k: kTuple, hash: hashYes})
	case opTUPLE1, opTUPLE2, opTUPLE3:
		n := int(op-opTUPLE1) + 1
		start := len(s.stack) - n
		if start < s.fence() {
			return fUnderflow
		}
		return s.collapse(start, kTuple)
	case opTUPLE, opLIST, opDICT, opFROZENSET:
		i, f := s.marker()
		if f != 0 {
			return f
		}
		k := kTuple
		switch op {
		case opLIST:
			k = kList
		case opDICT:
			k = kDict
		case opFROZENSET:
			k = kFrozenSet
		}
		return s.collapse(i, k)
	case opEMPTY_LIST:
		return s.push(val{k: kList})
	case opEMPTY_DICT:
		return s.push(val{k: kDict})
	case opEMPTY_SET:
		return s.push(val{k: kSet})

	case opAPPEND:
		if len(s.stack)-1 <= s.fence() {
			return fUnderflow
		}
		return s.appends("APPEND", len(s.stack)-1, at)
	case opAPPENDS:
		i, f := s.marker()
		if f != 0 {
			return f
		}
		return s.appends("APPENDS", i, at)
	case opSETITEM:
		return s.setitems("SETITEM", len(s.stack)-2, at)
	case opSETITEMS:
		i, f := s.marker()
		if f != 0 {
			return f
		}
		return s.setitems("SETITEMS", i, at)
	case opADDITEMS:
		i, f := s.marker()
		if f != 0 {
			return f
		}
		return s.additems(i, at)

	case opGLOBAL:
		return s.globalLines("GLOBAL", at)
	case opINST:
		i, f := s.marker()
		if f != 0 {
			return f
		}
		if f := s.globalLines("INST", at); f != 0 {
			return f
		}
		g, _ := s.pop()
		s.stack = s.stack[:i]
		s.addCall("INST", g.x, at)
		return s.push(val{k: kAny, x: g.x})
	case opSTACK_GLOBAL:
		return s.stackGlobal(at)

	case opREDUCE:
		args, f := s.pop()
		if f != 0 {
			return f
		}
		fn, f := s.pop()
		if f != 0 {
			return f
		}
		if args.k.literal() && args.k != kTuple {
			return fArgsNotTuple
		}
		if fn.k.literal() {
			return fNotCallable
		}
		s.addCall("REDUCE", fn.callee(), at)
		return s.push(val{k: kAny, x: fn.callee()})
	case opNEWOBJ, opNEWOBJ_EX:
		name := "NEWOBJ"
		var kwargs val
		if op == opNEWOBJ_EX {
			name = "NEWOBJ_EX"
			var f fault
			if kwargs, f = s.pop(); f != 0 {
				return f
			}
		}
		args, f := s.pop()
		if f != 0 {
			return f
		}
		cls, f := s.pop()
		if f != 0 {
			return f
		}
		if cls.k.literal() {
			return fNotType
		}
		if args.k.literal() && args.k != kTuple {
			return fArgsNotTuple
		}
		if op == opNEWOBJ_EX && kwargs.k.literal() && kwargs.k != kDict {
			return fKwargsNotDict
		}
		s.addCall(name, cls.callee(), at)
		return s.push(val{k: kAny, x: cls.callee()})
	case opOBJ:
		i, f := s.marker()
		if f != 0 {
			return f
		}
		if len(s.stack)-i < 1 {
			return fUnderflow
		}
		cls := s.stack[i]
		s.stack = s.stack[:i]
		if cls.k.literal() {
			return fNotCallable
		}
		s.addCall("OBJ", cls.callee(), at)
		return s.push(val{k: kAny, x: cls.callee()})
	case opBUILD:
		if len(s.stack)-2 < s.fence() {
			return fUnderflow
		}
		s.stack = s.stack[:len(s.stack)-1]
		s.addCall("BUILD", s.stack[len(s.stack)-1].maker(), at)
		return 0

	case opPUT:
		key, known, f := s.memoKey()
		if f != 0 {
			return f
		}
		if len(s.stack) <= s.fence() {
			return fUnderflow
		}
		if key.neg {
			return fNegativePut
		}
		if !known {
			s.memoLost = true // a key too long to read: any entry may have changed
			return 0
		}
		s.memoPut(key.v, s.stack[len(s.stack)-1])
		return 0
	case opBINPUT, opLONG_BINPUT:
		key, f := s.memoIndex(op == opLONG_BINPUT)
		if f != 0 {
			return f
		}
		if len(s.stack) <= s.fence() {
			return fUnderflow
		}
		s.memoPut(key, s.stack[len(s.stack)-1])
		return 0
	case opMEMOIZE:
		if len(s.stack) <= s.fence() {
			return fUnderflow
		}
		s.memoPut(uint64(s.memoLen), s.stack[len(s.stack)-1])
		return 0

	case opGET:
		key, known, f := s.memoKey()
		if f != 0 {
			return f
		}
		if !known {
			return s.push(val{k: kAny, x: -1})
		}
		if key.neg {
			return fMemoMissing
		}
		return s.get(key.v)
	case opBINGET, opLONG_BINGET:
		key, f := s.memoIndex(op == opLONG_BINGET)
		if f != 0 {
			return f
		}
		return s.get(key)

	case opPERSID:
		s.persistentAt(at)
		s.nameL = nameLine{ascii: true}
		if _, f := s.readLine(sinkName); f != 0 {
			return f
		}
		if !s.nameL.ok() {
			return fPersidASCII
		}
		return s.push(val{k: kAny, x: -1})
	case opBINPERSID:
		s.persistentAt(at)
		if _, f := s.pop(); f != 0 {
			return f
		}
		return s.push(val{k: kAny, x: -1})

	case opEXT1, opEXT2, opEXT4:
		n := [...]int{1, 2, 4}[op-opEXT1]
		p, ok := s.src.read(n)
		if !ok {
			return fTruncated
		}
		code := int64(leUint(p))
		if n == 4 {
			code = int64(int32(code))
		}
		if code <= 0 {
			return fExtCode
		}
		if !s.r.Ext {
			s.r.Ext, s.r.ExtOffset = true, at
		}
		return s.push(val{k: kGlobal, x: -1})

	case opPROTO:
		p, ok := s.src.read(1)
		if !ok {
			return fTruncated
		}
		if p[0] > highestProtocol {
			return fProtocol
		}
		s.proto = int(p[0])
		return 0
	case opFRAME:
		size, f := s.size(op)
		if f != 0 {
			return f
		}
		// The C unpickler only checks that the frame is there; it does not hold opcodes to it.
		return s.frame(at, size)

	case opNEXT_BUFFER:
		return fNoBuffers
	case opREADONLY_BUFFER:
		if len(s.stack) <= s.fence() {
			return fUnderflow
		}
		top := &s.stack[len(s.stack)-1]
		switch top.k {
		case kByteArray:
			top.k = kView
		case kBytes, kView, kAny, kGlobal:
		default:
			return fNotBuffer
		}
		return 0
	}
	return fUnknownOp
}

func leUint(p []byte) uint64 {
	var v uint64
	for i, c := range p {
		v |= uint64(c) << (8 * i)
	}
	return v
}

// fixedThen reads an n-byte argument and pushes v.
func (s *scanner) fixedThen(n int, v val) fault {
	if _, ok := s.src.read(n); !ok {
		return fTruncated
	}
	return s.push(v)
}

// size reads a counted opcode's length argument (calc_binsize: unsigned, at most PY_SSIZE_T_MAX).
func (s *scanner) size(op byte) (uint64, fault) {
	n := 4
	switch op {
	case opSHORT_BINBYTES, opSHORT_BINSTRING, opSHORT_BINUNICODE:
		n = 1
	case opBINBYTES8, opBINUNICODE8, opBYTEARRAY8, opFRAME:
		n = 8
	}
	p, ok := s.src.read(n)
	if !ok {
		return 0, fTruncated
	}
	v := leUint(p)
	if v > math.MaxInt64 {
		return 0, fSize
	}
	return v, 0
}

// memoIndex reads the memo key of BINPUT/BINGET (one byte) or LONG_BINPUT/LONG_BINGET (four).
func (s *scanner) memoIndex(long bool) (uint64, fault) {
	n := 1
	if long {
		n = 4
	}
	p, ok := s.src.read(n)
	if !ok {
		return 0, fTruncated
	}
	return leUint(p), 0
}

// strPayload reads a counted str argument: UTF-8 with surrogatepass (the BINUNICODE opcodes) or
// ASCII (BINSTRING: Python 2 str under encoding="ASCII").
func (s *scanner) strPayload(size uint64, utf8 bool) (val, fault) {
	start := s.src.off()
	keep := size <= MaxStrLen
	var u utf8Check
	nonASCII := false
	s.out.n = 0
	for rem := size; rem > 0; {
		p := s.src.chunk(int(min(rem, 1<<30)))
		if p == nil {
			return val{}, fTruncated
		}
		rem -= uint64(len(p))
		if utf8 {
			u.feed(p, true)
		} else if !nonASCII && !isASCII(p) {
			nonASCII = true
		}
		if keep && s.src.enc == Base64 {
			for _, c := range p {
				s.out.byte(c)
			}
		}
	}
	if (utf8 && !u.ok()) || nonASCII {
		return val{}, fStrDecode
	}
	if !keep {
		return val{k: kStr, n: int32(min(size, math.MaxInt32))}, 0
	}
	if s.src.cleanUpTo(start + int(size)) {
		return val{k: kStr, ref: refInput, n: int32(size), x: start}, 0
	}
	return s.keepArena(s.out.kept()), 0
}

// What readLine feeds a text argument to, piece by piece.
const (
	sinkNone    = iota
	sinkName    // s.nameL
	sinkString  // s.strL
	sinkUnicode // s.uniL
)

// readLine reads a text argument up to '\n', feeding it to sink; it returns the length of the
// line without the '\n' and leaves its first lineMax bytes in s.line.
func (s *scanner) readLine(sink uint8) (int, fault) {
	n := 0
	for {
		if s.src.i >= len(s.src.win) && !s.src.refill() {
			return n, fTruncated
		}
		w := s.src.win[s.src.i:]
		j := 0
		for j < len(w) && w[j] != '\n' {
			j++
		}
		p := w[:j]
		if n < lineMax {
			copy(s.line[n:], p)
		}
		switch sink {
		case sinkName:
			s.nameL.feed(p)
		case sinkString:
			s.strL.feed(p)
		case sinkUnicode:
			s.uniL.feed(p)
		}
		n += len(p)
		if j < len(w) {
			s.src.i += j + 1
			return n, 0
		}
		s.src.i += j
	}
}

// numberLine reads the argument of INT, LONG or FLOAT.
func (s *scanner) numberLine(op byte) fault {
	n, f := s.readLine(sinkNone)
	if f != 0 {
		return f
	}
	if n == 0 {
		return fTruncated // the C code calls a line of just '\n' fTruncated input
	}
	if n <= lineMax {
		line := s.line[:n]
		var ok bool
		switch op {
		case opINT:
			ok = intLineOK(line)
		case opLONG:
			ok = longLineOK(line)
		default:
			ok = floatLineOK(line)
		}
		if !ok {
			return fNumber
		}
	}
	return s.push(val{k: kScalar})
}

type memoKeyValue struct {
	v   uint64
	neg bool
}

// memoKey reads the text argument of GET or PUT; known is false for one too long to read.
func (s *scanner) memoKey() (memoKeyValue, bool, fault) {
	n, f := s.readLine(sinkNone)
	if f != 0 {
		return memoKeyValue{}, false, f
	}
	if n == 0 {
		return memoKeyValue{}, false, fTruncated
	}
	if n > lineMax {
		return memoKeyValue{}, false, 0
	}
	v, neg, ok := memoKeyLine(s.line[:n])
	if !ok {
		return memoKeyValue{}, false, fMemoKey
	}
	return memoKeyValue{v: v, neg: neg}, true, 0
}

func (s *scanner) get(key uint64) fault {
	v, ok := s.memoGet(key)
	if !ok {
		return fMemoMissing
	}
	return s.push(v)
}

// stringLine decodes the STRING argument: quoted, backslash escapes, then ASCII.
type stringLine struct {
	s       *scanner
	n       int
	quote   byte
	pending byte
	dec     escapeDecoder
}

func (l *stringLine) feed(p []byte) {
	for _, c := range p {
		switch {
		case l.n == 0:
			l.quote = c
		case l.n >= 2:
			l.dec.feed(&l.s.out, l.pending)
		}
		if l.n >= 1 {
			l.pending = c
		}
		l.n++
	}
}

type unicodeLine struct {
	s   *scanner
	dec rawUnicodeDecoder
}

func (l *unicodeLine) feed(p []byte) {
	for _, c := range p {
		l.dec.feed(&l.s.out, c)
	}
}

// strLine reads the argument of STRING or UNICODE.
func (s *scanner) strLine(op byte) (val, fault) {
	s.out.n = 0
	if op == opUNICODE {
		s.uniL = unicodeLine{s: s}
		if _, f := s.readLine(sinkUnicode); f != 0 {
			return val{}, f
		}
		if !s.uniL.dec.end(&s.out) {
			return val{}, fUnicodeDecode
		}
		return s.keptOut(), 0
	}
	s.strL = stringLine{s: s}
	l := &s.strL
	if _, f := s.readLine(sinkString); f != 0 {
		return val{}, f
	}
	if l.n < 2 || l.pending != l.quote || (l.quote != '\'' && l.quote != '"') {
		return val{}, fStringQuote
	}
	if !l.dec.end(&s.out) || l.dec.nonASCII {
		return val{}, fStringDecode
	}
	return s.keptOut(), 0
}

func (s *scanner) keptOut() val {
	if p := s.out.kept(); p != nil {
		return s.keepArena(p)
	}
	return val{k: kStr, n: int32(min(s.out.n, math.MaxInt32))}
}

// nameLine checks a GLOBAL or INST line: UTF-8 (GLOBAL) or ASCII (INST), strict.
type nameLine struct {
	ascii bool
	u     utf8Check
	bad   bool
}

func (l *nameLine) feed(p []byte) {
	if l.ascii {
		l.bad = l.bad || !isASCII(p)
	} else {
		l.u.feed(p, false)
	}
}

func (l *nameLine) ok() bool {
	if l.ascii {
		return !l.bad
	}
	return l.u.ok()
}

// nameLineOf reads the module or the name line of GLOBAL or INST (INST's are ASCII) into s.line.
func (s *scanner) nameLineOf(op string) (int, fault) {
	s.nameL = nameLine{ascii: op == "INST"}
	n, f := s.readLine(sinkName)
	switch {
	case f != 0:
		return 0, f
	case n == 0:
		return 0, fTruncated
	case !s.nameL.ok():
		return 0, fNameDecode
	}
	return n, 0
}

// globalLines reads the module and name lines of GLOBAL or INST, records the find_class call and
// pushes its result.
func (s *scanner) globalLines(op string, at int) fault {
	var module [MaxStrLen]byte
	mn, f := s.nameLineOf(op)
	if f != 0 {
		return f
	}
	copy(module[:], s.line[:min(mn, MaxStrLen)])
	nn, f := s.nameLineOf(op)
	if f != 0 {
		return f
	}
	resolved := mn <= MaxStrLen && nn <= MaxStrLen
	var name []byte
	if resolved {
		name = s.line[:nn]
	}
	idx := s.global(op, at, module[:min(mn, MaxStrLen)], name, resolved)
	return s.push(val{k: kGlobal, x: idx})
}

func (s *scanner) stackGlobal(at int) fault {
	name, f := s.pop()
	if f != 0 {
		return f
	}
	module, f := s.pop()
	if f != 0 {
		return f
	}
	if (module.k.literal() && module.k != kStr) || (name.k.literal() && name.k != kStr) {
		return fStackGlobalStr
	}
	idx := -1
	if len(s.globals) >= s.lim.MaxGlobals {
		s.r.Truncated = true
	} else {
		var m [MaxStrLen]byte
		mb, ok1 := s.strBytes(module)
		mn := copy(m[:], mb)
		nb, ok2 := s.strBytes(name)
		resolved := module.k == kStr && name.k == kStr && ok1 && ok2
		idx = s.global("STACK_GLOBAL", at, m[:mn], nb, resolved)
	}
	return s.push(val{k: kGlobal, x: idx})
}

// collapse replaces the stack items from start on by one container of kind k, raising where
// Python raises on literal items: odd DICT items, unhashable DICT keys or FROZENSET items.
func (s *scanner) collapse(start int, k kind) fault {
	items := s.stack[start:]
	v := val{k: k}
	switch k {
	case kTuple:
		v.hash = hashYes
		for _, it := range items {
			if h := it.hashable(); h == hashNo || (h == hashMaybe && v.hash == hashYes) {
				v.hash = h
			}
		}
	case kDict:
		if len(items)%2 != 0 {
			return fDictOdd
		}
		for i := 0; i < len(items); i += 2 {
			if items[i].hashable() == hashNo {
				return fUnhashable
			}
		}
	case kFrozenSet:
		for _, it := range items {
			if it.hashable() == hashNo {
				return fUnhashable
			}
		}
	}
	s.stack = s.stack[:start]
	return s.push(v)
}

// appends is do_append: items from x on go to the list below them.
func (s *scanner) appends(op string, x, at int) fault {
	if x > len(s.stack) || x <= s.fence() {
		return fUnderflow
	}
	if x == len(s.stack) {
		return 0
	}
	target := s.stack[x-1]
	switch target.k {
	case kList, kByteArray:
	case kAny, kGlobal:
		s.addCall(op, target.maker(), at)
	default:
		return fNoExtend
	}
	s.stack = s.stack[:x]
	return 0
}

// setitems is do_setitems: key, value pairs from x on go into the mapping below them.
func (s *scanner) setitems(op string, x, at int) fault {
	if x > len(s.stack) || x <= s.fence() {
		return fUnderflow
	}
	if x == len(s.stack) {
		return 0
	}
	if (len(s.stack)-x)%2 != 0 {
		return fSetitemsOdd
	}
	target := s.stack[x-1]
	switch target.k {
	case kDict:
		for i := x; i < len(s.stack); i += 2 {
			if s.stack[i].hashable() == hashNo {
				return fUnhashable
			}
		}
	case kList, kByteArray:
	case kAny, kGlobal:
		s.addCall(op, target.maker(), at)
	default:
		return fNoSetitem
	}
	s.stack = s.stack[:x]
	return 0
}

// additems is load_additems: items from x on go into the set below them.
func (s *scanner) additems(x, at int) fault {
	if x > len(s.stack) || x <= s.fence() {
		return fUnderflow
	}
	if x == len(s.stack) {
		return 0
	}
	target := s.stack[x-1]
	switch target.k {
	case kSet:
		for _, it := range s.stack[x:] {
			if it.hashable() == hashNo {
				return fUnhashable
			}
		}
	case kAny, kGlobal:
		s.addCall("ADDITEMS", target.maker(), at)
	default:
		return fNoAdd
	}
	s.stack = s.stack[:x]
	return 0
}
