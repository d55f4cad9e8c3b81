// Package proxy is storeguard's inline guard: it owns the store's public port, decodes every
// client message with package protocol, forwards only complete valid messages to the real
// TCPStore, and passes the store's replies back untouched.
package proxy

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/guard"
	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/internal/version"
	"github.com/storeguard/storeguard/nftset"
	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/storeinfo"
	"github.com/storeguard/storeguard/verdict"
)

// settings is one validated configuration, swapped atomically on reload. A connection keeps the
// settings it was accepted under.
type settings struct {
	parsed  *config.Parsed // what cfg parsed to (config.Parse)
	cfg     config.Config
	dec     protocol.Config
	pol     guard.Policy // every connection's
	monitor bool
	tls     *tls.Config // the mutual TLS handshake's (tls.go); nil with tls.mode off
}

// newSettings is the server's settings for p, its mutual TLS configuration included.
func (s *Server) newSettings(p *config.Parsed) (*settings, error) {
	st := newSettings(p, s.countMessage, s.policyStore())
	if st.cfg.TLS.On() {
		var err error
		if st.tls, err = s.serverTLS(p); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// newSettings is the settings for p, parsed already; onMessage sees each complete message of
// every connection; the policy keeps what it learns of the store (write-once keys, the quota's
// account) in store.
func newSettings(p *config.Parsed, onMessage func(*protocol.Message), store policy.Store) *settings {
	c, dec, rules := p.Config(), p.Decoder(), p.Rules()
	if rules != nil {
		rules = rules.WithStore(store)
	}
	monitor := c.Mode == config.ModeMonitor
	st := &settings{parsed: p, cfg: c, dec: dec, monitor: monitor,
		pol: guard.Policy{Deadlines: c.Deadlines(), Configured: dec.Gen, Monitor: monitor, OnMessage: onMessage,
			MaxAwaited: c.Limits.MaxPendingReplies, Rules: rules}}
	return st
}

// writtenKeys bounds the write-once keys remembered: about 4 + 2 × agents per rendezvous round.
const writtenKeys = 1 << 16

// appendedKeys bounds the keys remembered as written whole, and as appended to (policy.Appends):
// 8 bytes and a map entry each, about 3 MiB in all.
const appendedKeys = 1 << 16

var refuseReasons = []admission.Reason{admission.Denied, admission.NotAllowed, admission.Banned, admission.BanThrottled,
	admission.MaxConnections, admission.PrefixConnections, admission.SourceConnections, admission.SourceRate,
	admission.SourceTable, refuseDraining}

// refuseDraining: a connection accepted while the server shuts down.
const refuseDraining admission.Reason = "draining"

// startProcs is GOMAXPROCS as the process started (the CPUs it may use), before Serve raises it.
var startProcs = runtime.GOMAXPROCS(0)

// AuditSink receives audit events. serve's (audit.Queue) never waits for its file or pipe: events
// are recorded from the event loops.
type AuditSink interface {
	Write(audit.Event) error
	Lost() uint64 // events dropped or not written, since the start
}

// Options are a Server's collaborators.
type Options struct {
	Logger *slog.Logger
	// Audit receives blocked, would_block, denied and banned events. Nil discards them (the
	// counters still count).
	Audit AuditSink
	Clock func() time.Time
	// LogDropped, if set, reads how many log lines the logger's sink dropped (nbwriter).
	LogDropped func() uint64
	// AuditRotations, if set, reads how many times the audit log's file sets rotated
	// (audit.Writer.Rotations): it must not wait for a stalled sink.
	AuditRotations func() (events, flows uint64)
	// HoldHeap sets the process's soft memory limit to what the buffer budget needs
	// (heapLimit), unless GOMEMLIMIT is set: serve's process has one Server.
	HoldHeap bool
	// Identity is this guard's certificate and roots for mutual TLS (tls.*): required with
	// tls.mode on, unused otherwise.
	Identity identity.Source
	// UpgradeFailed, if set, is told why an upgrade in place that the keeper ran failed (this
	// process serves on). Upgrades without a keeper fail to their caller (HandOver's error).
	UpgradeFailed func(error)
	// PeerSetRunner keeps tls.peer-set's sets (peers.go); nil = netlink (nftset.Netlink).
	PeerSetRunner nftset.Runner
	// ReplyGrace is how long the store's last replies may take after a client's end of stream; 0 =
	// replyGrace. Tests lengthen it to tell a connection freed at its end from one a timer held.
	ReplyGrace time.Duration
}

// Server is the guard proxy.
type Server struct {
	holdHeap bool
	// replyGrace: Options.ReplyGrace, or the default; read-only after New.
	replyGrace time.Duration
	log        *slog.Logger
	audit      AuditSink
	now        func() time.Time
	set        atomic.Pointer[settings]
	gate       *admission.Gate
	ids        identity.Source // Options.Identity
	peers      *peerSet        // tls.peer-set (peers.go)
	tickets    *identity.TicketKeys
	ev         *evidence     // audit events and flow records (evidence.go)
	peeks      verdict.Peeks // banned connections being read (peek.go)
	buf        *budget
	m          *metrics
	// slots counts the connections to the store against its caps (storelimit.go); storeCaps keeps
	// them, auto's from the store's process.
	slots     *admission.StoreSlots
	storeCaps *storeinfo.Limiter

	// store learns, in auto mode, the generation the store speaks, and asks it about keys.
	store   *storeinfo.Learner
	route   *storeinfo.Router // where the store is dialled (upstream-loopback)
	learned policyState       // what the policy learns of the store
	jobs    *jobWatch         // where the rendezvous rounds send their ranks (jobs.go)

	every     rateLogs
	listeners listeners
	nextID    atomic.Uint64
	handlers  sync.WaitGroup
	draining  drainState
	loops     *loops // nil: connections are forwarded by their goroutines only
	loopsAcc  bool   // the loops accept (loopsAccept), not acceptLoop

	serving chan struct{} // closed once Serve accepts: loops and loopsAcc are set
	cont    continuity    // upgrade in place and keeper

	reg     registry
	sources *verdict.Sources // the connections that completed a message, by source; it takes reg.mu
}

// policyState is what the policy learns of the store, kept across reloads, forgotten when the
// store goes away (storeGone): the write-once keys written through the guard, and the quota's
// account.
type policyState struct {
	written   *policy.Written
	quota     *policy.Quota
	jobStores *policy.JobStores
	appends   *policy.Appends
}

// rateLogs are the log lines a flood could otherwise fill: each at most once a second.
type rateLogs struct{ dial, accept, budget, evict everySecond }

// listeners are the server's listening sockets: the clients', and the metrics endpoint's (nil: none).
type listeners struct{ clients, metrics net.Listener }

// drainState is a shutdown's drain: on once it began; end is closed when it closes what is left,
// and held connections stop waiting.
type drainState struct {
	on  atomic.Bool
	end chan struct{}
}

// registry is the live connections, under mu: every one, and those that have sent nothing, by
// source (silent: over holds the sources with more of them than caps.per-source-silent beyond
// their working ones; silent.go).
type registry struct {
	mu     sync.Mutex
	conns  map[*conn]struct{}
	silent map[netip.Addr]*silentSource
	over   map[netip.Addr]*silentSource
	// allowance is how many silent connections src may hold before a new connection may take the
	// place of its newest: its working connections plus caps.per-source-silent.
	allowance func(src netip.Addr) int
}

// New builds a server for the configuration p (config.Parse, config.LoadParsed); Listen and Serve
// start it.
func New(p *config.Parsed, opts Options) (*Server, error) {
	cfg := p.Config()
	s := &Server{log: opts.Logger, audit: opts.Audit, now: opts.Clock, reg: registry{conns: make(map[*conn]struct{}),
		silent: make(map[netip.Addr]*silentSource), over: make(map[netip.Addr]*silentSource)}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.sources = verdict.NewSources(&s.reg.mu, s.reg.weighSilentLocked) // silent.go weighs the sources they change
	s.reg.allowance = func(src netip.Addr) int { return s.sources.Count(src) + s.set.Load().cfg.Caps.PerSourceSilent }
	s.ev = &evidence{audit: s.audit, log: s.log, now: s.now, set: &s.set, sources: s.sources}
	s.ev.flows = verdict.NewFlows(s.ev.write, maxScanSources)
	s.store = storeinfo.NewLearner(s.storeTarget, storeNews{s}, s.now)
	s.learned.written, s.learned.quota = policy.NewWritten(writtenKeys), policy.NewQuota()
	s.learned.appends = policy.NewAppends(appendedKeys)
	s.jobs = newJobWatch(s.store.Value, func() config.Config { return s.set.Load().cfg }, s.log, s.now)
	s.learned.jobStores = s.jobs.rounds
	s.ids = opts.Identity
	s.peers = &peerSet{proved: make(chan netip.Addr, peersQueued), run: opts.PeerSetRunner, now: s.now, log: s.log,
		conf: s.set.Load, live: s.reg.tlsAddrs}
	if s.peers.run == nil {
		s.peers.run = nftset.Netlink{}
	}
	if err := checkPeerSet(p, s.peers.run); err != nil {
		return nil, err
	}
	s.tickets = identity.NewTicketKeys(opts.Identity, identity.TicketPeriod)
	if cfg.TLS.On() && s.ids == nil {
		return nil, errors.New("tls.mode is on and no identity source was given")
	}
	st, err := s.newSettings(p)
	if err != nil {
		return nil, err
	}
	s.set.Store(st)
	s.route = storeinfo.NewRouter(func() config.Config { return s.set.Load().cfg }, s.log)
	s.gate = admission.New(p.Admission(), s.now)
	s.ev.gate = s.gate
	s.buf = newBudget(cfg.Caps.BufferBudgetBytes, cfg.Caps.PerSourceBudgetBytes)
	s.slots = admission.NewStoreSlots(storeinfo.FallbackConnections, cfg.Caps.PerSourceStoreConnections)
	if !cfg.Caps.MaxStoreConnections.Auto {
		s.slots.SetLimits(cfg.Caps.MaxStoreConnections.N, cfg.Caps.PerSourceStoreConnections)
	}
	s.slots.SetDialRate(cfg.DialRate())
	s.storeCaps = storeinfo.NewLimiter(s.slots, func() config.Config { return s.set.Load().cfg }, s.log)
	s.holdHeap = opts.HoldHeap && os.Getenv("GOMEMLIMIT") == ""
	s.replyGrace = cmp.Or(opts.ReplyGrace, replyGrace)
	s.cont.failed = opts.UpgradeFailed
	if s.cont.failed == nil {
		s.cont.failed = func(error) {}
	}
	limitHeap(s.holdHeap, cfg)
	s.m = newMetrics(readings{
		bansActive: func() float64 { return float64(s.gate.Stats().ActiveBans) },
		buffered:   func() float64 { return float64(s.buf.inUse()) },
		auditLost: func() float64 {
			if s.audit == nil {
				return 0
			}
			return float64(s.audit.Lost())
		},
		logsDropped: func() float64 {
			if opts.LogDropped == nil {
				return 0
			}
			return float64(opts.LogDropped())
		},
		storeConns:   func() float64 { return float64(s.slots.InUse()) },
		storeLimit:   s.storeLimitGauge,
		storeWaiting: func() float64 { return float64(s.slots.Waiting()) },
		storePacing:  s.slots.Pacing,
		quotaBytes:   func() float64 { return float64(s.learned.quota.Stats().Bytes) },
		quotaKeys:    func() float64 { return float64(s.learned.quota.Stats().Keys) },
		auditRotations: func(log string) float64 {
			if opts.AuditRotations == nil {
				return 0
			}
			events, flows := opts.AuditRotations()
			if log == "flows" {
				return float64(flows)
			}
			return float64(events)
		},
	})
	s.peers.updates, s.peers.addresses = s.m.peerSetUpdates, s.m.peerSetAddresses
	s.ev.m = s.m
	s.jobs.unguarded = s.m.unguardedStores
	s.draining.end = make(chan struct{})
	s.serving = make(chan struct{})
	s.cont.init()
	return s, nil
}

// Listen opens the proxy listener and, if configured, the metrics listener.
func (s *Server) Listen() error {
	c := s.set.Load().cfg
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s.listeners.clients = ln
	if c.MetricsListen != "" {
		mln, err := net.Listen("tcp", c.MetricsListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("metrics-listen: %w", err)
		}
		s.listeners.metrics = mln
	}
	return s.keepListenerFds()
}

// Addr is the proxy listener's address, after Listen.
func (s *Server) Addr() net.Addr { return s.listeners.clients.Addr() }

// MetricsAddr is the metrics listener's address, or nil.
func (s *Server) MetricsAddr() net.Addr {
	if s.listeners.metrics == nil {
		return nil
	}
	return s.listeners.metrics.Addr()
}

// Serve accepts connections until ctx ends; then it stops accepting, lets live connections run
// for timeouts.drain, closes what is left and returns.
func (s *Server) Serve(ctx context.Context) error {
	st := s.set.Load()
	maxConns, perPrefix := st.cfg.Caps.Connections()
	s.log.Info("storeguard serving", "listen", s.listeners.clients.Addr().String(), "upstream", st.cfg.Upstream,
		"generation", st.dec.Gen.String(), "mode", string(st.cfg.Mode), "version", version.String(),
		"max_connections", maxConns, "per_prefix_connections", perPrefix)
	storeinfo.WarnExposure(s.log, st.cfg.Upstream)
	defer s.store.CloseKeys()
	s.store.Start(ctx)
	go s.storeCaps.Run(ctx)
	go s.route.Run(ctx)
	var httpSrv *http.Server
	if s.listeners.metrics != nil {
		httpSrv = &http.Server{Handler: s.httpHandler(), ReadHeaderTimeout: 5 * time.Second}
		go httpSrv.Serve(s.listeners.metrics)
	}
	go s.sweepLoop(ctx)
	go s.jobs.loop(ctx)
	go s.peers.loop(ctx)
	go s.trustLoop(ctx)
	if n := st.cfg.EventLoops; n >= 0 {
		if n == 0 {
			n = startProcs
		}
		// A loop waits in epoll_wait, a system call that keeps its P. One P more than loops lets
		// the runtime dial and run goroutine-forwarded connections at once, instead of
		// after sysmon takes a loop's P away (20 µs to 10 ms later, and sysmon then polls every
		// 20 µs).
		if runtime.GOMAXPROCS(0) < n+1 {
			runtime.GOMAXPROCS(n + 1)
		}
		ls, err := startLoops(s, n)
		if err != nil {
			s.log.Warn("event loops unavailable; forwarding with goroutines", "err", err)
		} else {
			s.loops = ls
			defer ls.stop()
		}
	}

	s.startAdopted()
	s.loopsAcc = s.loopsAccept()
	close(s.serving) // an upgrade may begin
	if s.loopsAcc {
		select {
		case <-ctx.Done():
		case <-s.cont.handedOver:
		}
		s.loops.stopAccepting()
	} else {
		s.acceptLoop(ctx)
	}
	if s.isHandedOver() {
		s.listeners.clients.Close() // its own descriptor: the next process has another
		if httpSrv != nil {
			httpSrv.Close() // the next process serves the metrics listener
		}
		return nil // the connections are the next process's now: nothing to drain
	}
	s.closeKeptFds() // the listening sockets close now: a client that comes is refused, not left waiting
	s.draining.on.Store(true)
	s.drain(s.set.Load().cfg.Timeouts.Drain)
	if httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		httpSrv.Shutdown(sctx)
		cancel()
	}
	return nil
}

// loopsAccept hands the listening socket to the event loops, which then accept themselves; it
// reports false, leaving accepting to acceptLoop, when there are no loops or they cannot take it.
func (s *Server) loopsAccept() bool {
	tl, ok := s.listeners.clients.(*net.TCPListener)
	if s.loops == nil || !ok || s.set.Load().cfg.TLS.On() { // a handshake is no loop's work
		return false
	}
	if err := s.loops.acceptFrom(tl); err != nil {
		s.log.Warn("event loops cannot accept; accepting on a goroutine", "err", err)
		return false
	}
	return true
}

// acceptPause is how long accepting stops after an error such as EMFILE (out of descriptors),
// instead of spinning on a listening socket that stays readable.
const acceptPause = 50 * time.Millisecond

// acceptFailed counts an accept error and logs it, at most once a second.
func (s *Server) acceptFailed(err error) {
	s.m.acceptErrors.Inc()
	if s.every.accept.allow(s.now()) {
		s.log.Error("accept failed (logged at most once a second)", "err", err)
	}
}

// acceptLoop accepts connections until ctx ends, each handled on a goroutine of its own.
func (s *Server) acceptLoop(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() { s.listeners.clients.Close() })
	defer stop()
	for {
		c, err := s.listeners.clients.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					if s.frozen() { // pauseAccept: wait for the thaw, or leave the socket to the next process
						select {
						case <-s.cont.frz.thawedCh():
						case <-s.cont.handedOver:
							return
						case <-ctx.Done():
							return
						}
					}
					continue
				}
				s.acceptFailed(err)
				time.Sleep(acceptPause)
				continue
			}
			return
		}
		s.handlers.Add(1)
		s.cont.accepting.Add(1)
		go s.handle(c.(*net.TCPConn))
	}
}

