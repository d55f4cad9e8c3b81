package admission

import "net/netip"

// Counter counts what client sources hold, in all and per source, against a cap in all and a
// share per source (0: none of either): store connections (StoreSlots, one a connection) and the
// bytes a connection buffers (proxy's budget). It only counts and says which cap a take would
// pass; its owner locks it and decides how takers wait.
type Counter struct {
	limit, perSrc int64
	used          int64
	bySource      map[netip.Addr]int64
}

// Cap names the cap of a Counter that a take would pass.
type Cap int8

const (
	NoCap     Cap = iota // within both
	SourceCap            // the source's share
	TotalCap             // the cap in all
)

// NewCounter caps what is held at limit in all and perSource per source (0: no cap).
func NewCounter(limit, perSource int64) Counter {
	return Counter{limit: limit, perSrc: perSource, bySource: map[netip.Addr]int64{}}
}

// Exceeds says which cap src taking n more would pass, its share first, for a taker that holds
// own already (counted in it). A take larger than a cap passes once nothing but the taker's own
// is held (of the source's, for its share), so that no cap smaller than one take can deadlock.
func (c *Counter) Exceeds(src netip.Addr, n, own int64) Cap {
	if held := c.bySource[src]; c.perSrc > 0 && held+n > c.perSrc && held > own {
		return SourceCap
	}
	if c.limit > 0 && c.used+n > c.limit && c.used > own {
		return TotalCap
	}
	return NoCap
}

// Full reports whether the cap in all keeps any source from taking one more (Exceeds' TotalCap for
// a taker that holds none).
func (c *Counter) Full() bool { return c.limit > 0 && c.used+1 > c.limit && c.used > 0 }

// Take counts n more for src, whatever the caps say.
func (c *Counter) Take(src netip.Addr, n int64) {
	c.used += n
	c.bySource[src] += n
}

// Release counts n less for src; a source that holds nothing is forgotten.
func (c *Counter) Release(src netip.Addr, n int64) {
	c.used -= n
	if c.bySource[src] -= n; c.bySource[src] <= 0 {
		delete(c.bySource, src)
	}
}

// SetLimits changes the caps (0: none); what is held stays held.
func (c *Counter) SetLimits(limit, perSource int64) { c.limit, c.perSrc = limit, perSource }

// Holds is what src holds.
func (c *Counter) Holds(src netip.Addr) int64 { return c.bySource[src] }

// Used is what is held in all.
func (c *Counter) Used() int64 { return c.used }

// Limit is the cap in all; 0: none.
func (c *Counter) Limit() int64 { return c.limit }
