// Package bench is a closed-loop load generator for PyTorch's TCPStore, speaking any generation
// of its wire protocol. It measures a store directly or through a proxy (storeguard, HAProxy)
// with the same workloads, so the two can be compared; docs/benchmarks.md has the results.
//
// Closed loop: each connection sends one request (or one fixed group), waits for the reply, and
// sends the next. SET and MULTI_SET have no reply, so they are written together with a
// GETNUMKEYS in one write and timed until its reply: the store answers in order, so the reply
// proves the SET was applied. One such pair counts as one op.
package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// Op is a workload.
type Op string

const (
	OpSet        Op = "set"
	OpGet        Op = "get"
	OpAdd        Op = "add"
	OpCheck      Op = "check"
	OpMultiSet   Op = "multi_set"
	OpMultiGet   Op = "multi_get"
	OpMix        Op = "mix"        // 70 % GET, 20 % SET(+GETNUMKEYS), 10 % ADD
	OpWaitStorm  Op = "wait-storm" // rounds: N-1 clients WAIT on a key, one SETs it
	OpRendezvous Op = "rendezvous" // once: N clients connect, handshake, ADD init, WAIT for the last
	OpIdle       Op = "idle"       // N clients connect, handshake and hold the connection silently
	OpConnect    Op = "connect"    // each client, over and over: dial, handshake, one GET, close
)

// Ops lists the workloads.
func Ops() []Op {
	return []Op{OpSet, OpGet, OpAdd, OpCheck, OpMultiSet, OpMultiGet, OpMix, OpWaitStorm, OpRendezvous, OpIdle, OpConnect}
}

// Config is one bench run.
type Config struct {
	Addr      string
	Conns     int
	Duration  time.Duration // closed-loop ops, wait-storm and idle; rendezvous runs once
	Warmup    time.Duration // closed-loop ops run this long before measuring
	Op        Op
	Gen       protocol.Generation
	ValueSize int
	Keys      int // distinct keys the closed-loop ops cycle through
	Batch     int // keys per CHECK/MULTI_GET/MULTI_SET
	DialConc  int // connections dialed at once
	// PerHost, when above 0, dials client i from loopback source 127.10.0.0 + 1 + i/PerHost, as a
	// job of PerHost ranks a host would come (a guard's per-source caps and queue see hosts).
	PerHost    int
	DialTimout time.Duration
	Timeout    time.Duration // rendezvous: the whole rendezvous; others: each request
	// OnReady is called once every connection is up (idle: then held until Duration ends).
	OnReady func(conns int)
	// WatchPIDs are processes (a proxy, a store) whose CPU time over the measured interval the
	// result reports, with the whole machine's (Linux).
	WatchPIDs []int
}

// Validate checks c, including that its generation has the op's messages.
func (c Config) Validate() error {
	var errs []string
	if c.Addr == "" {
		errs = append(errs, "addr is empty")
	}
	if c.Conns < 1 {
		errs = append(errs, "conns must be at least 1")
	}
	if c.Op == OpWaitStorm && c.Conns < 2 {
		errs = append(errs, "wait-storm needs at least 2 conns (one setter, waiters)")
	}
	if c.Keys < 1 || c.Batch < 1 || c.ValueSize < 0 {
		errs = append(errs, "keys and batch must be at least 1, value-size at least 0")
	}
	known := false
	for _, o := range Ops() {
		known = known || o == c.Op
	}
	if !known {
		errs = append(errs, fmt.Sprintf("op %q is not one of %v", c.Op, Ops()))
	}
	for _, op := range c.Op.wireOps() {
		if _, ok := protocol.WireOf(c.Gen, op); !ok {
			errs = append(errs, fmt.Sprintf("%s needs %s, which %s does not have", c.Op, op, c.Gen))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("bench: %s", strings.Join(errs, "; "))
	}
	return nil
}

func (o Op) wireOps() []protocol.Op {
	switch o {
	case OpSet:
		return []protocol.Op{protocol.OpSet, protocol.OpGetNumKeys}
	case OpGet, OpConnect:
		return []protocol.Op{protocol.OpGet}
	case OpAdd:
		return []protocol.Op{protocol.OpAdd}
	case OpCheck:
		return []protocol.Op{protocol.OpCheck}
	case OpMultiSet:
		return []protocol.Op{protocol.OpMultiSet, protocol.OpGetNumKeys}
	case OpMultiGet:
		return []protocol.Op{protocol.OpMultiGet}
	case OpMix:
		return []protocol.Op{protocol.OpGet, protocol.OpSet, protocol.OpGetNumKeys, protocol.OpAdd}
	case OpWaitStorm, OpRendezvous:
		return []protocol.Op{protocol.OpAdd, protocol.OpSet, protocol.OpWait, protocol.OpGetNumKeys}
	}
	return nil
}

// Latency is a latency summary in microseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Mean float64 `json:"mean"`
	Max  float64 `json:"max"`
}

func summarize(h *Histogram) Latency {
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	return Latency{P50: us(h.Quantile(0.5)), P90: us(h.Quantile(0.9)), P99: us(h.Quantile(0.99)),
		P999: us(h.Quantile(0.999)), Mean: us(h.Mean()), Max: us(h.Max())}
}

// Connect summarizes connection set-up.
type Connect struct {
	OK      int     `json:"ok"`
	Failed  int     `json:"failed"`
	Retries int     `json:"retries"`
	Seconds float64 `json:"seconds"` // until the last connection (and handshake) completed
	Latency Latency `json:"latency_us"`
}

