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

// takeStoreSlot takes the connection's store slot if one is free at once and a dial token is
// there for it (event loops never wait).
func (c *conn) takeStoreSlot() bool {
	if c.storeSlot != nil {
		return true
	}
	slot, reason := c.s.slots.TryTake(c.src.Addr())
	if reason != "" {
		c.s.storeCaps.HeldBack(reason)
		return false
	}
	c.tookSlot(slot)
	return true
}

// awaitStoreSlot takes the connection's store slot, waiting up to timeouts.upstream-dial (or until
// drain ends) in StoreSlots' queue for a slot to free and a dial token to come due; the queue
// serves sources that serve a job first. It reports false, having counted and recorded the
// refusal, when none came: the client is then closed, which is not its violation (a job larger
// than the caps, or another source's flood, may be why). deferred: a freeze began first, and the
// connection asks again after it (or in the next process).
func (c *conn) awaitStoreSlot() (ok, deferred bool) {
	if c.storeSlot != nil {
		return true, false
	}
	src := c.src.Addr()
	slot, reason := c.s.slots.TryTake(src)
	if reason == "" {
		c.tookSlot(slot)
		return true, false
	}
	c.s.storeCaps.HeldBack(reason)
	c.s.m.storeQueued.WithLabelValues(string(reason)).Inc()
	ctx, cancel := c.s.waitFor(c.st.cfg.Timeouts.UpstreamDial)
	defer cancel()
	slot, reason = c.s.slots.Take(ctx, src, c.s.servingJob(src, c))
	switch {
	case reason == "":
		c.tookSlot(slot)
		return true, false
	case c.isClosed():
		return false, false // drain closed it
	case frozeFirst(ctx):
		return false, true
	}
	c.s.refuseStore(c, reason)
	return false, false
}

// tookSlot keeps the store slot the connection was granted, and has it paced by the store's
// answers to the connection.
func (c *conn) tookSlot(slot *admission.Slot) {
	c.storeSlot = slot
	c.rep.paceWith(slot)
}

// refuseStore counts and records a client closed for want of a store connection.
func (s *Server) refuseStore(c *conn, reason admission.Reason) {
	s.m.storeRefused.WithLabelValues(string(reason)).Inc()
	c.flow.decided(audit.VerdictRefused, string(reason), c.st.monitor)
	c.flow.ended(endedByGuard)
	e := s.ev.event(c.src, c.dst, audit.ActionDenied, string(reason))
	e.ConnID, e.TLS = c.id, c.tls.record()
	s.ev.write(e)
	s.storeCaps.Refused(s.now(), reason, c.st.cfg, c.id, c.src.String())
}
