package policy

import (
	"bytes"
	"strings"

	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// torchrun's c10d rendezvous backend keeps the whole rendezvous state under one key,
// "torch.rendezvous." + run_id (the TCPStore client sends it with a leading "/"), as base64 of a
// pickle that every agent loads on every sync and keep-alive (c10d_rendezvous_backend.py,
// dynamic_rendezvous.py _BackendRendezvousStateHolder.sync). The round's own keys live under
// "torch.rendezvous.<run_id>.<round>/", so the state key is the one with no "/" after the prefix.
const rendezvousPrefix = "torch.rendezvous."

// rendezvousSentinel is the backend's "no state yet" value (C10dRendezvousBackend._NULL_SENTINEL):
// the COMPARE_SET that creates the key writes it.
var rendezvousSentinel = []byte("Y2FuaW1hZGFt")

// stateGlobals are the globals a real state pickle imports, torch 2.0.1 to 2.15 alike (pickle
// protocol 4 and 5): the state and node classes, and datetime for the heartbeats. From 2.6 the
// heartbeats and deadline are datetime.now(timezone.utc): timezone.utc pickles as
// datetime.timezone(datetime.timedelta(0)).
var stateGlobals = map[string]bool{
	"torch.distributed.elastic.rendezvous.dynamic_rendezvous._RendezvousState": true,
	"torch.distributed.elastic.rendezvous.dynamic_rendezvous._NodeDesc":        true,
	"datetime.datetime":  true,
	"datetime.timezone":  true,
	"datetime.timedelta": true,
}

// stateClass is what a state pickle builds first, and returns.
const stateClass = "torch.distributed.elastic.rendezvous.dynamic_rendezvous._RendezvousState"

// builds reports whether r calls (NEWOBJ, REDUCE) the global at index g.
func builds(r *pickle.Report, g int) bool {
	for _, c := range r.Calls {
		if c.Callee == g && (c.Op == "NEWOBJ" || c.Op == "REDUCE") {
			return true
		}
	}
	return false
}

// isRendezvousStateKey reports whether key is a torchrun rendezvous state key.
func isRendezvousStateKey(key []byte) bool {
	_, ok := stateRun(key)
	return ok
}

// stateRun is the run id of a rendezvous state key, "torch.rendezvous.<run_id>" with or without
// the client's "/"; ok false for any other key.
func stateRun(key []byte) (run []byte, ok bool) {
	run, ok = bytes.CutPrefix(bytes.TrimPrefix(key, []byte("/")), []byte(rendezvousPrefix))
	return run, ok && len(run) > 0 && bytes.IndexByte(run, '/') < 0
}

// checkRendezvous applies the rendezvous state rule to one write.
func (p *Policy) checkRendezvous(v *fieldView) (Finding, bool) {
	if p.cfg.RendezvousState == Off || v.key == nil || !isRendezvousStateKey(v.key) {
		return Finding{}, false
	}
	fail := func(detail string) (Finding, bool) {
		return Finding{Rule: protocol.RuleRendezvousStateInvalid, Field: v.val, Key: protocol.ShowKey(v.key),
			Detail: detail, Mode: p.cfg.RendezvousState}, true
	}
	switch v.op {
	case protocol.OpAppend:
		f, _ := fail("APPEND to the rendezvous state splices bytes into its pickle")
		f.Field = v.keyField
		return f, true
	case protocol.OpSet, protocol.OpCompareSet, protocol.OpMultiSet, protocol.OpQueuePush:
	default:
		return Finding{}, false
	}
	if !v.hasValue() {
		return Finding{}, false
	}
	if equal2(v.va, v.vb, rendezvousSentinel) {
		v.pickleJudged = true
		return Finding{}, false
	}
	if !isStrictBase64(v.va) || !isStrictBase64(v.vb) {
		return fail("not base64: torch writes base64(pickle) or its sentinel")
	}
	lim := p.cfg.Pickle
	lim.MaxGlobals = stateCalls
	r, ok := pickle.ScanBase64(v.va, v.vb, lim)
	if !ok {
		return fail("base64 that does not decode")
	}
	for _, g := range r.Globals {
		if !g.Resolved || !stateGlobals[g.Module+"."+g.Name] {
			return fail("imports " + globalName(g) + ": not a torch rendezvous state")
		}
	}
	if len(r.Globals) == 0 || r.Globals[0].Module+"."+r.Globals[0].Name != stateClass || !builds(&r, 0) {
		return fail("not a torch rendezvous state: it does not build a " + stateClass)
	}
	if why := stateCallsWrong(&r); why != "" {
		return fail(why + ": not a torch rendezvous state")
	}
	switch {
	case r.Truncated, r.Ext, r.Persistent:
		return fail("a pickle torch's state never is (extension codes, persistent ids or too many globals)")
	case !r.Complete:
		detail := "not a complete pickle"
		if r.Err != nil {
			detail += ": " + r.Err.Error()
		}
		return fail(detail)
	}
	// An allow-list of torch's own globals judged it; as raw bytes, strict base64 imports nothing
	// (GLOBAL and INST need a newline, STACK_GLOBAL is 0x93): the deny list has nothing to add.
	v.pickleJudged, v.statePickle = true, true
	return Finding{}, false
}

// stateCalls bounds the globals and calls recorded of a state pickle: torch's makes about four a
// node (NEWOBJ and BUILD of its _NodeDesc, its heartbeat's datetime), so this covers a rendezvous
// of 30,000 nodes; a larger one is refused (Truncated).
const stateCalls = 1 << 17

// stateCallsWrong says which call of r torch's state never makes, "" when none: NEWOBJ and BUILD
// of the state classes, REDUCE of the datetime types, nothing else (a BUILD of a global itself
// would set the class's attributes; a call on an object that is not a plain container runs its
// methods).
func stateCallsWrong(r *pickle.Report) string {
	name := func(i int) string {
		if i < 0 || i >= len(r.Globals) {
			return ""
		}
		return r.Globals[i].Module + "." + r.Globals[i].Name
	}
	for _, c := range r.Calls {
		callee := name(c.Callee)
		ok := false
		switch c.Op {
		case "NEWOBJ", "BUILD":
			ok = strings.HasPrefix(callee, "torch.distributed.elastic.rendezvous.dynamic_rendezvous.")
		case "REDUCE":
			ok = strings.HasPrefix(callee, "datetime.")
		}
		if !ok {
			if callee == "" {
				callee = "an object that is no global"
			}
			return c.Op + " of " + protocol.ShowKey([]byte(callee))
		}
	}
	return ""
}

// equal2 reports whether a then b is want.
func equal2(a, b, want []byte) bool {
	return len(a)+len(b) == len(want) && bytes.Equal(a, want[:len(a)]) && bytes.Equal(b, want[len(a):])
}

// isStrictBase64 reports whether p holds only the standard base64 alphabet and '=' (torch's own
// b64encode output); the padding's place is left to the decoder.
func isStrictBase64(p []byte) bool {
	for _, c := range p {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=') {
			return false
		}
	}
	return true
}
