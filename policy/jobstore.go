package policy

import (
	"bytes"
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
	Round string // the round's key prefix, as protocol.ShowKey shows it: "torch.rendezvous.<run_id>.<round>"
	Addr  string // the round's MASTER_ADDR as ShowKey shows it, "" when it was not written through this guard
	Port  uint16
}

// JobStores is told of each round's store by the messages that pass the policy (a blocked write
// wrote nothing), and remembers each round's MASTER_ADDR until its MASTER_PORT comes. One for a
// server, shared by its streams; it remembers a bounded number of rounds, the oldest forgotten first.
type JobStores struct {
	// Notify is called with each round's store and the message that wrote its port, on the
	// goroutine judging that message: it must not wait.
	Notify func(JobStore, Message)

	mu    sync.Mutex
	addrs map[string]string // round -> MASTER_ADDR
	ring  []string
	next  int
}

// NewJobStores remembers the MASTER_ADDR of at most n rounds.
func NewJobStores(n int, notify func(JobStore, Message)) *JobStores {
	return &JobStores{Notify: notify, addrs: make(map[string]string), ring: make([]string, max(n, 1))}
}

func (j *JobStores) setAddr(round, addr string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.addrs[round]; !ok {
		if old := j.ring[j.next]; old != "" {
			delete(j.addrs, old)
		}
		j.ring[j.next] = round
		j.next = (j.next + 1) % len(j.ring)
	}
	j.addrs[round] = addr
}

func (j *JobStores) addr(round string) string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.addrs[round]
}

// jobStoreWrite is one write of a round's MASTER_ADDR or MASTER_PORT, seen in a message.
type jobStoreWrite struct {
	round string
	port  bool // MASTER_PORT; else MASTER_ADDR
	value []byte
}

var (
	roundPrefix = []byte("torch.rendezvous.")
	addrSuffix  = []byte("/MASTER_ADDR")
	portSuffix  = []byte("/MASTER_PORT")
)

// noteJobStore appends v to ws if it writes a round's MASTER_ADDR or MASTER_PORT with a value.
// MASTER_PORT's value must be a port in decimal: anything else names no store.
func noteJobStore(v *fieldView, ws []jobStoreWrite) []jobStoreWrite {
	if !v.hasValue() || v.val.Len > 255 {
		return ws
	}
	switch v.op {
	case protocol.OpSet, protocol.OpCompareSet, protocol.OpMultiSet:
	default:
		return ws
	}
	bare := bytes.TrimPrefix(v.key, []byte("/"))
	var w jobStoreWrite
	switch {
	case bytes.HasSuffix(bare, portSuffix):
		w.port = true
		bare = bare[:len(bare)-len(portSuffix)]
	case bytes.HasSuffix(bare, addrSuffix):
		bare = bare[:len(bare)-len(addrSuffix)]
	default:
		return ws
	}
	// The round's prefix has no "/" of its own (dynamic_rendezvous.py _get_store).
	if !bytes.HasPrefix(bare, roundPrefix) || bytes.IndexByte(bare, '/') >= 0 {
		return ws
	}
	w.round = protocol.ShowKey(bare)
	w.value = append(append([]byte(nil), v.va...), v.vb...)
	return append(ws, w)
}

// tell gives j the writes of a message that passed.
func (j *JobStores) tell(ws []jobStoreWrite, m Message) {
	for _, w := range ws {
		if !w.port {
			j.setAddr(w.round, protocol.ShowKey(w.value))
			continue
		}
		port, err := strconv.ParseUint(string(w.value), 10, 16)
		if err != nil || port == 0 {
			continue
		}
		if j.Notify != nil {
			j.Notify(JobStore{Round: w.round, Addr: j.addr(w.round), Port: uint16(port)}, m)
		}
	}
}
