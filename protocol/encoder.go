package protocol

import (
	"encoding/binary"
	"fmt"
)

// Request is a message to encode. Which fields are used depends on Op's layout: Key for single-key
// ops; Value for SET, APPEND, QUEUE_PUSH and COMPARE_SET's expected value; Desired for COMPARE_SET;
// Int for ADD's delta and BARRIER's world size; Keys for CHECK, WAIT, MULTI_GET and MULTI_SET, with
// Values for MULTI_SET; U32 for PING's nonce (VALIDATE always carries ValidateMagic).
type Request struct {
	Op      Op
	Key     []byte
	Value   []byte
	Desired []byte
	Int     int64
	Keys    [][]byte
	Values  [][]byte
	U32     uint32
}

// Append appends r as generation g puts it on the wire.
func Append(dst []byte, g Generation, r Request) ([]byte, error) {
	wire, ok := WireOf(g, r.Op)
	if !ok {
		return dst, fmt.Errorf("%s has no %s", g, r.Op)
	}
	lay := opLayouts[r.Op]
	if len(lay.loop) == 2 && len(r.Values) != len(r.Keys) {
		return dst, fmt.Errorf("%s: %d keys but %d values", r.Op, len(r.Keys), len(r.Values))
	}
	dst = append(dst, wire)
	values := [][]byte{r.Value, r.Desired}
	for _, k := range lay.head {
		switch k {
		case FieldKey:
			dst = AppendBytes(dst, r.Key)
		case FieldValue, FieldExpected:
			dst = AppendBytes(dst, values[0])
		case FieldDesired:
			dst = AppendBytes(dst, values[1])
		case FieldDelta, FieldWorldSize:
			dst = binary.LittleEndian.AppendUint64(dst, uint64(r.Int))
		case FieldCount:
			dst = binary.LittleEndian.AppendUint64(dst, uint64(len(r.Keys)))
		case FieldMagic:
			dst = binary.LittleEndian.AppendUint32(dst, ValidateMagic)
		case FieldNonce:
			dst = binary.LittleEndian.AppendUint32(dst, r.U32)
		}
	}
	for i := range r.Keys {
		if len(lay.loop) == 0 {
			break
		}
		dst = AppendBytes(dst, r.Keys[i])
		if len(lay.loop) == 2 {
			dst = AppendBytes(dst, r.Values[i])
		}
	}
	return dst, nil
}

// AppendBytes appends a key or value: its u64 length, then its bytes.
func AppendBytes(dst, b []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(b)))
	return append(dst, b...)
}

// AppendHandshake appends what a client of generation g sends before its first request: VALIDATE
// from G2 on, then PING (with nonce) from G3 on.
func AppendHandshake(dst []byte, g Generation, nonce uint32) []byte {
	if g.Validated() {
		dst, _ = Append(dst, g, Request{Op: OpValidate})
	}
	if _, ok := WireOf(g, OpPing); ok {
		dst, _ = Append(dst, g, Request{Op: OpPing, U32: nonce})
	}
	return dst
}

// ParseRequest rebuilds the Request of one complete message whose bytes are msg (opcode
// included), as a Decoder reported it with op. It allocates; it is for tests, tools and replay,
// not for the proxy's hot path.
func ParseRequest(op Op, msg []byte) (Request, error) {
	r := Request{Op: op}
	if op == OpInvalid || op >= numOps || len(msg) == 0 {
		return r, fmt.Errorf("no message")
	}
	p := msg[1:]
	short := fmt.Errorf("%s: message ends early", op)
	u64 := func() (uint64, bool) {
		if len(p) < 8 {
			return 0, false
		}
		v := binary.LittleEndian.Uint64(p)
		p = p[8:]
		return v, true
	}
	bytes := func() ([]byte, bool) {
		n, ok := u64()
		if !ok || n > uint64(len(p)) {
			return nil, false
		}
		b := p[:n:n]
		p = p[n:]
		return b, true
	}
	lay := opLayouts[op]
	var count uint64
	for _, k := range lay.head {
		var ok bool
		switch k {
		case FieldKey:
			r.Key, ok = bytes()
		case FieldValue, FieldExpected:
			r.Value, ok = bytes()
		case FieldDesired:
			r.Desired, ok = bytes()
		case FieldDelta, FieldWorldSize:
			var v uint64
			v, ok = u64()
			r.Int = int64(v)
		case FieldCount:
			count, ok = u64()
			// Each key takes at least 8 bytes: a count beyond that is a lie, not an allocation size.
			ok = ok && count <= uint64(len(p))/8
		case FieldMagic, FieldNonce:
			if ok = len(p) >= 4; ok {
				r.U32 = binary.LittleEndian.Uint32(p)
				p = p[4:]
			}
		}
		if !ok {
			return r, short
		}
	}
	if len(lay.loop) > 0 {
		r.Keys = make([][]byte, 0, count)
		for range count {
			k, ok := bytes()
			if !ok {
				return r, short
			}
			r.Keys = append(r.Keys, k)
			if len(lay.loop) == 2 {
				v, ok := bytes()
				if !ok {
					return r, short
				}
				r.Values = append(r.Values, v)
			}
		}
	}
	if len(p) != 0 {
		return r, fmt.Errorf("%s: %d bytes after the message", op, len(p))
	}
	return r, nil
}
