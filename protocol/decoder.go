package protocol

import (
	"encoding/binary"
	"math/bits"
)

// Config selects what a Decoder accepts.
type Config struct {
	Gen GenSetting
	// LegacyGen is how an Auto decoder reads a stream that does not start with VALIDATE: G0 or
	// G1. Their opcodes 0x07 and 0x08 mean different things and nothing in a G0/G1 stream says which
	// it is. serve never uses it: it decodes with the store's own generation, learned from the
	// store (storeinfo.Learn). replay, which has no store to ask, does.
	LegacyGen Generation
	Backend   Backend
	Limits    Limits
}

// MaxRecordedFields is how many fields of a message are recorded with their positions; a list op's
// further keys are checked and counted but not recorded, so decoding allocates nothing.
const MaxRecordedFields = 8

// Field is one field of a message. Off is relative to the message's opcode byte and points at the
// field's fixed part (length, integer, magic or nonce); a key or value body follows it.
type Field struct {
	Kind FieldKind
	Off  uint64
	Len  uint64 // body length of a key or value
	Int  uint64 // value of a count, delta, world size, magic or nonce
}

// BodyOff is the offset of a key's or value's bytes, relative to the message's opcode byte.
func (f Field) BodyOff() uint64 { return f.Off + 8 }

// Message describes one complete request.
type Message struct {
	Op         Op
	Wire       byte
	Generation Generation
	Index      uint64 // index in the stream, 0-based
	Offset     uint64 // stream offset of the opcode byte
	Len        uint64 // bytes, opcode included
	Count      uint64 // keys or pairs of a list op
	NFields    int    // every field, recorded or not
	Fields     [MaxRecordedFields]Field
}

// Recorded returns the fields recorded with their positions (at most MaxRecordedFields).
func (m *Message) Recorded() []Field { return m.Fields[:min(m.NFields, MaxRecordedFields)] }

// Body returns the bytes of a key or value field, given the message's bytes.
func (m *Message) Body(f Field, msg []byte) []byte {
	return msg[f.BodyOff() : f.BodyOff()+f.Len]
}

// Decoder decodes one client-to-server stream. It holds no copy of the stream: the caller keeps the
// bytes of the message in progress, which never exceed Limits.MaxMessageBytes.
type Decoder struct {
	cfg       Config
	gen       Generation // generation in use; for Auto, known once resolved
	minGen    Generation // the oldest generation consistent with what the stream sent
	resolved  bool
	detecting bool // Auto: first byte was 0x00, reading the magic
	validated bool
	table     *[256]Op

	off   uint64 // stream offset of the next byte
	index uint64 // index of the next (or current) message
	err   *Violation

	inMsg    bool
	msg      Message
	lay      *layout
	inLoop   bool
	pc       int
	loopLeft uint64
	kind     FieldKind
	fieldOff uint64 // stream offset of the current field
	acc      uint64 // the current fixed part, little-endian, accN bytes so far
	accN     uint64
	body     uint64 // body bytes still to come
}

// NewDecoder returns a decoder at the start of a stream.
func NewDecoder(cfg Config) *Decoder {
	d := &Decoder{}
	d.Reset(cfg)
	return d
}

// Reset readies d for a new stream, keeping nothing of the old one.
func (d *Decoder) Reset(cfg Config) {
	*d = Decoder{cfg: cfg}
	if !cfg.Gen.Auto {
		d.resolve(cfg.Gen.Gen)
	}
}

func (d *Decoder) resolve(g Generation) {
	d.gen, d.minGen, d.resolved = g, g, true
	d.table = &opTables[g]
}

// Generation is the generation the stream is decoded as; for Auto, the oldest one consistent with
// what it has sent so far. ok is false while Auto has not seen enough to tell.
func (d *Decoder) Generation() (g Generation, ok bool) { return d.minGen, d.resolved }

// Limits are the ceilings d enforces.
func (d *Decoder) Limits() Limits { return d.cfg.Limits }

// Offset is the number of bytes consumed.
func (d *Decoder) Offset() uint64 { return d.off }

// Messages is the number of complete messages.
func (d *Decoder) Messages() uint64 { return d.index }

