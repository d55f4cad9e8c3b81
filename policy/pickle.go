package policy

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// checkPickle applies the pickle globals rule to a value written on any key: read raw and as
// base64, a pickle may import no denied global. A global imported before a malformed byte counts:
// the unpickler imports (and calls) as it reads, and raises only when it reaches the bad byte.
func (p *Policy) checkPickle(v *fieldView) (Finding, bool) {
	if p.cfg.PickleGlobals == Off || !v.hasValue() || v.val.Len == 0 || v.pickleJudged {
		return Finding{}, false
	}
	r := pickle.Scan(v.va, v.vb, p.cfg.Pickle)
	if f, hit := p.deniedIn(v, &r, "pickle"); hit {
		return f, true
	}
	if f, hit := p.loadedBytes(v, &r, protocol.Split{A: v.va, B: v.vb}, "pickle"); hit {
		return f, true
	}
	if r, ok := pickle.ScanBase64(v.va, v.vb, p.cfg.Pickle); ok {
		if f, hit := p.deniedIn(v, &r, "base64 pickle"); hit {
			return f, true
		}
		if loadsBytes(&r) {
			// Its literals lie in the decoded bytes: decode it whole (a tensor broadcast as base64:
			// rare, and the value is within the limits) and read them there.
			raw, ok := pickle.DecodeBase64(v.va, v.vb)
			if !ok {
				return p.refuse(v, "base64 pickle", "loads bytes with "+bytesLoader+" and does not decode")
			}
			return p.loadedBytes(v, &r, protocol.Split{B: raw}, "base64 pickle")
		}
	}
	return Finding{}, false
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

// maxEmbedded bounds the pickles read from one embedded torch.save stream: the legacy format holds
// five (magic number, protocol version, system info, the object, the storage keys), then raw data.
const maxEmbedded = 8

// loadedBytes inspects what a raw pickle that calls torch.storage._load_from_bytes would load: each
// of its bytes literals, read as torch.load reads a legacy torch.save stream (pickles one after
// another, from its start). A zip (torch.save's newer format, whose records may be compressed) or
// a loader inside a loader is refused: torch pickles its storages in the legacy format.
func (p *Policy) loadedBytes(v *fieldView, r *pickle.Report, value protocol.Split, what string) (Finding, bool) {
	if !loadsBytes(r) {
		return Finding{}, false
	}
	if r.BytesTruncated {
		return p.refuse(v, what, fmt.Sprintf("loads bytes with %s from more than %d literals", bytesLoader, len(r.Bytes)))
	}
	for _, sp := range r.Bytes {
		for off, n := 0, 0; off < sp.Len && n < maxEmbedded; n++ {
			x, y := value.Parts(uint64(sp.Off+off), uint64(sp.Len-off))
			if n == 0 && bytes.HasPrefix(append(x[:min(len(x), 4):min(len(x), 4)], y[:min(len(y), 4)]...), []byte("PK\x03\x04")) {
				return p.refuse(v, what, "loads a zip archive with "+bytesLoader+": not inspected")
			}
			in := pickle.Scan(x, y, p.cfg.Pickle)
			if f, hit := p.deniedIn(v, &in, what+" loaded by "+bytesLoader); hit {
				return f, true
			}
			if loadsBytes(&in) {
				return p.refuse(v, what, "nests "+bytesLoader+" in what it loads")
			}
			if !in.Complete || in.End == 0 {
				break
			}
			off += in.End
		}
	}
	return Finding{}, false
}

func (p *Policy) refuse(v *fieldView, what, detail string) (Finding, bool) {
	return Finding{Rule: protocol.RulePickleGlobalDenied, Field: v.val, Key: protocol.ShowKey(v.key),
		Detail: what + " " + detail, Mode: p.cfg.PickleGlobals}, true
}

// deniedIn reports the first denied global of r, or a pickle whose globals the scan could not
// all see: one past the scanner's bounds (whatever follows is unknown, so it is refused).
func (p *Policy) deniedIn(v *fieldView, r *pickle.Report, what string) (Finding, bool) {
	deny := func(detail string) (Finding, bool) { return p.refuse(v, what, detail) }
	for _, g := range r.Globals {
		if p.deny.denied(g) {
			return deny("imports " + globalName(g))
		}
	}
	switch {
	case len(r.Globals) >= p.cfg.Pickle.MaxGlobals && p.cfg.Pickle.MaxGlobals > 0:
		return deny(fmt.Sprintf("imports more than %d globals: the rest unseen", p.cfg.Pickle.MaxGlobals))
	case errors.Is(r.Err, pickle.ErrLimit):
		return deny("past the scanner's bounds: " + r.Err.Error())
	}
	return Finding{}, false
}
