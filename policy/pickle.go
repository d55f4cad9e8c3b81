package policy

import (
	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// checkPickle applies the pickle globals rule to a value written on any key: read raw and as
// base64, a pickle may import no denied global. A global imported before a malformed byte counts:
// the unpickler imports (and calls) as it reads, and raises only when it reaches the bad byte.
func (p *Policy) checkPickle(v *fieldView) (Finding, bool) {
	if p.cfg.PickleGlobals == Off || !v.hasValue() || v.val.Len == 0 || v.pickleAllowed {
		return Finding{}, false
	}
	r := pickle.Scan(v.va, v.vb, p.cfg.Pickle)
	if f, hit := p.deniedIn(v, &r, "pickle"); hit {
		return f, true
	}
	if r, ok := pickle.ScanBase64(v.va, v.vb, p.cfg.Pickle); ok {
		return p.deniedIn(v, &r, "base64 pickle")
	}
	return Finding{}, false
}

// deniedIn reports the first denied global of r.
func (p *Policy) deniedIn(v *fieldView, r *pickle.Report, what string) (Finding, bool) {
	for _, g := range r.Globals {
		if p.deny.denied(g) {
			return Finding{Rule: protocol.RulePickleGlobalDenied, Field: v.val, Key: protocol.ShowKey(v.key),
				Detail: what + " imports " + globalName(g), Mode: p.cfg.PickleGlobals}, true
		}
	}
	return Finding{}, false
}
