package proxy

import (
	"net/netip"
)

// Silent connections. A connection that has sent nothing costs the store nothing (it is connected
// at the first valid message), but it holds one of caps.max-connections: enough of them from many
// sources (40 addresses x 512, one IPv6 /64, a local user on loopback) and a new rank is refused.
// Nothing tells a flood from torch <= 2.0's callback connection, which never sends a byte, by its
// bytes; its count does: each callback connection has a working twin, the client's own connection,
// from the same host. So once max-connections are open, a new connection takes the place of the
// newest silent connection of a source that holds more silent connections than working ones plus
// caps.per-source-silent (room for ranks that have not sent their first message yet). A job's host
// is never over that; a flood's sources are, and lose their newest: an attacker that shares a job's
// address (NAT) cannot make the job's older callback connections go first. Evicting at the cap, not
// by a first-message deadline, frees a slot exactly when one is needed: a deadline leaves a rank
// that comes meanwhile refused, and a flood that reopens what closes keeps the table full.

// reasonSilentEvicted is the flow record's reason for a silent connection closed to admit another.
const reasonSilentEvicted = "silent_evicted"

// silentLink is a connection's place in its source's silent list while on (under registry.mu).
type silentLink struct {
	prev, next *conn
	on         bool
}

// silentSource is one source's connections that have sent nothing, oldest first.
type silentSource struct {
	newest *conn // the list's tail; conn.silent.prev leads to older ones
	n      int
}

// addSilentLocked indexes c, which has sent nothing, as its source's newest silent connection.
func (r *registry) addSilentLocked(c *conn) {
	src := c.src.Addr()
	ss := r.silent[src]
	if ss == nil {
		ss = &silentSource{}
		r.silent[src] = ss
	}
	c.silent.prev, c.silent.next, c.silent.on = ss.newest, nil, true
	if ss.newest != nil {
		ss.newest.silent.next = c
	}
	ss.newest = c
	ss.n++
	r.weighSilentLocked(src)
}

// dropSilentLocked takes c out of the index (it sent its first bytes, ended, or was evicted), if
// it is there.
func (r *registry) dropSilentLocked(c *conn) {
	if !c.silent.on {
		return
	}
	src := c.src.Addr()
	ss := r.silent[src]
	if c.silent.prev != nil {
		c.silent.prev.silent.next = c.silent.next
	}
	if c.silent.next != nil {
		c.silent.next.silent.prev = c.silent.prev
	} else {
		ss.newest = c.silent.prev
	}
	c.silent.prev, c.silent.next, c.silent.on = nil, nil, false
	if ss.n--; ss.n == 0 {
		delete(r.silent, src)
	}
	r.weighSilentLocked(src)
}

// weighSilentLocked files src among the sources a new connection may evict from, or takes it out,
// after its silent or its working connections changed: over when it holds more silent connections
// than its allowance (its working connections plus caps.per-source-silent).
func (r *registry) weighSilentLocked(src netip.Addr) {
	ss := r.silent[src]
	if ss != nil && ss.n > r.allowance(src) {
		r.over[src] = ss
		return
	}
	delete(r.over, src)
}

// spoke takes c out of the silent index at its first bytes.
func (r *registry) spoke(c *conn) {
	r.mu.Lock()
	r.dropSilentLocked(c)
	r.mu.Unlock()
}

// silentOver reports whether a source is over its allowance, so that a connection may be evicted.
func (r *registry) silentOver() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.over) > 0
}

// takeSilentOver takes the newest silent connection of a source over its allowance out of the
// index, to be evicted; nil when no source is over.
func (r *registry) takeSilentOver() *conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ss := range r.over {
		v := ss.newest
		r.dropSilentLocked(v)
		return v
	}
	return nil
}