// InMessage reports whether a message has started and not completed.
func (d *Decoder) InMessage() bool { return d.inMsg || d.detecting }

// PartialBytes is how many bytes of the message in progress have been consumed.
func (d *Decoder) PartialBytes() uint64 {
	if !d.InMessage() {
		return 0
	}
	return d.off - d.msg.Offset
}

// BodyLeft is how many bytes of the key or value being read are still to come (its length was
// checked against the limits when it arrived); 0 between fields and messages.
func (d *Decoder) BodyLeft() uint64 {
	if !d.inMsg {
		return 0
	}
	return d.body
}

// Err returns the violation that stopped the stream, or nil.
func (d *Decoder) Err() *Violation { return d.err }

// Scan consumes p, the next bytes of the stream, up to and including the end of the first
// message that completes in it. It returns how many bytes it consumed and that message, which
// stays valid until the next call; msg is nil when p ended inside a message. On a violation it
// returns the *Violation, whose offsets say where; the decoder then stays stopped and returns the
// same violation.
func (d *Decoder) Scan(p []byte) (n int, msg *Message, err error) {
	if d.err != nil {
		return 0, nil, d.err
	}
	i := 0
	for i < len(p) {
		switch {
		case d.body > 0:
			k := min(uint64(len(p)-i), d.body)
			d.body -= k
			i += int(k)
			d.off += k
			if d.body == 0 && d.next() {
				return i, &d.msg, nil
			}
		case d.detecting:
			if d.detect(p[i]) {
				return i + 1, &d.msg, nil
			}
			i++
		case !d.inMsg:
			if v := d.begin(p[i]); v != nil {
				return i + 1, nil, d.fail(v)
			}
			i++
			if !d.inMsg && !d.detecting {
				return i, &d.msg, nil
			}
		default:
			w := d.kind.width()
			var v uint64
			if d.accN == 0 && uint64(len(p)-i) >= w {
				if w == 8 {
					v = binary.LittleEndian.Uint64(p[i:])
				} else {
					v = uint64(binary.LittleEndian.Uint32(p[i:]))
				}
				if uint32(v) == ValidateMagic && d.handshakeToLegacy() {
					d.off += 4
					return i + 4, nil, d.fail(d.validateToLegacy())
				}
				i += int(w)
				d.off += w
			} else {
				b := p[i]
				d.acc |= uint64(b) << (8 * d.accN)
				d.accN++
				i++
				d.off++
				if d.kind == FieldMagic && b != byte(ValidateMagic>>(8*(d.accN-1))) {
					// A wrong magic is known at its first wrong byte: no need to wait for the rest.
					return i, nil, d.fail(d.violation(RuleValidateBadMagic, FieldMagic, d.acc, uint64(ValidateMagic)))
				}
				if d.accN == 4 && uint32(d.acc) == ValidateMagic && d.handshakeToLegacy() {
					return i, nil, d.fail(d.validateToLegacy())
				}
				if d.accN < w {
					continue
				}
				v, d.acc, d.accN = d.acc, 0, 0
			}
			if viol := d.field(v); viol != nil {
				return i, nil, d.fail(viol)
			}
			if d.body == 0 && d.next() {
				return i, &d.msg, nil
			}
		}
	}
	return i, nil, nil
}

// begin starts a message at opcode byte b.
func (d *Decoder) begin(b byte) *Violation {
	d.msg.Op, d.msg.Wire, d.msg.Index, d.msg.Offset = OpInvalid, b, d.index, d.off
	d.msg.Count, d.msg.NFields = 0, 0
	d.inLoop, d.pc, d.loopLeft = false, 0, 0
	if !d.resolved {
		if b == 0 {
			// VALIDATE, or a G0/G1 SET: the next four bytes tell.
			d.detecting = true
			d.off++
			return nil
		}
		d.resolve(d.cfg.LegacyGen)
	}
	op := d.table[b]
	d.msg.Op = op
	if v := d.admit(op); v != nil {
		return v
	}
	d.msg.Generation = d.minGen
	d.off++
	d.start(op)
	return nil
}

