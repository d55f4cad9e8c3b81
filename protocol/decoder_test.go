package protocol

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// decoded is what a whole stream decodes to, in a form tests compare.
type decoded struct {
	msgs []Message
	bufs [][]byte // each message's bytes
	viol *Violation
}

// decodeChunks feeds stream to a fresh decoder in the given chunk sizes (cycled) and collects
// every message with its bytes, as a store-and-forward caller would.
func decodeChunks(cfg Config, stream []byte, sizes []int) decoded {
	d := NewDecoder(cfg)
	var out decoded
	var cur []byte
	for k := 0; len(stream) > 0; k++ {
		chunk := stream[:min(sizes[k%len(sizes)], len(stream))]
		stream = stream[len(chunk):]
		for len(chunk) > 0 {
			n, msg, err := d.Scan(chunk)
			cur = append(cur, chunk[:n]...)
			chunk = chunk[n:]
			if err != nil {
				out.viol = err.(*Violation)
				return out
			}
			if msg != nil {
				out.msgs = append(out.msgs, *msg)
				out.bufs = append(out.bufs, cur)
				cur = nil
			}
		}
	}
	return out
}

func decodeAll(cfg Config, stream []byte) decoded {
	return decodeChunks(cfg, stream, []int{len(stream) + 1})
}

func exact(g Generation) Config {
	return Config{Gen: GenSetting{Gen: g}, Limits: DefaultLimits()}
}

func auto(legacy Generation) Config {
	return Config{Gen: GenSetting{Auto: true}, LegacyGen: legacy, Limits: DefaultLimits()}
}

