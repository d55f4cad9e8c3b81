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

// runAgents are the names of a run's agents: "ip:" and a source address, "id:" and a proven
// identity. full: a name was not kept (Written.maxAgents), and nothing is known of who is not one.
type runAgents struct {
	names map[string]struct{}
	full  bool
}

// namesOf are the names a writer goes by: its address and, when a handshake proved one, its
// identity.
func namesOf(src netip.Addr, identity string) []string {
	if identity == "" {
		return []string{"ip:" + src.String()}
	}
	return []string{"ip:" + src.String(), "id:" + identity}
}

// joined remembers that src (identity) wrote run's rendezvous state through the guard.
func (w *Written) joined(run []byte, src netip.Addr, identity string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ra, ok := w.runs.get(string(run))
	if !ok {
		ra = &runAgents{names: map[string]struct{}{}}
		if old, evicted := w.runs.put(string(run), ra); evicted {
			w.agents -= len(old.names)
		}
	}
	for _, n := range namesOf(src, identity) {
		if _, ok := ra.names[n]; ok {
			continue
		}
		if w.agents >= w.maxAgents {
			ra.full = true
			continue
		}
		ra.names[n] = struct{}{}
		w.agents++
	}
}

// agent reports whether the guard knows run's agents, and whether src (identity) is one of them.
func (w *Written) agent(run []byte, src netip.Addr, identity string) (known, isAgent bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ra, ok := w.runs.get(string(run))
	if !ok || ra.full {
		return false, false
	}
	for _, n := range namesOf(src, identity) {
		if _, ok := ra.names[n]; ok {
			return true, true
		}
	}
	return true, false
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
	known, isAgent := p.written.agent(run, m.Src, m.Identity)
	switch {
	case isAgent:
		return ""
	case known:
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