// Rendezvous summarizes a rendezvous storm.
type Rendezvous struct {
	Clients   int     `json:"clients"`
	Completed int     `json:"completed"`
	TotalS    float64 `json:"total_s"` // first dial to the last client released from its WAIT
}

// Result is what a run measured.
type Result struct {
	Op           string      `json:"op"`
	Addr         string      `json:"addr"`
	Generation   string      `json:"generation"`
	Conns        int         `json:"conns"`
	ValueSize    int         `json:"value_size"`
	Keys         int         `json:"keys"`
	DurationS    float64     `json:"duration_s"` // the measured interval
	Ops          uint64      `json:"ops"`        // wait-storm: rounds; rendezvous: clients released
	Errors       uint64      `json:"errors"`
	OpsPerSec    float64     `json:"ops_per_sec"`
	Latency      Latency     `json:"latency_us"` // per op; wait-storm: per round; rendezvous: per client; connect: per connection
	Connect      Connect     `json:"connect"`
	Rendezvous   *Rendezvous `json:"rendezvous,omitempty"`
	CPU          *CPU        `json:"cpu,omitempty"` // over the measured interval
	ErrorSamples []string    `json:"error_samples,omitempty"`
	FileLimit    uint64      `json:"file_limit"`
}

// errorLog counts errors and keeps the first few distinct messages.
type errorLog struct {
	n       atomic.Uint64
	mu      sync.Mutex
	samples map[string]int
}

const maxErrorSamples = 8

func (e *errorLog) add(err error) {
	e.n.Add(1)
	msg := err.Error()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.samples == nil {
		e.samples = make(map[string]int)
	}
	if _, ok := e.samples[msg]; ok || len(e.samples) < maxErrorSamples {
		e.samples[msg]++
	}
}

func (e *errorLog) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for m, n := range e.samples {
		out = append(out, m+" (×"+strconv.Itoa(n)+")")
	}
	return out
}

// Run runs one bench.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.DialConc == 0 {
		cfg.DialConc = 256
	}
	if cfg.DialTimout == 0 {
		cfg.DialTimout = 30 * time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	limit, _ := RaiseFileLimit(uint64(cfg.Conns) + 256)
	r := &runner{cfg: cfg, d: newDialer(cfg.Addr, cfg.DialConc, cfg.DialTimout, cfg.PerHost),
		nonce: strconv.FormatInt(time.Now().UnixNano()%1e12, 36)}
	res := &Result{Op: string(cfg.Op), Addr: cfg.Addr, Generation: cfg.Gen.String(), Conns: cfg.Conns,
		ValueSize: cfg.ValueSize, Keys: cfg.Keys, FileLimit: limit}
	var err error
	switch cfg.Op {
	case OpRendezvous:
		err = r.rendezvous(ctx, res)
	case OpWaitStorm:
		err = r.waitStorm(ctx, res)
	case OpIdle:
		err = r.idle(ctx, res)
	case OpConnect:
		err = r.connectLoop(ctx, res)
	default:
		err = r.closedLoop(ctx, res)
	}
	res.Errors = r.errs.n.Load()
	res.ErrorSamples = r.errs.list()
	if res.DurationS > 0 {
		res.OpsPerSec = float64(res.Ops) / res.DurationS
	}
	return res, err
}

// runner holds what the workloads of one run share.
type runner struct {
	cfg   Config
	d     *dialer
	nonce string // makes this run's keys unique on a store shared by several runs
	errs  errorLog

	connMu   sync.Mutex
	connHist Histogram
	connOK   int
	connFail int
	retries  int
}

// connect dials and handshakes one client, recording set-up time and failures.
func (r *runner) connect(ctx context.Context, id int) (*client, error) {
	t0 := time.Now()
	c, retries, err := r.d.dial(ctx, id)
	var cl *client
	if err == nil {
		cl = newClient(c, r.cfg.Gen)
		dl := time.Now().Add(r.cfg.DialTimout)
		if d, ok := ctx.Deadline(); ok && d.Before(dl) {
			dl = d
		}
		c.SetDeadline(dl)
		if err = cl.handshake(uint32(id) + 1); err != nil {
			err = fmt.Errorf("handshake: %w", err)
			c.Close()
			cl = nil
		} else {
			c.SetDeadline(time.Time{})
		}
	} else {
		err = fmt.Errorf("dial: %w", err)
	}
	r.connMu.Lock()
	r.retries += retries
	if err != nil {
		r.connFail++
	} else {
		r.connOK++
		r.connHist.Record(time.Since(t0))
	}
	r.connMu.Unlock()
	if err != nil {
		r.errs.add(err)
	}
	return cl, err
}

// connectAll opens n clients concurrently; failed slots are nil.
func (r *runner) connectAll(ctx context.Context, n int) ([]*client, time.Duration) {
	t0 := time.Now()
	cls := make([]*client, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { cls[i], _ = r.connect(ctx, i) })
	}
	wg.Wait()
	return cls, time.Since(t0)
}

func (r *runner) connectSummary(took time.Duration) Connect {
	r.connMu.Lock()
	defer r.connMu.Unlock()
	return Connect{OK: r.connOK, Failed: r.connFail, Retries: r.retries, Seconds: took.Seconds(),
		Latency: summarize(&r.connHist)}
}

func closeAll(cls []*client) {
	for _, c := range cls {
		if c != nil {
			c.close()
		}
	}
}

// key returns the i-th bench key; torch's client prefixes every key with "/".
func (r *runner) key(i int) []byte { return []byte("/bench/" + r.nonce + "/k" + strconv.Itoa(i)) }
