package policy

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// checkPickle applies the pickle rule to a value written on any key: read raw and as base64, as a
// reader may load it, a pickle may import and call only what the allow-list holds (allow.go), and
// never what the deny list names. A global imported before a malformed byte counts: the unpickler
// imports (and calls) as it reads, and raises only when it reaches the bad byte.
func (p *Policy) checkPickle(v *fieldView) (Finding, bool) {
	if p.cfg.PickleGlobals == Off || !v.hasValue() || v.val.Len == 0 || v.pickleJudged {
		return Finding{}, false
	}
	why, kind := p.pickleUnsafe(v.va, v.vb, v.pickleAllow)
	if why != "" {
		return p.refuse(v, why)
	}
	v.pickleKind = kind
	return Finding{}, false
}

// PickleKind says how a value is a complete pickle: raw, as base64, both, or neither (0).
type PickleKind uint8

const (
	PickleRaw PickleKind = 1 << iota
	PickleBase64
)

// pickleWrite is a value written that is a complete pickle, which passed.
type pickleWrite struct {
	key  []byte // valid while the message is
	kind PickleKind
}

// pickleUnsafe says why a reader may not load a+b as a pickle, raw or base64, "" when it may, and
// how the value is a complete pickle.
func (p *Policy) pickleUnsafe(a, b []byte, extra *globalAllow) (why string, kind PickleKind) {
	r := pickle.Scan(a, b, p.cfg.Pickle)
	if why := p.unsafe(&r, extra, false); why != "" {
		return "pickle " + why, 0
	}
	if why := p.loadedBytes(&r, protocol.Split{A: a, B: b}, extra); why != "" {
		return "pickle " + why, 0
	}
	if r.Complete {
		kind |= PickleRaw
	}
	r, ok := pickle.ScanBase64(a, b, p.cfg.Pickle)
	if !ok {
		return "", kind
	}
	if why := p.unsafe(&r, extra, false); why != "" {
		return "base64 pickle " + why, 0
	}
	if r.Complete {
		kind |= PickleBase64
	}
	if loadsBytes(&r) {
		// Its literals lie in the decoded bytes: decode it whole (a tensor broadcast as base64:
		// rare, and the value is within the limits) and read them there.
		raw, ok := pickle.DecodeBase64(a, b)
		if !ok {
			return "base64 pickle loads bytes with " + bytesLoader + " and does not decode", 0
		}
		if why := p.loadedBytes(&r, protocol.Split{B: raw}, extra); why != "" {
			return "base64 pickle " + why, 0
		}
	}
	return "", kind
}

// bytesLoader is how torch pickles a tensor's storage: torch.storage._load_from_bytes(b) runs
// torch.load(b, weights_only=False) on a torch.save stream embedded in the pickle, which is a
// pickle (or a zip of them) of its own: torch's tensors need it, and an attacker's pickle could
// hide in it.
const bytesLoader = "torch.storage._load_from_bytes"

func loadsBytes(r *pickle.Report) bool {
	for _, g := range r.Globals {
		if g.Resolved && g.Module+"."+g.Name == bytesLoader {
			return true
		}
	}
	return false
}

// maxEmbedded is how many pickles torch.load reads from a legacy torch.save stream (torch
// serialization.py _legacy_load): the magic number, the protocol version, the system info, the
// object, the storage keys; raw storage data follows.
const maxEmbedded = 5

