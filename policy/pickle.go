package policy

import (
	"errors"
	"fmt"

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

// deniedIn reports the first denied global of r, or a pickle whose globals the scan could not
// all see: one past the scanner's bounds (whatever follows is unknown, so it is refused).
func (p *Policy) deniedIn(v *fieldView, r *pickle.Report, what string) (Finding, bool) {
	deny := func(detail string) (Finding, bool) {
		return Finding{Rule: protocol.RulePickleGlobalDenied, Field: v.val, Key: protocol.ShowKey(v.key),
			Detail: what + " " + detail, Mode: p.cfg.PickleGlobals}, true
	}
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
