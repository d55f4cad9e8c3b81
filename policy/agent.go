package policy

import (
	"bytes"
	"net/netip"

	"github.com/storeguard/storeguard/protocol"
)

// Who may write a rendezvous round's keys.
//
// torchrun's c10d rendezvous writes a round's keys ("torch.rendezvous.<run_id>.<round>/...":
// MASTER_ADDR, MASTER_PORT, torchelastic/assigned_ranks/*, role_info/*) from its agents only, and
// an agent joins the rendezvous, a COMPARE_SET of the run's state ("torch.rendezvous.<run_id>"), before
// it writes any of them (dynamic_rendezvous.py: the join, then RendezvousStoreInfo.build and
// _assign_worker_ranks on the same store). The write-once rule protects a round's key from its
// second writer; so an intruder that wrote first made the rule refuse the agent's own write, and
// torchrun died (without the guard the agent overwrites it and the job runs). A write to a round's
// key is therefore refused unless its writer (its address, or the identity its TLS handshake
// proved) wrote the run's state through the guard; when no state of the run came through the guard
// (the agents write past it, or the guard started since), unless the store holds the run's state
// (torch never writes a round's key before the rendezvous began). The intruder's early write is
// what is refused, and named; the agent's write is the first.
//
// Left: an intruder that itself writes a state pickle of the run through the guard counts as an
// agent (telling which agent is group rank 0 needs the state decoded: its participants are host
// names, not addresses); an agent that writes past the guard (the master host's own, in a
// transparent sidecar) is not seen, and the guard then asks the store as before.

// agent is one writer of a run's state: "ip:" and the source address, or "id:" and an identity.
type agent struct {
	run, who string
}

// agentsOf are the names m's writer goes by: its address and, when a handshake proved one, its
// identity.
func agentsOf(run string, src netip.Addr, identity string) []agent {
	a := []agent{{run, "ip:" + src.String()}}
	if identity != "" {
		a = append(a, agent{run, "id:" + identity})
	}
	return a
}

// joined remembers that src (identity) wrote run's rendezvous state through the guard.
func (w *Written) joined(run []byte, src netip.Addr, identity string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.runs.put(string(run), struct{}{})
	for _, a := range agentsOf(string(run), src, identity) {
		w.agents.put(a, struct{}{})
	}
}

// agent reports whether the guard saw run's state written, and whether src (identity) wrote it.
func (w *Written) agent(run []byte, src netip.Addr, identity string) (runSeen, isAgent bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, runSeen = w.runs.get(string(run)); !runSeen {
		return false, false
	}
	for _, a := range agentsOf(string(run), src, identity) {
		if _, ok := w.agents.get(a); ok {
			return true, true
		}
	}
	return true, false
}

// stateRun is the run id of a rendezvous state key (isRendezvousStateKey).
func stateRun(key []byte) []byte {
	return bytes.TrimPrefix(bytes.TrimPrefix(key, []byte("/")), []byte(rendezvousPrefix))
}

// roundRun returns the run id of a key under a round's prefix, "torch.rendezvous.<run_id>.<round>/
// ...", and the key's leading "/" if it has one (the TCPStore client's).
func roundRun(key []byte) (run, lead []byte, ok bool) {
	bare := bytes.TrimPrefix(key, []byte("/"))
	rest, ok := bytes.CutPrefix(bare, []byte(rendezvousPrefix))
	slash := bytes.IndexByte(rest, '/')
	if !ok || slash < 0 {
		return nil, nil, false
	}
	dot := bytes.LastIndexByte(rest[:slash], '.')
	if dot <= 0 || dot == slash-1 {
		return nil, nil, false
	}
	for _, c := range rest[dot+1 : slash] {
		if c < '0' || c > '9' {
			return nil, nil, false
		}
	}
	return rest[:dot], key[:len(key)-len(bare)], true
}

// notAnAgent says why m may not write key, a key of a rendezvous round, "" when it may: it is not
// such a key, its writer joined the run's rendezvous through the guard, or nothing is known either
// way (no state of the run came through the guard, and the store holds one or cannot be asked).
func (p *Policy) notAnAgent(key []byte, m *Message) string {
	run, lead, ok := roundRun(key)
	if !ok {
		return ""
	}
	runSeen, isAgent := p.written.agent(run, m.Src, m.Identity)
	switch {
	case isAgent:
		return ""
	case runSeen:
		who := m.Src.String()
		if m.Identity != "" {
			who = m.Identity + " at " + who
		}
		return "by " + who + ", which has not joined run " + protocol.ShowKey(run) + "'s rendezvous: torch's agents write its state before a round's keys"
	case p.lookup == nil:
		return ""
	}
	state := append(append(bytes.Clone(lead), rendezvousPrefix...), run...)
	if exists, err := p.lookup(state); err == nil && !exists {
		return "before run " + protocol.ShowKey(run) + "'s rendezvous began: the store holds no state of it"
	}
	return ""
}
