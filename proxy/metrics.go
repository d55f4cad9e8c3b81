package proxy

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/internal/version"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/storeinfo"
)

const namespace = "storeguard"

// metrics are the proxy's Prometheus series. Labels are bounded: op, generation, rule, reason,
// direction, mode; never a source address or a key.
type metrics struct {
	reg *prometheus.Registry

	accepted        prometheus.Counter
	acceptErrors    prometheus.Counter
	active          prometheus.Gauge
	refused         *prometheus.CounterVec
	handshakes      *prometheus.CounterVec
	resumed         prometheus.Counter
	messages        *prometheus.CounterVec
	byOp            [protocol.LatestGeneration + 1][32]prometheus.Counter // [generation][op], resolved once: no map lookup per message
	bytesC2S        prometheus.Counter
	bytesS2C        prometheus.Counter
	violations      *prometheus.CounterVec
	bans            prometheus.Counter
	scans           prometheus.Counter
	peeks           *prometheus.CounterVec
	bansActive      prometheus.GaugeFunc
	dialFailures    prometheus.Counter
	latency         prometheus.Histogram
	reloads         *prometheus.CounterVec
	panics          prometheus.Counter
	buffered        prometheus.GaugeFunc
	auditDropped    prometheus.CounterFunc
	logsDropped     prometheus.CounterFunc
	budgetTimeouts  prometheus.Counter
	stalls          prometheus.Counter
	resyncs         prometheus.Counter
	loopConns       prometheus.Gauge
	handbacks       [numHandbacks]prometheus.Counter
	storeProbes     *prometheus.CounterVec
	keyLookups      *prometheus.CounterVec
	storeWaits      *prometheus.CounterVec
	storeInfo       *prometheus.GaugeVec
	storeConns      prometheus.GaugeFunc
	storeLimit      prometheus.GaugeFunc
	quotaBytes      prometheus.GaugeFunc
	quotaKeys       prometheus.GaugeFunc
	storeRefused    *prometheus.CounterVec
	storeQueued     *prometheus.CounterVec
	storeWaiting    prometheus.GaugeFunc
	storePacing     *prometheus.GaugeVec
	silentEvictions prometheus.Counter
	handovers       *prometheus.CounterVec
	handoverConns   prometheus.Gauge
	restoreLost     *prometheus.CounterVec
	handoverFrozen  prometheus.Gauge
	unguardedStores prometheus.Counter
	// tls.peer-set (peers.go)
	peerSetUpdates   *prometheus.CounterVec
	peerSetAddresses prometheus.Gauge
}

// readings are what the gauges and counters that others count read.
type readings struct {
	bansActive, buffered, auditLost, logsDropped func() float64
	storeConns, storeLimit, storeWaiting         func() float64
	storePacing                                  func() (window float64, inflight int, rate float64)
	quotaBytes, quotaKeys                        func() float64
	auditRotations                               func(log string) float64 // of auditLogs
}

// pacingCollector reads the pacing state once per scrape into its three gauges.
type pacingCollector struct {
	g    *prometheus.GaugeVec
	read func() (window float64, inflight int, rate float64)
}

func (c pacingCollector) Describe(ch chan<- *prometheus.Desc) { c.g.Describe(ch) }

func (c pacingCollector) Collect(ch chan<- prometheus.Metric) {
	w, n, r := c.read()
	c.g.WithLabelValues("window").Set(w)
	c.g.WithLabelValues("inflight").Set(float64(n))
	c.g.WithLabelValues("rate").Set(r)
	c.g.Collect(ch)
}

// auditLogs are the audit writer's file sets: the security events, and passed connections' flows.
var auditLogs = []string{"events", "flows"}

// setStore shows the store's generation and backend as learned in auto mode (known), or that it
// is not known now.
func (m *metrics) setStore(i storeinfo.Info, known bool) {
	m.storeInfo.Reset()
	if known {
		m.storeInfo.WithLabelValues(i.Gen.String(), i.Backend.String()).Set(1)
	}
}

// handback is why an event loop gave a connection back to its goroutines.
type handback int

// handbackNone is not a hand-back: the loop lets a closed connection go.
const handbackNone handback = -1

const (
	handbackPartial      handback = iota // a message in progress that needs budget the loop cannot get at once
	handbackBackpressure                 // a peer that could not take a write at once
	handbackStop                         // the server stopped its loops
	handbackDial                         // no store slot free or dial token, or the store did not take a connection at once: goroutines wait and dial
	handbackAwaiting                     // a client's next message waits for a reply (limits.max-pending-replies)
	numHandbacks
)