func mustAppend(t testing.TB, dst []byte, g Generation, r Request) []byte {
	t.Helper()
	out, err := Append(dst, g, r)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sampleRequests returns one request of every op generation g has, with distinct contents.
func sampleRequests(g Generation) []Request {
	var rs []Request
	for _, op := range opcodes[g] {
		r := Request{Op: op, Key: []byte("/k-" + op.String()), Value: []byte("value"), Desired: []byte("desired"),
			Int: -2, U32: 4242,
			Keys:   [][]byte{[]byte("/a"), {}, []byte("/c\x00binary")},
			Values: [][]byte{[]byte("1"), []byte("22"), {}}}
		if op == OpValidate {
			continue
		}
		rs = append(rs, r)
	}
	return rs
}

// sampleStream is a full, valid connection of generation g: handshake, then every op.
func sampleStream(t testing.TB, g Generation) ([]byte, []Request) {
	var b []byte
	var rs []Request
	if g.Validated() {
		b = mustAppend(t, b, g, Request{Op: OpValidate})
		rs = append(rs, Request{Op: OpValidate, U32: ValidateMagic})
	}
	for _, r := range sampleRequests(g) {
		if r.Op == OpWatchKey {
			continue
		}
		b = mustAppend(t, b, g, r)
		rs = append(rs, r)
	}
	return b, rs
}

func TestRoundTripEveryOpEveryGeneration(t *testing.T) {
	for g := G0; g <= LatestGeneration; g++ {
		t.Run(g.String(), func(t *testing.T) {
			stream, reqs := sampleStream(t, g)
			got := decodeAll(exact(g), stream)
			if got.viol != nil {
				t.Fatalf("violation on a valid stream: %v", got.viol)
			}
			if len(got.msgs) != len(reqs) {
				t.Fatalf("got %d messages, want %d", len(got.msgs), len(reqs))
			}
			var off uint64
			for i, m := range got.msgs {
				want := reqs[i]
				if m.Op != want.Op || m.Index != uint64(i) || m.Offset != off || m.Len != uint64(len(got.bufs[i])) {
					t.Errorf("message %d: op %s index %d offset %d len %d; want %s %d %d %d",
						i, m.Op, m.Index, m.Offset, m.Len, want.Op, i, off, len(got.bufs[i]))
				}
				off += m.Len
				r, err := ParseRequest(m.Op, got.bufs[i])
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				re := mustAppend(t, nil, g, r)
				if !bytes.Equal(re, got.bufs[i]) {
					t.Errorf("message %d %s: re-encoded\n%x\nwant\n%x", i, m.Op, re, got.bufs[i])
				}
				if f := m.Recorded(); len(f) > 0 && f[0].Kind == FieldKey {
					if k := m.Body(f[0], got.bufs[i]); !bytes.Equal(k, want.Key) {
						t.Errorf("message %d: key %q, want %q", i, k, want.Key)
					}
				}
			}
			if off != uint64(len(stream)) {
				t.Errorf("messages cover %d bytes, stream has %d", off, len(stream))
			}
		})
	}
}

// TestKnownVectors decodes the byte strings of the protocol notes (section 9 and the captured
// 1.13 exchange).
func TestKnownVectors(t *testing.T) {
	cases := []struct {
		name   string
		gen    Generation
		hex    string
		op     Op
		fields []Field
	}{
		{"validate", G2, "00cef7853c", OpValidate, []Field{{Kind: FieldMagic, Off: 1, Int: 0x3C85F7CE}}},
		{"set /k=v", G2, "01 0200000000000000 2f6b 0100000000000000 76", OpSet,
			[]Field{{Kind: FieldKey, Off: 1, Len: 2}, {Kind: FieldValue, Off: 11, Len: 1}}},
		{"add init/ +1", G2, "04 0500000000000000 696e69742f 0100000000000000", OpAdd,
			[]Field{{Kind: FieldKey, Off: 1, Len: 5}, {Kind: FieldDelta, Off: 14, Int: 1}}},
		{"wait [/k]", G2, "06 0100000000000000 0200000000000000 2f6b", OpWait,
			[]Field{{Kind: FieldCount, Off: 1, Int: 1}, {Kind: FieldKey, Off: 9, Len: 2}}},
		{"barrier /bar 4", G6, "12 0400000000000000 2f626172 0400000000000000", OpBarrier,
			[]Field{{Kind: FieldKey, Off: 1, Len: 4}, {Kind: FieldWorldSize, Off: 13, Int: 4}}},
		{"1.13 set /k1=v1", G0, "00 0300000000000000 2f6b31 0200000000000000 7631", OpSet,
			[]Field{{Kind: FieldKey, Off: 1, Len: 3}, {Kind: FieldValue, Off: 12, Len: 2}}},
		{"1.13 add delta -2", G0, "03 0400000000000000 2f636e74 feffffffffffffff", OpAdd,
			[]Field{{Kind: FieldKey, Off: 1, Len: 4}, {Kind: FieldDelta, Off: 13, Int: 0xfffffffffffffffe}}},
		{"1.13 cas create", G0, "01 0400000000000000 2f6e6577 0000000000000000 0100000000000000 7a", OpCompareSet,
			[]Field{{Kind: FieldKey, Off: 1, Len: 4}, {Kind: FieldExpected, Off: 13, Len: 0}, {Kind: FieldDesired, Off: 21, Len: 1}}},
		{"1.13 numkeys", G0, "06", OpGetNumKeys, nil},
		{"cancel_wait", G2, "0c", OpCancelWait, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := unhex(t, c.hex)
			if c.gen.Validated() && c.op != OpValidate {
				b = append(unhex(t, "00cef7853c"), b...)
			}
			got := decodeAll(exact(c.gen), b)
			if got.viol != nil {
				t.Fatal(got.viol)
			}
			m := got.msgs[len(got.msgs)-1]
			if m.Op != c.op || !reflect.DeepEqual(append([]Field{}, m.Recorded()...), append([]Field{}, c.fields...)) {
				t.Errorf("got %s %+v, want %s %+v", m.Op, m.Recorded(), c.op, c.fields)
			}
		})
	}
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var validate = "00cef7853c"

// TestMalformed covers every malformed class of the protocol notes' section 7 that a decoder can
// see, each with the rule and the stream offset it must report.
func TestMalformed(t *testing.T) {
	small := DefaultLimits()
	small.MaxMessageBytes = 100
	zero := DefaultLimits()
	zero.RejectZeroCount = true
	watchOK := DefaultLimits()
	watchOK.BlockWatchKey = false
	cases := []struct {
		name     string
		cfg      Config
		hex      string
		rule     Rule // "" = valid
		offset   uint64
		index    uint64
		field    FieldKind
		declared uint64
		limit    uint64
	}{
		// 1-5, 19: the handshake.
		{name: "G2 first message not VALIDATE", cfg: exact(G2), hex: "03 0200000000000000 2f6b", rule: RuleValidateMissing},
		{name: "G6 unknown first byte", cfg: exact(G6), hex: "ff", rule: RuleValidateMissing},
		{name: "wrong magic", cfg: exact(G3), hex: "00 cef7853d", rule: RuleValidateBadMagic, offset: 1, field: FieldMagic,
			declared: 0x3D85F7CE, limit: 0x3C85F7CE},
		{name: "wrong magic seen at its first wrong byte", cfg: exact(G3), hex: "00 ce00", rule: RuleValidateBadMagic,
			offset: 1, field: FieldMagic, declared: 0xCE, limit: 0x3C85F7CE},
		{name: "big-endian magic", cfg: exact(G2), hex: "00 3c85f7ce", rule: RuleValidateBadMagic, offset: 1,
			field: FieldMagic, declared: 0x3C, limit: 0x3C85F7CE},
		{name: "VALIDATE repeated", cfg: exact(G3), hex: validate + validate, rule: RuleValidateRepeated, offset: 5, index: 1},
		{name: "PING before VALIDATE", cfg: exact(G3), hex: "0d 39300000", rule: RulePingBeforeValidate},
		{name: "PING in G2", cfg: exact(G2), hex: validate + "0d 39300000", rule: RuleUnknownOpcode, offset: 5, index: 1},
		{name: "PING after VALIDATE in G3", cfg: exact(G3), hex: validate + "0d 39300000"},
		// 6: unknown opcodes, per generation.
		{name: "G0 0x09", cfg: exact(G0), hex: "09", rule: RuleUnknownOpcode},
		{name: "G1 0x0c", cfg: exact(G1), hex: "0c", rule: RuleUnknownOpcode},
		{name: "G1 0x0b cancel_wait", cfg: exact(G1), hex: "0b"},
		{name: "G3 0x0e", cfg: exact(G3), hex: validate + "0e", rule: RuleUnknownOpcode, offset: 5, index: 1},
		{name: "G4 0x11", cfg: exact(G4), hex: validate + "11", rule: RuleUnknownOpcode, offset: 5, index: 1},
		{name: "G5 0x12", cfg: exact(G5), hex: validate + "12", rule: RuleUnknownOpcode, offset: 5, index: 1},
		{name: "G6 0x13", cfg: exact(G6), hex: validate + "13", rule: RuleUnknownOpcode, offset: 5, index: 1},
		{name: "G6 0xff", cfg: exact(G6), hex: validate + "ff", rule: RuleUnknownOpcode, offset: 5, index: 1},
		// 7: WATCH_KEY.
		{name: "G0 WATCH_KEY blocked", cfg: exact(G0), hex: "07 0200000000000000 2f77", rule: RuleWatchKeyBlocked},
		{name: "G0 WATCH_KEY allowed", cfg: Config{Gen: GenSetting{Gen: G0}, Limits: watchOK}, hex: "07 0200000000000000 2f77"},
		// 8, 9, 11: oversize lengths, checked the moment their 8 bytes are in.
		{name: "key 8192 is allowed", cfg: exact(G0), hex: "02 0020000000000000" + strings.Repeat("61", 8192)},
		{name: "key 8193", cfg: exact(G0), hex: "02 0120000000000000", rule: RuleKeyTooLong, offset: 1, field: FieldKey,
			declared: 8193, limit: 8192},
		{name: "nmap TerminalServer as G0 ADD", cfg: exact(G0), hex: "03 00000b06e0000000 000000", rule: RuleKeyTooLong,
			offset: 1, field: FieldKey, declared: 0xE0060B0000, limit: 8192},
		{name: "nmap TerminalServer in G2", cfg: exact(G2), hex: "03 00000b06e0000000 000000", rule: RuleValidateMissing},
		{name: "G0 SET keylen 2^62", cfg: exact(G0), hex: "00 0000000000000040", rule: RuleKeyTooLong, offset: 1,
			field: FieldKey, declared: 1 << 62, limit: 8192},
		{name: "key length with the sign bit", cfg: exact(G1), hex: "02 ffffffffffffffff", rule: RuleKeyTooLong, offset: 1,
			field: FieldKey, declared: 1<<64 - 1, limit: 8192},
		{name: "SET value 8MiB+1", cfg: exact(G2), hex: validate + "01 0100000000000000 6b 0100800000000000",
			rule: RuleValueTooLong, offset: 15, index: 1, field: FieldValue, declared: 8<<20 + 1, limit: 8 << 20},
		{name: "COMPARE_SET expected too long", cfg: exact(G0), hex: "01 0100000000000000 6b ffffffff00000000",
			rule: RuleValueTooLong, offset: 10, field: FieldExpected, declared: 0xffffffff, limit: 8 << 20},
		{name: "COMPARE_SET desired too long", cfg: exact(G0), hex: "01 0100000000000000 6b 0100000000000000 78 0000000100000000",
			rule: RuleValueTooLong, offset: 19, field: FieldDesired, declared: 1 << 24, limit: 8 << 20},
		{name: "MULTI_SET second value too long", cfg: exact(G1),
			hex:  "0a 0200000000000000 0100000000000000 61 0100000000000000 31 0100000000000000 62 0000000001000000",
			rule: RuleValueTooLong, offset: 36, field: FieldValue, declared: 1 << 32, limit: 8 << 20},
		{name: "APPEND value too long", cfg: exact(G1), hex: "08 0000000000000000 0000000100000000", rule: RuleValueTooLong,
			offset: 9, field: FieldValue, declared: 1 << 24, limit: 8 << 20},
		{name: "QUEUE_PUSH item too long", cfg: exact(G4), hex: validate + "0e 0100000000000000 71 0000000100000000",
			rule: RuleValueTooLong, offset: 15, index: 1, field: FieldValue, declared: 1 << 24, limit: 8 << 20},
		{name: "WAIT second key too long", cfg: exact(G2),
			hex: validate + "06 0200000000000000 0100000000000000 61 0000010000000000", rule: RuleKeyTooLong,
			offset: 5 + 18, index: 1, field: FieldKey, declared: 1 << 16, limit: 8192},
		// 10: counts.
		{name: "G0 CHECK n=2^24", cfg: exact(G0), hex: "04 0000000100000000", rule: RuleTooManyKeys, offset: 1,
			field: FieldCount, declared: 1 << 24, limit: 131072},
		{name: "MULTI_SET count sign bit", cfg: exact(G2), hex: validate + "0b 0000000000000080", rule: RuleTooManyKeys,
			offset: 6, index: 1, field: FieldCount, declared: 1 << 63, limit: 131072},
		// 12, 13: the whole message.
		{name: "aggregate over the message cap", cfg: Config{Gen: GenSetting{Gen: G1}, Limits: small},
			hex: "0a 0200000000000000 0100000000000000 61 5000000000000000", rule: RuleMessageTooLarge, offset: 18,
			field: FieldValue, declared: 26 + 80, limit: 100},
		{name: "count whose keys cannot fit", cfg: Config{Gen: GenSetting{Gen: G1}, Limits: small},
			hex: "04 0c00000000000000", rule: RuleMessageTooLarge, offset: 1, field: FieldCount, declared: 9 + 12*8, limit: 100},
		// 15: trailing garbage shows as the next message's opcode.
		{name: "SET then garbage", cfg: exact(G0), hex: "00 0300000000000000 2f7467 0300000000000000 76616c eeee",
			rule: RuleUnknownOpcode, offset: 23, index: 1},
		// 18: zero counts.
		{name: "zero-count CHECK allowed by default", cfg: exact(G0), hex: "04 0000000000000000"},
		{name: "zero-count CHECK rejected on request", cfg: Config{Gen: GenSetting{Gen: G0}, Limits: zero},
			hex: "04 0000000000000000", rule: RuleZeroCount, offset: 1, field: FieldCount, declared: 0, limit: 1},
		// 20: a G2+ client talking to a G0 store.
		// It is refused at the magic's last byte, under a rule of its own, whatever follows.
		{name: "VALIDATE+PING against G0", cfg: exact(G0), hex: validate + "0d 39300000", rule: RuleValidateToLegacyStore,
			offset: 1, field: FieldMagic, declared: uint64(ValidateMagic)},
		{name: "VALIDATE held open against G1", cfg: exact(G1), hex: validate, rule: RuleValidateToLegacyStore,
			offset: 1, field: FieldMagic, declared: uint64(ValidateMagic)},
		{name: "VALIDATE + G6 SET against G1", cfg: exact(G1), hex: validate + "01 0000000000000000 0000000000000000",
			rule: RuleValidateToLegacyStore, offset: 1, field: FieldMagic, declared: uint64(ValidateMagic)},
		// Only a stream's first message can be a handshake: later, the same bytes are a SET's key length.
		{name: "magic as a later SET's key length", cfg: exact(G1), hex: "06" + validate + "0d000000",
			rule: RuleKeyTooLong, offset: 2, index: 1, field: FieldKey, declared: 0x0000_000D_3C85_F7CE, limit: 8192},
		// 21: ops the backend lacks.
		{name: "QUEUE_POP on legacy", cfg: Config{Gen: GenSetting{Gen: G4}, Backend: BackendLegacy, Limits: DefaultLimits()},
			hex: validate + "0f 0100000000000000 71", rule: RuleOpNotInBackend, offset: 5, index: 1},
		{name: "QUEUE_POP on libuv", cfg: Config{Gen: GenSetting{Gen: G4}, Backend: BackendLibuv, Limits: DefaultLimits()},
			hex: validate + "0f 0100000000000000 71"},
		{name: "BARRIER on legacy", cfg: Config{Gen: GenSetting{Gen: G6}, Backend: BackendLegacy, Limits: DefaultLimits()},
			hex: validate + "12 0100000000000000 62 0400000000000000"},
		// auto.
		{name: "auto: nmap probe read as G0", cfg: auto(G0), hex: "03 00000b06e0000000 000000", rule: RuleKeyTooLong,
			offset: 1, field: FieldKey, declared: 0xE0060B0000, limit: 8192},
		{name: "auto: SET keylen starting like the magic", cfg: auto(G0), hex: "00 cef785ff00000000", rule: RuleKeyTooLong,
			offset: 1, field: FieldKey, declared: 0xFF85F7CE, limit: 8192},
		{name: "auto: VALIDATE twice", cfg: auto(G0), hex: validate + validate, rule: RuleValidateRepeated, offset: 5, index: 1},
		{name: "auto: queue op after VALIDATE", cfg: auto(G0), hex: validate + "10 0100000000000000 71"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stream := unhex(t, c.hex)
			for _, sizes := range [][]int{{len(stream) + 1}, {1}, {3, 1, 7}} {
				got := decodeChunks(c.cfg, stream, sizes)
				if c.rule == "" {
					if got.viol != nil {
						t.Fatalf("chunks %v: unexpected %v", sizes, got.viol)
					}
					continue
				}
				v := got.viol
				if v == nil {
					t.Fatalf("chunks %v: no violation, want %s", sizes, c.rule)
				}
				limit := c.limit
				if v.Rule != c.rule || v.Offset != c.offset || v.Index != c.index || v.Field != c.field ||
					v.Declared != c.declared || v.Limit != limit {
					t.Errorf("chunks %v: got %s field %s offset %d index %d declared %d limit %d;\n"+
						"want %s field %s offset %d index %d declared %d limit %d",
						sizes, v.Rule, v.Field, v.Offset, v.Index, v.Declared, v.Limit,
						c.rule, c.field, c.offset, c.index, c.declared, limit)
				}
				if uint64(len(got.msgs)) != c.index {
					t.Errorf("chunks %v: %d messages before the violation, want %d", sizes, len(got.msgs), c.index)
				}
			}
		})
	}
}