// admit applies the opcode-level rules.
func (d *Decoder) admit(op Op) *Violation {
	switch {
	case d.gen.Validated() && !d.validated && op != OpValidate:
		if op == OpPing {
			return d.violation(RulePingBeforeValidate, FieldNone, 0, 0)
		}
		return d.violation(RuleValidateMissing, FieldNone, 0, 0)
	case op == OpValidate && d.validated:
		return d.violation(RuleValidateRepeated, FieldNone, 0, 0)
	case op == OpInvalid:
		return d.violation(RuleUnknownOpcode, FieldNone, 0, 0)
	case !op.InBackend(d.cfg.Backend):
		return d.violation(RuleOpNotInBackend, FieldNone, 0, 0)
	case op == OpWatchKey && d.cfg.Limits.BlockWatchKey:
		return d.violation(RuleWatchKeyBlocked, FieldNone, 0, 0)
	}
	if d.cfg.Gen.Auto && d.minGen >= G2 {
		d.minGen = max(d.minGen, firstGeneration[op])
	}
	return nil
}

// start sets up the field sequence of op; a message with no fields completes at once.
func (d *Decoder) start(op Op) {
	d.lay = opLayouts[op]
	if len(d.lay.head) == 0 {
		d.finish()
		return
	}
	d.inMsg = true
	d.kind, d.fieldOff = d.lay.head[0], d.off
}

// detect reads one byte of an Auto stream that began with 0x00; it reports whether that byte
// completed a VALIDATE.
func (d *Decoder) detect(b byte) bool {
	k := d.off - 1 // magic bytes read so far
	d.off++
	d.acc |= uint64(b) << (8 * k)
	if b == byte(ValidateMagic>>(8*k)) {
		if k < 3 {
			return false
		}
		d.detecting = false
		d.resolve(LatestGeneration)
		d.minGen = G2
		d.msg.Op, d.msg.Generation = OpValidate, G2
		d.msg.Fields[0] = Field{Kind: FieldMagic, Off: 1, Int: d.acc}
		d.msg.NFields = 1
		d.acc = 0
		d.finish()
		return true
	}
	// Not the magic: a G0/G1 SET whose key length has begun.
	d.detecting = false
	d.resolve(d.cfg.LegacyGen)
	d.msg.Op, d.msg.Generation = d.table[0], d.gen
	d.start(d.msg.Op)
	d.accN = k + 1
	d.fieldOff = 1
	return false
}

// handshakeToLegacy reports whether the field being read is the key length of a G0/G1 stream's
// first message, a SET: where a torch 2.2+ client's VALIDATE magic lands in a G0/G1 store.
func (d *Decoder) handshakeToLegacy() bool {
	// Stream offset 1 is the first field of the first message; a G0/G1 opcode 0 is SET, whose first
	// field is the key.
	return d.fieldOff == 1 && d.msg.Wire == 0 && !d.gen.Validated()
}

// validateToLegacy is the violation of a VALIDATE whose magic is complete on a G0/G1 stream. It is
// known at the magic's last byte, three bytes before the key length it would make is.
func (d *Decoder) validateToLegacy() *Violation {
	d.msg.Op = OpValidate
	return d.violation(RuleValidateToLegacyStore, FieldMagic, uint64(ValidateMagic), 0)
}