// loadedBytes says why what a pickle that calls torch.storage._load_from_bytes would load may not
// be loaded, "" when it may: each of its bytes literals is read as torch.load(weights_only=False)
// reads a legacy torch.save stream (pickles one after another, from its start), each judged as the
// pickle itself is, persistent ids allowed (the stream's storages); so is each str literal of a
// pickle that makes bytes with _codecs.encode(s, "latin1") (protocols 0 to 2), read as latin-1. A
// zip or tar archive (torch.load's other formats, TorchScript among them), a loader inside a
// loader, bytes made from what is no literal (bytearray or bytes of a list of ints), or a codec
// named beside _codecs.encode other than latin-1 are refused: the guard would not read what loads.
func (p *Policy) loadedBytes(r *pickle.Report, value protocol.Split, extra *globalAllow) string {
	if !loadsBytes(r) {
		return ""
	}
	if r.BytesTruncated {
		return fmt.Sprintf("loads bytes with %s from more than %d literals", bytesLoader, len(r.Bytes))
	}
	latin1 := false
	for _, g := range r.Globals {
		switch name := g.Module + "." + g.Name; {
		case g.Resolved && bytesMakers[name]:
			return "loads bytes with " + bytesLoader + " and makes bytes with " + globalName(g) +
				": what it loads may not be a literal the guard can read"
		case g.Resolved && name == latin1Maker:
			latin1 = true
		}
	}
	for _, sp := range r.Bytes {
		x, y := value.Parts(uint64(sp.Off), uint64(sp.Len))
		if why := p.loadedStream(protocol.Split{A: x, B: y}, extra); why != "" {
			return why
		}
	}
	if !latin1 {
		return ""
	}
	if r.StrsTruncated {
		return fmt.Sprintf("loads bytes with %s from more than %d str literals", bytesLoader, len(r.Strs))
	}
	for _, sp := range r.Strs {
		x, y := value.Parts(uint64(sp.Off), uint64(sp.Len))
		b, ok := pickle.Latin1(append(append(make([]byte, 0, sp.Len), x...), y...), sp.Text)
		if !ok {
			continue // _codecs.encode would raise: nothing is loaded from it
		}
		if isOtherCodec(b) {
			// Python writes _codecs.encode(s, "latin1"); another codec's bytes are not the ones read here.
			return "loads bytes with " + bytesLoader + " and names the codec " + protocol.ShowKey(b) +
				" beside " + latin1Maker + ": what it loads is not the latin-1 bytes the guard reads"
		}
		if why := p.loadedStream(protocol.Split{B: b}, extra); why != "" {
			return why
		}
	}
	return ""
}

// loadedStream says why torch.load may not read s, one bytes object a pickle hands to
// _load_from_bytes, "" when it may.
func (p *Policy) loadedStream(s protocol.Split, extra *globalAllow) string {
	n := int(s.Len())
	x, y := s.Parts(0, uint64(min(n, tarBlock)))
	head := append(append(make([]byte, 0, tarBlock), x...), y...)
	if bytes.HasPrefix(head, []byte("PK\x03\x04")) {
		return "loads a zip archive with " + bytesLoader + ": not inspected"
	}
	if isTar(head) {
		return "loads a tar archive with " + bytesLoader + ": not inspected"
	}
	for off, k := 0, 0; off < n && k < maxEmbedded; k++ {
		x, y := s.Parts(uint64(off), uint64(n-off))
		in := pickle.Scan(x, y, p.cfg.Pickle)
		if why := p.unsafe(&in, extra, true); why != "" {
			return "loads with " + bytesLoader + " a pickle that " + why
		}
		if loadsBytes(&in) {
			return "nests " + bytesLoader + " in what it loads"
		}
		if !in.Complete || in.End == 0 {
			break
		}
		off += in.End
	}
	return ""
}

// tarBlock is a tar header's size.
const tarBlock = 512

// isTar reports whether b starts with a tar header whose checksum holds: what tarfile.open, which
// torch.load tries first on a legacy stream, would read (a V7 header has no magic).
func isTar(b []byte) bool {
	if len(b) < tarBlock {
		return false
	}
	field := bytes.TrimRight(bytes.TrimLeft(b[148:156], " "), " \x00")
	want, err := strconv.ParseInt(string(field), 8, 64)
	if err != nil || len(field) == 0 {
		return false
	}
	var unsigned, signed int64
	for i, c := range b[:tarBlock] {
		if i >= 148 && i < 156 {
			c = ' '
		}
		unsigned += int64(c)
		signed += int64(int8(c))
	}
	return want == unsigned || want == signed
}

func (p *Policy) refuse(v *fieldView, detail string) (Finding, bool) {
	return Finding{Rule: protocol.RulePickleGlobalDenied, Field: v.val, Key: protocol.ShowKey(v.key),
		Detail: detail, Mode: p.cfg.PickleGlobals}, true
}