var handbackNames = [numHandbacks]string{"partial", "backpressure", "stop", "dial", "awaiting"}

// storeReasons are what can hold a client back from a store connection.
var storeReasons = []admission.Reason{admission.MaxStoreConnections, admission.SourceStoreConnections,
	admission.StoreDialRate, admission.StorePacing, admission.SourceStoreDialRate}

// newMetrics makes the metrics; read reads what others count: bans, buffered bytes, audit events lost,
// log lines dropped, store connections and their cap.
func newMetrics(read readings) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	f := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: namespace, Name: name, Help: help}
	}
	m.accepted = prometheus.NewCounter(prometheus.CounterOpts(f("connections_accepted_total", "Client connections admitted.")))
	m.acceptErrors = prometheus.NewCounter(prometheus.CounterOpts(f("accept_errors_total",
		"Failed accepts (such as EMFILE, out of descriptors); each pauses accepting for 50 ms.")))
	m.active = prometheus.NewGauge(prometheus.GaugeOpts(f("connections_active", "Client connections open now.")))
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts(f("connections_refused_total",
		"Client connections refused at accept, by reason.")), []string{"reason"})
	m.handshakes = prometheus.NewCounterVec(prometheus.CounterOpts(f("tls_handshakes_total",
		"Mutual TLS handshakes, by result: ok, or why the client was refused (identity.Reason).")), []string{"result"})
	m.resumed = prometheus.NewCounter(prometheus.CounterOpts(f("tls_resumed_total",
		"Mutual TLS handshakes that resumed a session (tls.resumption); each is also a result=\"ok\" handshake.")))
	m.messages = prometheus.NewCounterVec(prometheus.CounterOpts(f("messages_total",
		"Complete client messages forwarded (or, in monitor mode, seen), by op and generation.")), []string{"op", "generation"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts(f("bytes_total",
		"Bytes forwarded, by direction.")), []string{"direction"})
	m.bytesC2S = bytes.WithLabelValues("client_to_store")
	m.bytesS2C = bytes.WithLabelValues("store_to_client")
	m.violations = prometheus.NewCounterVec(prometheus.CounterOpts(f("violations_total",
		"Protocol violations, by rule and mode (enforce: blocked; monitor: would have been).")), []string{"rule", "mode"})
	m.bans = prometheus.NewCounter(prometheus.CounterOpts(f("bans_total", "Sources banned for repeated violations.")))
	m.scans = prometheus.NewCounter(prometheus.CounterOpts(f("scans_detected_total",
		"Scan notices: a source crossed scan.threshold connections that sent nothing or only invalid bytes.")))
	m.peeks = prometheus.NewCounterVec(prometheus.CounterOpts(f("banned_peeks_total",
		"Connections of banned sources: first bytes read to name the probe (read), or closed at once (skipped: 256 being read).")),
		[]string{"result"})
	m.bansActive = prometheus.NewGaugeFunc(prometheus.GaugeOpts(f("bans_active", "Sources banned now.")), read.bansActive)
	m.dialFailures = prometheus.NewCounter(prometheus.CounterOpts(f("upstream_dial_failures_total",
		"Failed connections to the upstream store.")))
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "forward_latency_seconds",
		Help:    "Time from reading the last byte of a batch of complete messages to having written it to the store.",
		Buckets: prometheus.ExponentialBuckets(2e-6, 2, 18)})
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts(f("config_reloads_total",
		"Configuration reloads, by result.")), []string{"result"})
	m.panics = prometheus.NewCounter(prometheus.CounterOpts(f("panics_recovered_total",
		"Panics recovered in connection handlers.")))
	m.buffered = prometheus.NewGaugeFunc(prometheus.GaugeOpts(f("buffered_bytes",
		"Bytes of partial client messages held, against caps.buffer-budget-bytes.")), read.buffered)
	m.auditDropped = prometheus.NewCounterFunc(prometheus.CounterOpts(f("audit_write_errors_total",
		"Audit events lost: dropped while the audit sink stalled, or failed to write.")), read.auditLost)
	m.budgetTimeouts = prometheus.NewCounter(prometheus.CounterOpts(f("budget_wait_timeouts_total",
		"Connections closed after waiting timeouts.message for buffer budget (not a violation).")))
	m.stalls = prometheus.NewCounter(prometheus.CounterOpts(f("reply_stalls_total",
		"Times a client's next message waited at limits.max-pending-replies for a reply (not a violation).")))
	m.resyncs = prometheus.NewCounter(prometheus.CounterOpts(f("reply_resyncs_total",
		"Times the guard stopped counting a connection's awaited replies after waiting for one in vain (docs/protocol.md).")))
	m.logsDropped = prometheus.NewCounterFunc(prometheus.CounterOpts(f("log_lines_dropped_total",
		"Log lines dropped while the log sink (stderr) stalled.")), read.logsDropped)
	m.storeConns = prometheus.NewGaugeFunc(prometheus.GaugeOpts(f("store_connections",
		"Connections to the store held for clients now (each client's from its first valid message).")), read.storeConns)
	m.storeLimit = prometheus.NewGaugeFunc(prometheus.GaugeOpts(f("store_connections_limit",
		"The cap on store_connections in effect (caps.max-store-connections, auto: from the store's descriptor limit); +Inf for none.")), read.storeLimit)
	m.quotaBytes = prometheus.NewGaugeFunc(prometheus.GaugeOpts(f("store_quota_bytes",
		"What clients have made the store hold through the guard, as the store quota counts it (quota.store-bytes): keys, values and 200 bytes a key.")), read.quotaBytes)
	m.quotaKeys = prometheus.NewGaugeFunc(prometheus.GaugeOpts(f("store_quota_keys",
		"Keys clients have made the store hold through the guard, as the store quota counts them (quota.store-keys).")), read.quotaKeys)
	m.storeRefused = prometheus.NewCounterVec(prometheus.CounterOpts(f("store_connections_refused_total",
		"Clients closed after waiting timeouts.upstream-dial for a store connection, by the cap that was full or the dial rate that was spent (not violations).")),
		[]string{"reason"})
	m.storeQueued = prometheus.NewCounterVec(prometheus.CounterOpts(f("store_connection_waits_total",
		"Clients whose first valid message had to wait for a store connection, by what held it back first: a cap full, or a dial rate spent (caps.*store-dial-rate). Not violations.")),
		[]string{"reason"})
	m.storePacing = prometheus.NewGaugeVec(prometheus.GaugeOpts(f("store_pacing",
		"caps.store-dial-rate auto: the window of store dials in flight (window), the dials in flight (inflight), "+
			"and the dials a second a stall capped them at (rate; 0: none). All 0 when not paced.")), []string{"value"})
	m.storeWaiting = prometheus.NewGaugeFunc(prometheus.GaugeOpts(f("store_connections_waiting",
		"Clients waiting now for a store connection (a cap full, or a dial rate spent).")), read.storeWaiting)
	m.silentEvictions = prometheus.NewCounter(prometheus.CounterOpts(f("silent_evictions_total",
		"Connections that had sent nothing, closed at caps.max-connections to admit a new one: their source held more than caps.per-source-silent beyond its working connections (not violations).")))
	m.loopConns = prometheus.NewGauge(prometheus.GaugeOpts(f("event_loop_connections",
		"Connections an event loop forwards now (the others run on goroutines).")))
	handbacks := prometheus.NewCounterVec(prometheus.CounterOpts(f("event_loop_handbacks_total",
		"Connections an event loop gave back to goroutines, by reason.")), []string{"reason"})
	for i, name := range handbackNames {
		m.handbacks[i] = handbacks.WithLabelValues(name)
	}
	m.storeProbes = prometheus.NewCounterVec(prometheus.CounterOpts(f("store_probes_total",
		"auto: attempts to learn the store's generation, by result (learned, failed: not up, slow or busy; asked again).")),
		[]string{"result"})
	m.keyLookups = prometheus.NewCounterVec(prometheus.CounterOpts(f("policy_key_lookups_total",
		"Questions to the store whether a write-once key exists (policy.write-once), by result: exists (the write is refused), absent, error (the write let through).")),
		[]string{"result"})
	m.storeWaits = prometheus.NewCounterVec(prometheus.CounterOpts(f("store_generation_waits_total",
		"auto: connections that arrived while the store's generation was unknown and waited, by result (learned, timeout: closed after timeouts.upstream-dial with nothing forwarded).")),
		[]string{"result"})
	m.storeInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts(f("store_info",
		"auto: 1 for the generation and backend the store behind the guard speaks, as learned from it; no series while unknown.")),
		[]string{"generation", "backend"})
	m.handovers = prometheus.NewCounterVec(prometheus.CounterOpts(f("handovers_total",
		"Upgrades in place and restarts that handed the connections to a new process, by result; ok counts the whole line of processes (it carries over), failed this process's own. Every other counter starts again at 0 in the new process, as process_start_time_seconds shows.")),
		[]string{"result"})
	m.handoverConns = prometheus.NewGauge(prometheus.GaugeOpts(f("handover_connections",
		"Connections this process took over from the previous one when it started (0: it started afresh).")))
	m.restoreLost = prometheus.NewCounterVec(prometheus.CounterOpts(f("restore_closed_total",
		"Connections a keeper restored after the forwarding process died that were closed because they could not go on exactly, by reason: restart_lost_request (the dead process held part of a client's message), restart_lost_reply (it held replies the client had not taken), restart_counts_failed (the kernel's byte counters could not be read).")),
		[]string{"reason"})
	m.handoverFrozen = prometheus.NewGauge(prometheus.GaugeOpts(f("handover_frozen_seconds",
		"How long the upgrade that started this process held traffic: from the previous process's freeze to this one forwarding (0: it started afresh).")))
	m.unguardedStores = prometheus.NewCounter(prometheus.CounterOpts(f("unguarded_job_stores_total",
		"Rendezvous rounds that sent their ranks to a store this guard does not front (a MASTER_PORT written under torch.rendezvous.<run_id>.<round>/ that is neither this guard's port nor its store's): torchrun's c10d rendezvous does, the ranks' own traffic then passes no guard.")))
	m.peerSetUpdates = prometheus.NewCounterVec(prometheus.CounterOpts(f("peer_set_updates_total",
		"nft transactions that refreshed tls.peer-set, by result: ok, failed (hosts whose handshake passed may then be kept off this host's free ports).")),
		[]string{"result"})
	m.peerSetAddresses = prometheus.NewGauge(prometheus.GaugeOpts(f("peer_set_addresses",
		"Addresses with a mutual-TLS connection open at the last refresh of tls.peer-set.")))
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts(f("build_info", "Build information; always 1.")),
		[]string{"version", "goversion"})
	build.WithLabelValues(version.String(), runtime.Version()).Set(1)

	m.reg.MustRegister(m.accepted, m.acceptErrors, m.active, m.refused, m.handshakes, m.resumed, m.messages, bytes, m.violations, m.bans, m.scans, m.peeks, m.bansActive,
		m.dialFailures, m.latency, m.reloads, m.panics, m.buffered, m.auditDropped, m.logsDropped, m.budgetTimeouts, m.stalls, m.resyncs, m.loopConns, handbacks, build,
		m.storeProbes, m.keyLookups, m.storeWaits, m.storeInfo, m.storeConns, m.storeLimit, m.quotaBytes, m.quotaKeys, m.storeRefused,
		m.storeQueued, m.storeWaiting, pacingCollector{m.storePacing, read.storePacing}, m.silentEvictions, m.handovers, m.handoverConns, m.restoreLost, m.handoverFrozen, m.unguardedStores,
		m.peerSetUpdates, m.peerSetAddresses,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, log := range auditLogs {
		// How long each set keeps its records: a rate of rotations times max-backups.
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "audit_rotations_total",
			Help:        "Rotations of the audit log's file sets: events (security events and suspicious flows), flows (passed connections).",
			ConstLabels: prometheus.Labels{"log": log}}, func() float64 { return read.auditRotations(log) }))
	}

	// Pre-create every series so dashboards and alerts see zeros, not absences.
	for g := protocol.G0; g <= protocol.LatestGeneration; g++ {
		for _, op := range protocol.Ops() {
			m.byOp[g][op] = m.messages.WithLabelValues(op.String(), g.String())
		}
	}
	for _, r := range protocol.Rules() {
		m.violations.WithLabelValues(string(r), "enforce")
		m.violations.WithLabelValues(string(r), "monitor")
	}
	for _, r := range refuseReasons {
		m.refused.WithLabelValues(string(r))
	}
	for _, r := range storeReasons {
		m.storeRefused.WithLabelValues(string(r))
		m.storeQueued.WithLabelValues(string(r))
	}
	for _, r := range []string{"learned", "failed"} {
		m.storeProbes.WithLabelValues(r)
	}
	m.handshakes.WithLabelValues("ok")
	m.peerSetUpdates.WithLabelValues("ok")
	m.peerSetUpdates.WithLabelValues("failed")
	for _, r := range identity.Reasons {
		m.handshakes.WithLabelValues(string(r))
	}
	for _, r := range []string{"learned", "timeout"} {
		m.storeWaits.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "failed"} {
		m.handovers.WithLabelValues(r)
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("failed")
	return m
}