// field applies the checks of a fixed part whose value v has just arrived.
func (d *Decoder) field(v uint64) *Violation {
	lim := &d.cfg.Limits
	end := d.off - d.msg.Offset // message bytes up to the end of this fixed part
	if end > lim.MaxMessageBytes {
		return d.violation(RuleMessageTooLarge, d.kind, end, lim.MaxMessageBytes)
	}
	switch d.kind {
	case FieldKey:
		if v > lim.MaxKeyBytes {
			return d.violation(RuleKeyTooLong, FieldKey, v, lim.MaxKeyBytes)
		}
	case FieldValue, FieldExpected, FieldDesired:
		if v > lim.MaxValueBytes {
			return d.violation(RuleValueTooLong, d.kind, v, lim.MaxValueBytes)
		}
	case FieldCount:
		if v > lim.MaxKeys {
			return d.violation(RuleTooManyKeys, FieldCount, v, lim.MaxKeys)
		}
		if v == 0 && lim.RejectZeroCount {
			return d.violation(RuleZeroCount, FieldCount, v, 1)
		}
		// Every key needs at least its length field: a count that cannot fit is known now.
		// v <= MaxKeys <= MaxLimit, so the product cannot overflow.
		if min := end + v*d.lay.minLoop; min > lim.MaxMessageBytes {
			return d.violation(RuleMessageTooLarge, FieldCount, min, lim.MaxMessageBytes)
		}
		d.msg.Count, d.loopLeft = v, v
	case FieldMagic:
		if v != uint64(ValidateMagic) {
			// Declare the bytes up to the first wrong one, as the byte-at-a-time path does, so
			// the verdict does not depend on how the stream was split.
			upTo := bits.TrailingZeros64(v^uint64(ValidateMagic))/8 + 1
			return d.violation(RuleValidateBadMagic, FieldMagic, v&(1<<(8*upTo)-1), uint64(ValidateMagic))
		}
	}
	f := Field{Kind: d.kind, Off: d.fieldOff - d.msg.Offset}
	if d.kind.hasBody() {
		// v is at most MaxLimit and end at most MaxMessageBytes + 8: no overflow.
		if end+v > lim.MaxMessageBytes {
			return d.violation(RuleMessageTooLarge, d.kind, end+v, lim.MaxMessageBytes)
		}
		f.Len = v
		d.body = v
	} else {
		f.Int = v
	}
	if d.msg.NFields < MaxRecordedFields {
		d.msg.Fields[d.msg.NFields] = f
	}
	d.msg.NFields++
	return nil
}

// next moves to the field after the current one; it reports whether the message completed.
func (d *Decoder) next() bool {
	seq := d.lay.head
	if d.inLoop {
		seq = d.lay.loop
	}
	d.pc++
	if d.pc == len(seq) {
		if d.inLoop {
			d.loopLeft--
		}
		if d.loopLeft == 0 {
			d.finish()
			return true
		}
		d.inLoop, d.pc, seq = true, 0, d.lay.loop
	}
	d.kind, d.fieldOff = seq[d.pc], d.off
	return false
}

func (d *Decoder) finish() {
	d.inMsg = false
	d.msg.Len = d.off - d.msg.Offset
	if d.msg.Op == OpValidate {
		d.validated = true
	}
	d.index++
}

func (d *Decoder) violation(r Rule, f FieldKind, declared, limit uint64) *Violation {
	off := d.msg.Offset
	if f != FieldNone {
		off = d.fieldOff
	}
	return &Violation{Rule: r, Field: f, Offset: off, Index: d.index, MsgOffset: d.msg.Offset,
		Op: d.msg.Op, Wire: d.msg.Wire, Generation: d.minGen, Declared: declared, Limit: limit}
}

func (d *Decoder) fail(v *Violation) *Violation {
	d.err = v
	return v
}

// Expire stops the stream with a timeout rule: RuleMessageTimeout for the message in progress, or
// RuleFirstMessageTimeout for a stream that has sent nothing. The clock belongs to the caller.
func (d *Decoder) Expire(r Rule) *Violation {
	if d.err != nil {
		return d.err
	}
	if !d.InMessage() {
		d.msg.Op, d.msg.Wire, d.msg.Offset = OpInvalid, 0, d.off
	}
	v := d.violation(r, FieldNone, d.PartialBytes(), 0)
	return d.fail(v)
}

// ValidPrefix is what a guard may forward of a stream's bytes data: every complete message before
// the first violation, nothing of a message that is incomplete or offending.
func ValidPrefix(cfg Config, data []byte) []byte {
	d := NewDecoder(cfg)
	end := 0
	for p := 0; p < len(data); {
		n, msg, err := d.Scan(data[p:])
		p += n
		if err != nil {
			break
		}
		if msg != nil {
			end = p
		}
	}
	return data[:end]
}

// FirstViolation is the violation, if any, that data breaks as a stream's first bytes: what a
// banned source's connection, read but never decoded live, came with. A message that data leaves
// incomplete is none.
func FirstViolation(cfg Config, data []byte) *Violation {
	d := NewDecoder(cfg)
	for p := 0; p < len(data); {
		n, _, err := d.Scan(data[p:])
		p += n
		if err != nil {
			v, _ := err.(*Violation)
			return v
		}
	}
	return nil
}
