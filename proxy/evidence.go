package proxy

import (
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/verdict"
)

// evidence writes what the guard saw and did, with the counts beside it: a violation's event (and
// the ban it earned), a refusal's, flow records (and the scan notices they raise). Every path
// that records goes through it; it holds no connection.
type evidence struct {
	audit   AuditSink // nil: none
	m       *metrics
	gate    *admission.Gate
	log     *slog.Logger
	now     func() time.Time
	flows   *verdict.Flows
	sources *verdict.Sources
	set     *atomic.Pointer[settings]
	every   everySecond // the lost event's log line
}

// violation records v, a violation of c's stream that the judging goroutine found: its event, its
// flow's verdict and, when it earns one, the ban of its source (or of its identity at its address).
func (ev *evidence) violation(c *conn, v *protocol.Violation, first []byte) {
	_, known := c.g.Generation()
	ev.violationSeen(c, v, first, known, c.g.Bytes())
}

// violationSeen records v as violation does, for a goroutine other than the one
// judging c's stream: known and seen are what the stream had shown (conn.seen).
func (ev *evidence) violationSeen(c *conn, v *protocol.Violation, first []byte, known bool, seen uint64) {
	o := ev.outcome(c, v, first, known, seen)
	ev.log.Debug("violation", "conn", c.id, "src", c.src.String(), "err", v.Error(), "mode", string(c.st.mode()))
	if !o.Bans() {
		return
	}
	// A proven connection's violations ban its identity at its address; any other's, the address
	// (or its IPv6 network): admission's proven.go says why.
	var banned string
	if id := c.cl.identity(); id != "" {
		if ev.gate.ProvenViolation(c.src.Addr(), id) {
			banned = id + " at " + c.src.Addr().String()
		}
	} else if p := ev.gate.Violation(c.src.Addr()); p.IsValid() {
		banned = p.String()
	}
	if banned != "" {
		ev.m.bans.Inc()
		b := ev.event(c.src, c.dst, audit.ActionBanned, string(v.Rule))
		b.ConnID, b.Mode, b.TLS = c.id, audit.ModeEnforce, c.cl.record()
		ev.write(b)
		ev.log.Warn("source banned after repeated violations", "src", c.src.Addr().String(), "banned", banned,
			"duration", c.st.cfg.Ban.Duration.String(), "last_rule", string(v.Rule))
	}
}

// warning records v, a rule broken in monitor mode by a message that was forwarded: a
// would_block event, never a step towards a ban.
func (ev *evidence) warning(c *conn, v *protocol.Violation, first []byte) {
	ev.m.violations.WithLabelValues(string(v.Rule), string(audit.ModeMonitor)).Inc()
	c.flow.decided(audit.VerdictWouldBlock, string(v.Rule), c.st.monitor)
	e := audit.ViolationEvent(v, true, c.src, c.dst, audit.ActionWouldBlock, audit.ModeMonitor, first, c.g.Bytes())
	e.Timestamp, e.ConnID, e.TLS = ev.now(), c.id, c.cl.record()
	ev.write(e)
	ev.log.Debug("violation let through (monitor)", "conn", c.id, "src", c.src.String(), "err", v.Error())
}

// truncated records v, a message that the stream's end cut short (first: its bytes): blocked
// in either mode, since none of it was forwarded, and never a step towards a ban (verdict.Of).
func (ev *evidence) truncated(c *conn, v *protocol.Violation, first []byte) {
	_, known := c.g.Generation()
	ev.outcome(c, v, first, known, c.g.Bytes())
}

// refused records a connection refused at admission, for reason.
func (ev *evidence) refused(src, dst netip.AddrPort, reason admission.Reason) {
	ev.m.refused.WithLabelValues(string(reason)).Inc()
	e := ev.event(src, dst, audit.ActionDenied, string(reason))
	ev.write(e)
}

// event is an admission event of src's connection to dst, stamped now.
func (ev *evidence) event(src, dst netip.AddrPort, action audit.Action, reason string) audit.Event {
	e := audit.AdmissionEvent(src, dst, action, reason)
	e.Timestamp = ev.now()
	return e
}

