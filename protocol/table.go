package protocol

// ValidateMagic is the u32 a G2+ client sends after opcode 0 as its first message.
const ValidateMagic uint32 = 0x3C85F7CE

// FieldKind names a field of a message.
type FieldKind uint8

const (
	FieldNone FieldKind = iota
	FieldKey
	FieldValue
	FieldExpected
	FieldDesired
	FieldCount
	FieldDelta
	FieldWorldSize
	FieldMagic
	FieldNonce
)

var fieldNames = [...]string{"", "key", "value", "expected", "desired", "count", "delta", "world_size", "magic", "nonce"}

func (k FieldKind) String() string {
	if int(k) < len(fieldNames) {
		return fieldNames[k]
	}
	return "field"
}

// width is the size of the fixed part of a field: the 8-byte length in front of a key or value,
// the 8-byte integer, the 4-byte magic or nonce.
func (k FieldKind) width() uint64 {
	if k == FieldMagic || k == FieldNonce {
		return 4
	}
	return 8
}

// hasBody reports whether the fixed part is a length followed by that many bytes.
func (k FieldKind) hasBody() bool {
	return k == FieldKey || k == FieldValue || k == FieldExpected || k == FieldDesired
}

// layout is the field sequence of a request: head once, then loop repeated FieldCount times.
type layout struct {
	head []FieldKind
	loop []FieldKind
	// minLoop is the fewest bytes one loop iteration can take (its length fields).
	minLoop uint64
}

var (
	layNone       = &layout{}
	layU32Magic   = &layout{head: []FieldKind{FieldMagic}}
	layU32Nonce   = &layout{head: []FieldKind{FieldNonce}}
	layKey        = &layout{head: []FieldKind{FieldKey}}
	layKeyValue   = &layout{head: []FieldKind{FieldKey, FieldValue}}
	layCompareSet = &layout{head: []FieldKind{FieldKey, FieldExpected, FieldDesired}}
	layKeyDelta   = &layout{head: []FieldKind{FieldKey, FieldDelta}}
	layKeyWorld   = &layout{head: []FieldKind{FieldKey, FieldWorldSize}}
	layKeyList    = &layout{head: []FieldKind{FieldCount}, loop: []FieldKind{FieldKey}, minLoop: 8}
	layPairList   = &layout{head: []FieldKind{FieldCount}, loop: []FieldKind{FieldKey, FieldValue}, minLoop: 16}
)

var opLayouts = [numOps]*layout{
	OpValidate:   layU32Magic,
	OpSet:        layKeyValue,
	OpCompareSet: layCompareSet,
	OpGet:        layKey,
	OpAdd:        layKeyDelta,
	OpCheck:      layKeyList,
	OpWait:       layKeyList,
	OpGetNumKeys: layNone,
	OpWatchKey:   layKey,
	OpDeleteKey:  layKey,
	OpAppend:     layKeyValue,
	OpMultiGet:   layKeyList,
	OpMultiSet:   layPairList,
	OpCancelWait: layNone,
	OpPing:       layU32Nonce,
	OpQueuePush:  layKeyValue,
	OpQueuePop:   layKey,
	OpQueueLen:   layKey,
	OpListKeys:   layNone,
	OpBarrier:    layKeyWorld,
}

// libuvOnly marks the operations the legacy backend does not implement.
var libuvOnly = [numOps]bool{OpQueuePush: true, OpQueuePop: true, OpQueueLen: true}

// InBackend reports whether backend b implements op.
func (o Op) InBackend(b Backend) bool { return b != BackendLegacy || !libuvOnly[o] }

// opcodes lists each generation's operations in wire order: opcodes[g][wire] is the op.
var opcodes = func() [numGenerations][]Op {
	g0 := []Op{OpSet, OpCompareSet, OpGet, OpAdd, OpCheck, OpWait, OpGetNumKeys, OpWatchKey, OpDeleteKey}
	g1 := []Op{OpSet, OpCompareSet, OpGet, OpAdd, OpCheck, OpWait, OpGetNumKeys, OpDeleteKey, OpAppend,
		OpMultiGet, OpMultiSet, OpCancelWait}
	g2 := append([]Op{OpValidate}, g1...)
	g3 := append(append([]Op{}, g2...), OpPing)
	g4 := append(append([]Op{}, g3...), OpQueuePush, OpQueuePop, OpQueueLen)
	g5 := append(append([]Op{}, g4...), OpListKeys)
	g6 := append(append([]Op{}, g5...), OpBarrier)
	return [numGenerations][]Op{g0, g1, g2, g3, g4, g5, g6}
}()

// opTables is opcodes as 256-entry lookup tables, OpInvalid where a byte is no opcode.
var opTables = func() (t [numGenerations][256]Op) {
	for g, ops := range opcodes {
		for wire, op := range ops {
			t[g][wire] = op
		}
	}
	return t
}()

// OpOf returns the operation a wire byte means in generation g, or OpInvalid.
func OpOf(g Generation, wire byte) Op { return opTables[g][wire] }

// WireOf returns the wire byte of op in generation g; ok is false when g lacks op.
func WireOf(g Generation, op Op) (wire byte, ok bool) {
	for w, o := range opcodes[g] {
		if o == op {
			return byte(w), true
		}
	}
	return 0, false
}

// firstGeneration is the oldest generation that has each op, for narrowing auto detection.
var firstGeneration = func() (t [numOps]Generation) {
	for op := range t {
		t[op] = numGenerations
	}
	for g := LatestGeneration; ; g-- {
		for _, op := range opcodes[g] {
			t[op] = g
		}
		if g == G0 {
			return t
		}
	}
}()