// pauseAccept stops accepting: the loops close their listening descriptors, acceptLoop waits.
// The socket stays open (lnFd): what arrives meanwhile waits in its backlog.
func (s *Server) pauseAccept() {
	if s.loopsAcc {
		s.loops.stopAccepting()
		return
	}
	s.listeners.clients.(*net.TCPListener).SetDeadline(past)
}

// resumeAccept accepts again after pauseAccept.
func (s *Server) resumeAccept() {
	if !s.loopsAcc {
		s.listeners.clients.(*net.TCPListener).SetDeadline(time.Time{})
		return
	}
	ln, err := listenerFromFd(s.cont.lnFd)
	if err == nil {
		err = s.loops.acceptFrom(ln)
	}
	if err != nil { // the loops stay without a listener: accept on a goroutine instead
		s.log.Error("event loops cannot accept again after a failed upgrade; accepting on a goroutine", "err", err)
		if ln != nil {
			s.listeners.clients, s.loopsAcc = ln, false
			go s.acceptLoop(s.store.Context())
		}
	}
}

// stopLoops ends the event loops; their connections go to goroutines. startLoops starts them again.
func (s *Server) stopLoops() {
	if s.loops != nil {
		s.loops.stop()
	}
}

func (s *Server) startLoops() {
	if s.loops != nil {
		s.loops.restart(s)
	}
}

