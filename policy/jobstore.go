package policy

import (
	"bytes"
	"net/netip"
	"strconv"
	"sync"

	"github.com/storeguard/storeguard/protocol"
)

// JobStore is the store a rendezvous round sends its ranks to, as group rank 0's agent writes it
// under the round's prefix (rendezvous/api.py RendezvousStoreInfo.build): MASTER_ADDR, then
// MASTER_PORT. With torchrun's c10d rendezvous it is never the rendezvous endpoint: torch 2.6 and
// later have the rank-0 agent start a TCPStore of its own on a free port (dynamic_rendezvous.py
// next_rendezvous, _create_tcp_store_server), earlier releases (and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
// have worker rank 0 start one on a free port. The ranks' own traffic, the NCCL unique id
// included, goes there and not through the guard that saw the rendezvous.
type JobStore struct {
	Round    string // the round's key prefix, as protocol.ShowKey shows it: "torch.rendezvous.<run_id>.<round>"
	Addr     string // the round's MASTER_ADDR as ShowKey shows it, "" when not known
	Port     uint16
	Src      netip.Addr // who wrote the port through the guard, or read it (JobStores.Asked)
	Identity string     // its TLS identity, "" for plaintext
}

// JobStores is told of each round's store by the messages that pass the policy (a blocked write
// wrote nothing), and remembers each round's MASTER_ADDR until its MASTER_PORT comes. One for a
// server, shared by its streams; it remembers a bounded number of rounds, the oldest forgotten first.
type JobStores struct {
	// Notify is called with each round's store as a message through the guard writes its port,
	// on the goroutine judging that message: it must not wait.
	Notify func(JobStore)
	// Asked, if set, is called once for each round whose MASTER_PORT a message reads before any
	// message through the guard wrote it (rank 0 wrote it past the guard: in a transparent sidecar,
	// the master host's own agent), with the key as the wire has it (a copy) and the reader in
	// JobStore.Src: the caller may ask the store. Called on the judging goroutine: it must not wait.
	Asked func(key []byte, js JobStore)

	mu     sync.Mutex
	rounds recent[string, *round]
}

type round struct {
	addr        string
	told, asked bool
}

// NewJobStores remembers at most n rounds.
func NewJobStores(n int, notify func(JobStore)) *JobStores {
	return &JobStores{Notify: notify, rounds: newRecent[string, *round](n)}
}

// roundLocked returns the round named r, remembered from now on if it was not.
func (j *JobStores) roundLocked(r string) *round {
	x, ok := j.rounds.get(r)
	if !ok {
		x = &round{}
		j.rounds.put(r, x)
	}
	return x
}

// Addr returns the MASTER_ADDR written through the guard for the round, "" if none was.
func (j *JobStores) Addr(r string) string {
	j.mu.Lock()
	defer j.mu.Unlock()
	if x, ok := j.rounds.get(r); ok {
		return x.addr
	}
	return ""
}

// AddrKey is the key of the MASTER_ADDR of the round whose MASTER_PORT is portKey, as the wire has
// them: what a caller asked (Asked) looks up beside the port.
func AddrKey(portKey []byte) []byte {
	return append(bytes.TrimSuffix(bytes.Clone(portKey), portSuffix[1:]), addrSuffix[1:]...)
}

// jobStoreKey is one message's use of a round's MASTER_ADDR or MASTER_PORT.
type jobStoreKey struct {
	round string
	port  bool   // MASTER_PORT; else MASTER_ADDR
	value []byte // what a write writes; nil for a read
	key   []byte // a read's key, as the wire has it
}

var (
	roundPrefix = []byte("torch.rendezvous.")
	addrSuffix  = []byte("/MASTER_ADDR")
	portSuffix  = []byte("/MASTER_PORT")
)

// noteJobStore appends v to ks if it writes a round's MASTER_ADDR or MASTER_PORT with a value,
// or reads its MASTER_PORT.
func noteJobStore(v *fieldView, ks []jobStoreKey) []jobStoreKey {
	write := false
	switch v.op {
	case protocol.OpSet, protocol.OpCompareSet, protocol.OpMultiSet:
		write = v.hasValue() && v.val.Len <= 255
	case protocol.OpGet, protocol.OpMultiGet, protocol.OpCheck, protocol.OpWait:
	default:
		return ks
	}
	bare := bytes.TrimPrefix(v.key, []byte("/"))
	var k jobStoreKey
	switch {
	case bytes.HasSuffix(bare, portSuffix):
		k.port = true
		bare = bare[:len(bare)-len(portSuffix)]
	case bytes.HasSuffix(bare, addrSuffix) && write:
		bare = bare[:len(bare)-len(addrSuffix)]
	default:
		return ks
	}
	// The round's prefix has no "/" of its own (dynamic_rendezvous.py _get_store).
	if !bytes.HasPrefix(bare, roundPrefix) || bytes.IndexByte(bare, '/') >= 0 {
		return ks
	}
	k.round = protocol.ShowKey(bare)
	if write {
		k.value = append(append([]byte{}, v.va...), v.vb...)
	} else if v.val.Kind == protocol.FieldNone {
		k.key = append([]byte(nil), v.key...)
	} else {
		return ks // a write of a value too long to be a port
	}
	return append(ks, k)
}

// tell gives j what a message that passed did with the rounds' keys.
func (j *JobStores) tell(ks []jobStoreKey, m Message) {
	for _, k := range ks {
		js := JobStore{Round: k.round, Src: m.Src, Identity: m.Identity}
		j.mu.Lock()
		r := j.roundLocked(k.round)
		switch {
		case !k.port:
			r.addr = protocol.ShowKey(k.value)
			j.mu.Unlock()
			continue
		case k.key != nil: // a read
			ask := !r.told && !r.asked
			r.asked = true
			j.mu.Unlock()
			if ask && j.Asked != nil {
				j.Asked(k.key, js)
			}
			continue
		}
		port, ok := ParsePort(k.value)
		if ok {
			r.told = true
		}
		js.Addr = r.addr
		j.mu.Unlock()
		if ok && j.Notify != nil {
			js.Port = port
			j.Notify(js)
		}
	}
}

// Told reports whether the round's store was told (Notify) already, and marks it told: the caller
// that asked the store (Asked) tells it once.
func (j *JobStores) Told(r string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	x := j.roundLocked(r)
	told := x.told
	x.told = true
	return told
}

// ParsePort reads a MASTER_PORT value: a port in decimal, not 0.
func ParsePort(b []byte) (uint16, bool) {
	n, err := strconv.ParseUint(string(b), 10, 16)
	return uint16(n), err == nil && n != 0
}