func TestViolationIsAnError(t *testing.T) {
	d := NewDecoder(exact(G0))
	_, _, err := d.Scan(unhex(t, "03 00000b06e0000000"))
	var v *Violation
	if !errors.As(err, &v) || v.Rule != RuleKeyTooLong {
		t.Fatalf("errors.As: %v", err)
	}
	want := "key_too_long at offset 1 (message 0, opcode 0x03 add, G0): key declared 962174058496, limit 8192"
	if err.Error() != want {
		t.Errorf("got %q, want %q", err.Error(), want)
	}
	// A stopped decoder keeps its verdict.
	if _, _, err2 := d.Scan([]byte{0}); err2 != err {
		t.Errorf("after a violation Scan returned %v", err2)
	}
}

func TestAutoNarrowsGeneration(t *testing.T) {
	steps := []struct {
		hex  string
		want Generation
	}{
		{validate, G2},
		{"0d 39300000", G3},
		{"01 0100000000000000 6b 0100000000000000 76", G3},
		{"0e 0100000000000000 71 0100000000000000 78", G4},
		{"11", G5},
		{"12 0100000000000000 62 0100000000000000", G6},
	}
	d := NewDecoder(auto(G0))
	if _, ok := d.Generation(); ok {
		t.Fatal("generation known before any byte")
	}
	for _, s := range steps {
		b := unhex(t, s.hex)
		for _, c := range b { // one byte at a time: the hardest chunking
			if _, _, err := d.Scan([]byte{c}); err != nil {
				t.Fatal(err)
			}
		}
		if g, ok := d.Generation(); !ok || g != s.want {
			t.Errorf("after %s: generation %s (known %v), want %s", s.hex, g, ok, s.want)
		}
	}
}