func (s *Server) isHandedOver() bool {
	select {
	case <-s.cont.handedOver:
		return true
	default:
		return false
	}
}

// drain waits for live connections to end by themselves, then closes the rest.
func (s *Server) drain(timeout time.Duration) {
	done := make(chan struct{})
	go func() { s.handlers.Wait(); close(done) }()
	s.reg.mu.Lock()
	n := len(s.reg.conns)
	s.reg.mu.Unlock()
	s.log.Info("draining", "connections", n, "timeout", timeout.String())
	select {
	case <-done:
		return
	case <-time.After(timeout):
	}
	s.reg.mu.Lock()
	for c := range s.reg.conns {
		c.closeBoth()
	}
	s.reg.mu.Unlock()
	close(s.draining.end)
	<-done
}

// Reload swaps in a new configuration, p (config.Parse, config.LoadParsed), for new connections;
// live ones keep theirs. The listen addresses cannot change without a restart: a reload that
// changes them fails.
func (s *Server) Reload(p *config.Parsed) error {
	err := s.reload(p)
	if err != nil {
		s.m.reloads.WithLabelValues("failed").Inc()
		s.log.Error("config reload failed; keeping the running config", "err", err)
		return err
	}
	s.m.reloads.WithLabelValues("ok").Inc()
	s.log.Info("config reloaded")
	return nil
}

