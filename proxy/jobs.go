package proxy

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
)

// jobStoreRounds bounds the rendezvous rounds remembered (policy.JobStores); jobAsksQueued the
// questions about them that wait for the store (more are dropped: a client that reads the
// MASTER_PORT of made-up rounds costs the store one CHECK each at most).
const jobStoreRounds, jobAsksQueued = 256, 16

// jobWatch learns where each rendezvous round sends its ranks, and says so when no guard here
// fronts that store: policy.JobStores tells it of the rounds whose MASTER_PORT a message wrote
// through the guard, and of those a client read (ask), which its loop asks the store about.
type jobWatch struct {
	rounds    *policy.JobStores
	asks      chan jobAsk                                                  // rounds' MASTER_PORT to ask the store about (loop)
	value     func(key []byte, max int) (v []byte, exists bool, err error) // the store's value of a key
	conf      func() config.Config
	unguarded prometheus.Counter
	log       *slog.Logger
	now       func() time.Time
	every     everySecond // the unguarded store's log line
}

// newJobWatch remembers jobStoreRounds rounds and asks the store with value.
func newJobWatch(value func([]byte, int) ([]byte, bool, error), conf func() config.Config, log *slog.Logger, now func() time.Time) *jobWatch {
	w := &jobWatch{asks: make(chan jobAsk, jobAsksQueued), value: value, conf: conf, log: log, now: now}
	w.rounds = policy.NewJobStores(jobStoreRounds, w.told)
	w.rounds.Asked = w.ask
	return w
}

// told is told of a rendezvous round's store (policy.JobStores): by the message that wrote
// its MASTER_PORT through the guard, or by the store when a client read it (ask). A port
// that is neither this guard's nor its store's is a store no guard here fronts: torchrun's c10d
// rendezvous sends its ranks to one on a free port of group rank 0's host, so their own traffic
// (the NCCL unique id included) never passes this guard. Counted always, logged at most once a
// second.
func (w *jobWatch) told(js policy.JobStore) {
	cfg := w.conf()
	if portOf(cfg.Upstream) == js.Port || portOf(cfg.Listen) == js.Port {
		return
	}
	w.unguarded.Inc()
	if w.every.allow(w.now()) {
		w.log.Warn("a rendezvous round sends its ranks to a store this guard does not front: their own traffic "+
			"(the NCCL unique id included) passes no guard; torchrun's static rendezvous (--master-addr, --master-port, "+
			"--node-rank) keeps them on the guarded port (README, Deploy)",
			"round", js.Round, "master_addr", js.Addr, "master_port", js.Port, "source", js.Src, "identity", js.Identity,
			"peer_set", peerSetNote(cfg.TLS))
	}
}

// peerSetNote says, for the log line of a store no guard fronts, whether tls.peer-set holds that
// store's host's free ports for the hosts whose handshake passed (when the store is on this host).
func peerSetNote(tc config.TLS) string {
	if tc.PeerSet == "" {
		return "none (tls.peer-set: on this host, configs/nftables/storeguard-peers.nft lets only hosts whose handshake passed reach it)"
	}
	return tc.PeerSet
}

// jobAsk is a round's MASTER_PORT that a client read before any write through the guard told it.
type jobAsk struct {
	key []byte // as the wire has it
	js  policy.JobStore
}

// ask queues a question about a round's MASTER_PORT for the loop; on the judging goroutine, so
// it never waits: a full queue drops it.
func (w *jobWatch) ask(key []byte, js policy.JobStore) {
	select {
	case w.asks <- jobAsk{key, js}:
	default:
	}
}

// loop asks the store about the rounds queued, one at a time, until ctx ends. In a
// transparent sidecar the master host's own agent writes past the guard, and when it is group
// rank 0 the other hosts' agents only read the round's store through it.
func (w *jobWatch) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-w.asks:
			w.lookUp(ctx, a)
		}
	}
}

// lookUp asks the store for a round's MASTER_PORT (and MASTER_ADDR), and tells told unless a
// write through the guard did first. A read may come before rank 0's write: asked every
// 500 ms, 6 times at most.
func (w *jobWatch) lookUp(ctx context.Context, a jobAsk) {
	for try := 0; try < 6; try++ {
		if try > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
		v, exists, err := w.value(a.key, 16)
		if err != nil || !exists {
			continue
		}
		port, ok := policy.ParsePort(v)
		if !ok {
			return
		}
		js := a.js
		js.Port, js.Addr = port, w.rounds.Addr(js.Round)
		if js.Addr == "" {
			if v, ok, err := w.value(policy.AddrKey(a.key), 255); err == nil && ok {
				js.Addr = protocol.ShowKey(v)
			}
		}
		if !w.rounds.Told(js.Round) {
			w.told(js)
		}
		return
	}
}