func TestAutoLegacyFallback(t *testing.T) {
	// G0 DELETE_KEY (0x08, key) and G1 APPEND (0x08, key, value) differ: LegacyGen decides.
	del := unhex(t, "08 0200000000000000 2f6b")
	app := unhex(t, "08 0200000000000000 2f6b 0100000000000000 76")
	if got := decodeAll(auto(G0), del); got.viol != nil || len(got.msgs) != 1 || got.msgs[0].Op != OpDeleteKey {
		t.Errorf("G0 fallback: %+v", got)
	}
	if got := decodeAll(auto(G1), app); got.viol != nil || len(got.msgs) != 1 || got.msgs[0].Op != OpAppend {
		t.Errorf("G1 fallback: %+v", got)
	}
	// A G0 SET starting 0x00 is told from VALIDATE at the first byte that is not the magic's.
	set := unhex(t, "00 0300000000000000 2f6b31 0200000000000000 7631")
	got := decodeChunks(auto(G0), set, []int{1})
	if got.viol != nil || len(got.msgs) != 1 || got.msgs[0].Op != OpSet || got.msgs[0].Len != uint64(len(set)) {
		t.Fatalf("auto G0 SET: %+v", got)
	}
	if g, _ := NewDecoder(auto(G0)).Generation(); g != G0 {
		t.Errorf("unresolved generation reads %s", g)
	}
}