func (s *Server) reload(p *config.Parsed) error {
	cfg := p.Config()
	st, err := s.newSettings(p)
	if err != nil {
		return err
	}
	old := s.set.Load().cfg
	if ot, nt := old.TLS, cfg.TLS; ot.Mode != nt.Mode || ot.CertFile != nt.CertFile || ot.KeyFile != nt.KeyFile ||
		ot.CAFile != nt.CAFile || ot.SPIFFESocket != nt.SPIFFESocket {
		return errors.New("tls.mode and where the identity comes from (tls.cert-file, tls.key-file, tls.ca-file, " +
			"tls.spiffe-socket) cannot change on reload; restart storeguard (the files' contents are re-read as they change)")
	}
	if cfg.TLS.PeerSet != old.TLS.PeerSet {
		if err := checkPeerSet(p, s.peers.run); err != nil {
			return err
		}
	}
	if !sameAddr(cfg.Listen, old.Listen, s.listeners.clients) || !sameAddr(cfg.MetricsListen, old.MetricsListen, s.listeners.metrics) {
		return errors.New("listen and metrics-listen cannot change on reload; restart storeguard")
	}
	s.gate.Update(p.Admission())
	s.buf.setLimits(cfg.Caps.BufferBudgetBytes, cfg.Caps.PerSourceBudgetBytes)
	limitHeap(s.holdHeap, cfg)
	s.set.Store(st)
	s.route.Set(cfg)
	s.revoke(p)
	if !cfg.Caps.MaxStoreConnections.Auto {
		s.slots.SetLimits(cfg.Caps.MaxStoreConnections.N, cfg.Caps.PerSourceStoreConnections)
	}
	s.slots.SetDialRate(cfg.DialRate())
	s.storeCaps.Kick() // auto: the upstream may have changed
	if old.Upstream != cfg.Upstream {
		s.storeGone() // another store: none of the keys known are in it
	}
	if strings.EqualFold(old.Generation, "auto") != st.dec.Gen.Auto || old.Upstream != cfg.Upstream {
		s.store.Restart()
	}
	return nil
}

