package proxy

import (
	"math"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
)

// Store connections are capped (caps.max-store-connections, caps.per-source-store-connections)
// below what the store can hold (storeinfo.Limiter keeps the caps). Every connection to the store
// takes a slot of s.slots first (a loop: only if one is free at once; goroutines: waiting up to
// timeouts.upstream-dial) and gives it back when the connection ends (conn.end), which every path
// reaches exactly once.

// storeLimitGauge is the cap in all for the store_connections_limit gauge: +Inf for none.
func (s *Server) storeLimitGauge() float64 {
	if n := s.slots.Limit(); n > 0 {
		return float64(n)
	}
	return math.Inf(1)
}

// refuseStore counts and records a client closed for want of a store connection.
func (s *Server) refuseStore(c *conn, reason admission.Reason) {
	s.m.storeRefused.WithLabelValues(string(reason)).Inc()
	c.flow.decided(audit.VerdictRefused, string(reason), c.st.monitor)
	c.flow.ended(endedByGuard)
	e := s.ev.event(c.src, c.dst, audit.ActionDenied, string(reason))
	e.ConnID, e.TLS = c.id, c.cl.record()
	s.ev.write(e)
	s.storeCaps.Refused(s.now(), reason, c.st.cfg, c.id, c.src.String())
}