// TestChunkingInvariance: random splits of a long stream of every generation give the same
// messages and the same verdict as one whole write, for valid and for hostile streams.
func TestChunkingInvariance(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for g := G0; g <= LatestGeneration; g++ {
		base, _ := sampleStream(t, g)
		streams := map[string][]byte{"valid": base}
		for name, tail := range map[string]string{
			"oversize key":  "02 0000000001000000",
			"unknown op":    "ff",
			"huge count":    "05 ffffffffffffffff",
			"partial value": "01 0100000000000000 6b 1000000000000000 7676",
		} {
			b := append([]byte{}, base...)
			if g.Validated() { // keep the opcodes meaningful for the shifted numbering
				tail = fmt.Sprintf("%02x", unhex(t, tail)[0]+1) + tail[2:]
			}
			streams[name] = append(b, unhex(t, tail)...)
		}
		for name, s := range streams {
			for _, cfg := range []Config{exact(g), auto(min(g, G1))} {
				want := decodeAll(cfg, s)
				for trial := 0; trial < 50; trial++ {
					sizes := make([]int, 1+rng.IntN(8))
					for i := range sizes {
						sizes[i] = 1 + rng.IntN(1+rng.IntN(40))
					}
					got := decodeChunks(cfg, s, sizes)
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("%s %s %s chunks %v:\n got %+v\nwant %+v", g, name, cfg.Gen, sizes, got.viol, want.viol)
					}
				}
			}
		}
	}
}