// policyStore is what the policy of every configuration shares about the store.
func (s *Server) policyStore() policy.Store {
	return policy.Store{Written: s.learned.written, Lookup: s.store.Exists, Quota: s.learned.quota, Count: s.store.Count,
		JobStores: s.learned.jobStores, Appends: s.learned.appends, Value: s.store.Value}
}

// portOf is the port of a host:port, 0 if it has none.
func portOf(hostport string) uint16 {
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return 0
	}
	return uint16(n)
}

// storeGone forgets what the guard knew of the store's keys: the store went away (a restarted
// store holds none), or the upstream changed.
func (s *Server) storeGone() {
	s.learned.written.Reset()
	s.learned.quota.Reset()
	s.learned.appends.Reset()
}

// sweepLoop lets the gate forget idle sources and ended bans every 5 s until ctx ends.
func (s *Server) sweepLoop(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for ctx.Err() == nil {
		select {
		case <-t.C:
			s.gate.Sweep()
			s.ev.interimFlows(&s.reg)
		case <-ctx.Done():
		}
	}
}

func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		st := s.set.Load()
		if s.draining.on.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		if _, known := s.store.Get(); st.dec.Gen.Auto && !known {
			http.Error(w, "the store's generation is not known yet", http.StatusServiceUnavailable)
			return
		}
		c, err := net.DialTimeout("tcp", s.route.Route().Dial, min(st.cfg.Timeouts.UpstreamDial, 2*time.Second))
		if err != nil {
			http.Error(w, "upstream unreachable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		c.Close()
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// countMessage counts a complete message that a connection forwards.
func (s *Server) countMessage(m *protocol.Message) { s.m.byOp[m.Generation][m.Op].Inc() }

// markTalker records that src has a connection that completed a message; done undoes it.
func (s *Server) markTalker(src netip.Addr) (done func()) {
	s.sources.Talk(src)
	return func() { s.sources.Untalk(src) }
}

// servingJob reports whether src has a live connection other than c that completed a valid
// message: evidence of a job's rank there, whose new connections go first to the store.
func (s *Server) servingJob(src netip.Addr, c *conn) bool {
	return s.sources.ServingBesides(src, c.gives.talker != nil)
}

// sameAddr reports whether a reloaded listen address names the socket already open: the same
// string, or the address the listener actually got (":0" in the config, a real port now).
func sameAddr(next, prev string, ln net.Listener) bool {
	if next == prev {
		return true
	}
	if ln == nil || next == "" {
		return false
	}
	return next == ln.Addr().String()
}