// write writes e to the audit log; one that is lost is counted by the writer and logged at most
// once a second.
func (ev *evidence) write(e audit.Event) {
	if ev.audit == nil {
		return
	}
	if err := ev.audit.Write(e); err != nil && ev.every.allow(ev.now()) {
		ev.log.Error("audit event lost (logged at most once a second; counted in audit_write_errors_total)",
			"err", err)
	}
}

// outcome counts v, a violation of c's stream, decides c's flow and writes v's event, as
// verdict.Of says (violation, truncated).
func (ev *evidence) outcome(c *conn, v *protocol.Violation, first []byte, known bool, seen uint64) verdict.Outcome {
	o := verdict.Of(v, c.st.monitor)
	ev.m.violations.WithLabelValues(string(v.Rule), string(c.st.mode())).Inc()
	c.flow.decided(o.Verdict, string(v.Rule), c.st.monitor)
	e := audit.ViolationEvent(v, known, c.src, c.dst, o.Action, c.st.mode(), first, seen)
	e.Timestamp, e.ConnID, e.TLS = ev.now(), c.id, c.cl.record()
	ev.write(e)
	return o
}

// flow writes f as configured (flows) and feeds the scan detector, writing its notice.
func (ev *evidence) flow(f *audit.Flow) {
	if notice, ok := ev.flows.Write(f, &ev.set.Load().cfg, ev.sources); ok {
		ev.m.scans.Inc()
		ev.write(notice)
		ev.log.Warn("scan detected", "src", f.Src.Addr().String(), "connections", *notice.ScanConnections,
			"probes", notice.ScanProbes)
	}
}

// refusedFlow writes the flow record of a connection refused at accept (reason: why), which began
// at start, with first, what it sent before it was closed (ban.peek), if anything.
// judged: the violation those bytes would have been, for the record.
func (ev *evidence) refusedFlow(src, dst netip.AddrPort, reason string, start time.Time, first []byte,
	judged *protocol.Violation) {
	mode := audit.ModeEnforce
	if ev.set.Load().monitor {
		mode = audit.ModeMonitor
	}
	f := audit.Flow{Src: src, Dst: dst, Start: start, End: ev.now(), Verdict: audit.VerdictRefused,
		Reason: reason, ClosedBy: audit.ClosedByGuard, FromClient: uint64(len(first)), First: first, Mode: mode, Judged: judged}
	ev.flow(&f)
}

// refusedFlowTLS writes the flow record of a client refused at its handshake.
func (ev *evidence) refusedFlowTLS(src, dst netip.AddrPort, reason string, start time.Time, info *audit.TLS) {
	f := audit.Flow{Src: src, Dst: dst, Start: start, End: ev.now(), Verdict: audit.VerdictRefused, Reason: reason,
		ClosedBy: audit.ClosedByGuard, Mode: audit.ModeEnforce, TLS: info}
	ev.flow(&f)
}

// bannedFor audits and logs a source banned after its last refusal (reason).
func (ev *evidence) bannedFor(src, dst netip.AddrPort, reason string, banned netip.Prefix) {
	ev.m.bans.Inc()
	b := ev.event(src, dst, audit.ActionBanned, reason)
	b.Mode = audit.ModeEnforce
	ev.write(b)
	ev.log.Warn("source banned after repeated violations", "src", src.Addr().String(), "banned", banned.String(),
		"last_rule", reason)
}

// interimFlows writes an interim flow record of every connection open for audit.flow-interim
// since its start or its last one; serve calls it every minute.
func (ev *evidence) interimFlows(r *registry) {
	every := ev.set.Load().cfg.Audit.FlowInterim
	if every <= 0 {
		return
	}
	now := ev.now()
	r.mu.Lock()
	var due []*conn
	for c := range r.conns {
		c.flow.mu.Lock()
		if c.flow.interim.IsZero() {
			c.flow.interim = c.start
		}
		if now.Sub(c.flow.interim) >= every {
			c.flow.interim = now
			due = append(due, c)
		}
		c.flow.mu.Unlock()
	}
	r.mu.Unlock()
	for _, c := range due {
		f := c.flowRecord(now, true)
		ev.flow(&f)
	}
}