func TestExpire(t *testing.T) {
	d := NewDecoder(exact(G0))
	stream := unhex(t, "06 00 6400000000000000 616263") // NUMKEYS, then a partial SET
	for len(stream) > 0 {
		n, _, err := d.Scan(stream)
		if err != nil {
			t.Fatal(err)
		}
		stream = stream[n:]
	}
	if !d.InMessage() || d.PartialBytes() != 12 {
		t.Fatalf("in message %v, partial %d", d.InMessage(), d.PartialBytes())
	}
	v := d.Expire(RuleMessageTimeout)
	if v.Rule != RuleMessageTimeout || v.Offset != 1 || v.Index != 1 || v.Op != OpSet || v.Declared != 12 {
		t.Errorf("got %+v", v)
	}
	idle := NewDecoder(auto(G0)).Expire(RuleFirstMessageTimeout)
	if idle.Offset != 0 || idle.Index != 0 || idle.Op != OpInvalid {
		t.Errorf("first-message timeout: %+v", idle)
	}
}

func TestScanAllocatesNothing(t *testing.T) {
	stream, _ := sampleStream(t, LatestGeneration)
	d := NewDecoder(exact(LatestGeneration))
	allocs := testing.AllocsPerRun(100, func() {
		d.Reset(exact(LatestGeneration))
		for p := stream; len(p) > 0; {
			n, _, err := d.Scan(p)
			if err != nil {
				t.Fatal(err)
			}
			p = p[n:]
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per stream", allocs)
	}
}

func TestParseGeneration(t *testing.T) {
	cases := []struct {
		in   string
		want GenSetting
		err  string
	}{
		{"auto", GenSetting{Auto: true}, ""},
		{"AUTO", GenSetting{Auto: true}, ""},
		{" auto", GenSetting{}, "not a generation"},
		{"G00", GenSetting{}, "not a generation"},
		{"02.6", GenSetting{}, "not a generation"},
		{"2.06", GenSetting{}, "not a generation"},
		{"2.100", GenSetting{}, "not a generation"},
		{"G0", GenSetting{Gen: G0}, ""},
		{"g6", GenSetting{Gen: G6}, ""},
		{"1.13", GenSetting{Gen: G0}, ""},
		{"2.0", GenSetting{Gen: G0}, ""},
		{"2.1", GenSetting{Gen: G1}, ""},
		{"2.2", GenSetting{Gen: G2}, ""},
		{"2.4.1", GenSetting{Gen: G2}, ""},
		{"2.5", GenSetting{Gen: G3}, ""},
		{"2.7", GenSetting{Gen: G3}, ""},
		{"2.8", GenSetting{Gen: G4}, ""},
		{"2.10", GenSetting{Gen: G5}, ""},
		{"2.11", GenSetting{Gen: G5}, ""},
		{"2.12", GenSetting{Gen: G6}, ""},
		{"2.15", GenSetting{Gen: G6}, ""},
		{"G7", GenSetting{}, "not a generation"},
		{"1.12", GenSetting{}, "older than 1.13"},
		{"3.0", GenSetting{}, "not a release"},
		{"two", GenSetting{}, "not a generation"},
		{"2.x", GenSetting{}, "not a generation"},
	}
	for _, c := range cases {
		got, err := ParseGeneration(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: got %v %v, want %v", c.in, got, err, c.want)
		}
	}
}

func TestOpcodeTables(t *testing.T) {
	// The numbering shifted by one in G2: the same byte means different ops.
	for _, c := range []struct {
		g    Generation
		wire byte
		op   Op
	}{
		{G0, 0x03, OpAdd}, {G1, 0x03, OpAdd}, {G2, 0x03, OpGet}, {G0, 0x07, OpWatchKey}, {G1, 0x07, OpDeleteKey},
		{G2, 0x00, OpValidate}, {G3, 0x0d, OpPing}, {G4, 0x10, OpQueueLen}, {G5, 0x11, OpListKeys},
		{G6, 0x12, OpBarrier}, {G6, 0x13, OpInvalid}, {G2, 0x0d, OpInvalid},
	} {
		if got := OpOf(c.g, c.wire); got != c.op {
			t.Errorf("%s 0x%02x: %s, want %s", c.g, c.wire, got, c.op)
		}
	}
}

func TestValidPrefix(t *testing.T) {
	cfg := Config{Gen: GenSetting{Gen: G0}, Limits: DefaultLimits()}
	get := []byte{0x02, 1, 0, 0, 0, 0, 0, 0, 0, 'k'} // GET "k"
	for _, tc := range []struct {
		data []byte
		want int
	}{
		{nil, 0},
		{get, len(get)},
		{append(append([]byte{}, get...), get[:4]...), len(get)}, // then a partial message
		{append(append([]byte{}, get...), 0xff, 0x02), len(get)}, // then an unknown opcode
		{append(append(append([]byte{}, get...), get...), 0xff), 2 * len(get)},
	} {
		if got := ValidPrefix(cfg, tc.data); len(got) != tc.want {
			t.Errorf("ValidPrefix(%x) = %d bytes, want %d", tc.data, len(got), tc.want)
		}
	}
}

func TestFirstViolation(t *testing.T) {
	get := []byte{0x02, 1, 0, 0, 0, 0, 0, 0, 0, 'k'} // GET "k"
	probe := []byte{0x03, 0x00, 0x00, 0x0b, 0x06, 0xe0, 0x00, 0x00, 0x00, 0x00, 0x00}
	for _, tc := range []struct {
		name string
		cfg  Config
		data []byte
		rule Rule // "" for none
	}{
		{"nothing", exact(G0), nil, ""},
		{"a valid message", exact(G0), get, ""},
		{"a message cut short", exact(G0), get[:4], ""},
		{"then an unknown opcode", exact(G0), append(append([]byte{}, get...), 0xff), RuleUnknownOpcode},
		{"nmap TerminalServer as G0", exact(G0), probe, RuleKeyTooLong},
		{"nmap TerminalServer, auto reading it as G0", auto(G0), probe, RuleKeyTooLong},
		{"nmap TerminalServer in G2", exact(G2), probe, RuleValidateMissing},
	} {
		v := FirstViolation(tc.cfg, tc.data)
		switch {
		case tc.rule == "" && v != nil:
			t.Errorf("%s: %v, want none", tc.name, v)
		case tc.rule != "" && (v == nil || v.Rule != tc.rule):
			t.Errorf("%s: %v, want %s", tc.name, v, tc.rule)
		}
	}
}
