package proxy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
)

// Store connections are capped (caps.max-store-connections, caps.per-source-store-connections)
// below what the store can hold: torch 1.13 aborts on EMFILE, and 1,010 connections that each sent
// one valid message were enough for a store with the usual soft RLIMIT_NOFILE of 1024. Every
// connection to the store takes a slot of s.slots first (a loop: only if one is free at once;
// goroutines: waiting up to timeouts.upstream-dial) and gives it back when the connection ends
// (conn.end), which every path reaches exactly once.

const (
	// storeReserve is what auto leaves of the store's descriptor limit for its own files and
	// listening sockets (a torch 1.13 store holds 14) and for the ranks that reach it directly
	// (on its own host, in the transparent deployment).
	storeReserve = 128
	// storeMargin is what auto leaves over the descriptors the store holds besides the guard's
	// connections, when those need more than storeReserve: they may grow between two readings.
	storeMargin = 64
	// storeFloor is the least auto caps store connections at (less where the store's limit less
	// storeReserve is less). What the store holds besides the guard's connections lowers the cap
	// down to here only. Those are its own files and the connections that reach it directly, which
	// only its own host can open (the deployment kit drops the rest): a local user who opens
	// enough of them exhausts the store by himself, guard or not, and the cap cannot prevent it;
	// without the floor each one he held also took a store connection from the remote ranks
	// (700 idle direct connections cut the cap from 896 to 248), a quiet denial of service that
	// never troubles the store. 256 is one source's default share
	// (caps.per-source-store-connections): the job's hosts keep at least one host's worth.
	storeFloor = 256
	// fallbackStoreConnections is auto's cap when the store's limit cannot be read: the usual
	// soft limit, 1024, less the reserve.
	fallbackStoreConnections = 1024 - storeReserve
	// storeLimitEvery is how often auto reads the store's process again.
	storeLimitEvery = 10 * time.Second
	// storeLimitRetry is the shortest time between two readings a full cap asks for.
	storeLimitRetry = time.Second
)

// autoStoreLimit is caps.max-store-connections: auto for a store whose soft RLIMIT_NOFILE is soft
// (-1: unlimited) and that holds open descriptors now, ours of them connections from the guard.
// 0 is no cap; floored: the store's other descriptors would have it lower than storeFloor.
func autoStoreLimit(soft int64, open, ours int) (limit int, floored bool) {
	if soft < 0 {
		return 0, false
	}
	soft = min(soft, math.MaxInt32)
	left := soft - int64(max(storeReserve, open-ours+storeMargin))
	floor := min(storeFloor, soft-storeReserve)
	return int(max(1, left, floor)), left < floor
}

// storeProcess is what auto learned of the store's process.
type storeProcess struct {
	pid   int
	inode uint64 // of its listening socket
	soft  int64  // -1: unlimited
	open  int
}

// errNotListening: nothing on this host listens on the upstream address (yet).
var errNotListening = errors.New("nothing listens on the upstream address on this host (yet)")

// findStore finds the process that listens on upstream, on this host, and reads its descriptor
// limit; last is what it found last time: while the listening socket is the same one, so is its
// process (its descriptors are not looked through again).
func findStore(upstream string, last storeProcess) (storeProcess, error) {
	host, portStr, err := net.SplitHostPort(upstream)
	if err != nil {
		return storeProcess{}, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return storeProcess{}, err
	}
	addrs, err := hostAddrs(host)
	if err != nil {
		return storeProcess{}, err
	}
	var inode uint64
	for _, l := range procListeners() {
		if uint64(l.addr.Port()) != port {
			continue
		}
		for _, a := range addrs {
			if l.addr.Addr() == a || l.addr.Addr().IsUnspecified() {
				inode = l.inode
			}
		}
	}
	if inode == 0 {
		return storeProcess{}, errNotListening
	}
	pid := last.pid
	if inode != last.inode || pid <= 0 {
		if pid, err = socketOwner(inode, pid); err != nil {
			return storeProcess{}, fmt.Errorf("the store's listening socket: %w", err)
		}
	}
	soft, open, err := procFiles(pid)
	if err != nil {
		return storeProcess{}, fmt.Errorf("the store's process %d: %w", pid, err)
	}
	return storeProcess{pid: pid, inode: inode, soft: soft, open: open}, nil
}

// errRemote: the upstream is not an address of this host.
var errRemote = errors.New("the store is not on this host")

// hostAddrs resolves host to its addresses and keeps those of this host; errRemote if none is.
func hostAddrs(host string) ([]netip.Addr, error) {
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a.Unmap()}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		found, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, err
		}
		for _, a := range found {
			addrs = append(addrs, a.Unmap())
		}
	}
	ifAddrs, _ := net.InterfaceAddrs()
	var local []netip.Addr
	for _, a := range addrs {
		if a.IsLoopback() || a.IsUnspecified() {
			local = append(local, a)
			continue
		}
		for _, ia := range ifAddrs {
			if p, ok := ia.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(p.IP); ok && ip.Unmap() == a {
					local = append(local, a)
				}
			}
		}
	}
	if len(local) == 0 {
		return nil, errRemote
	}
	return local, nil
}

// storeLimiter keeps the caps of s.slots: as configured, or auto's, from the store's process.
// Only watchStoreLimit's goroutine uses its fields.
type storeLimiter struct {
	last storeProcess // the store's process, last found
	note string       // what was last logged about where the cap comes from
}

// watchStoreLimit sets the store-connection caps now, again every storeLimitEvery, after a reload,
// and when a client finds the cap full (at most every storeLimitRetry), until ctx ends. Accepting
// does not wait for the first reading (looking through /proc took up to 170 ms on a loaded host):
// until then auto's cap is fallbackStoreConnections, and clients past it wait for the reading.
func (s *Server) watchStoreLimit(ctx context.Context) {
	t := time.NewTicker(storeLimitEvery)
	defer t.Stop()
	s.applyStoreLimit()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.storeLimitKick:
			select { // a full cap asks again at most every storeLimitRetry
			case <-ctx.Done():
				return
			case <-time.After(storeLimitRetry):
			}
		}
		s.applyStoreLimit()
	}
}

// kickStoreLimit asks watchStoreLimit to read the store's limit again soon.
func (s *Server) kickStoreLimit() {
	select {
	case s.storeLimitKick <- struct{}{}:
	default:
	}
}

// applyStoreLimit sets the caps of s.slots from the configuration, reading the store's process
// for auto, and logs where the cap comes from when that changes.
func (s *Server) applyStoreLimit() {
	caps := s.set.Load().cfg.Caps
	limit, note, warn := caps.MaxStoreConnections.N, "", false
	attrs := []any{}
	if caps.MaxStoreConnections.Auto {
		p, err := findStore(s.set.Load().cfg.Upstream, s.limiter.last)
		s.limiter.last = p
		switch {
		case err == nil:
			var floored bool
			limit, floored = autoStoreLimit(p.soft, p.open, s.slots.InUse())
			attrs = append(attrs, "store_files_open", p.open)
			soft := fmt.Sprint(p.soft)
			if p.soft < 0 {
				soft = "unlimited"
			}
			note = fmt.Sprintf("caps.max-store-connections auto: the store (pid %d) may open %s files; "+
				"store connections are capped at that less what it holds besides the guard's and a reserve", p.pid, soft)
			if floored {
				warn = true
				note = fmt.Sprintf("caps.max-store-connections auto: the store (pid %d) holds so many files besides "+
					"the guard's connections (its own, and connections made to it directly, not through the guard) "+
					"that store connections stay at the floor of %d", p.pid, limit)
			}
		case errors.Is(err, errNotListening):
			limit = fallbackStoreConnections
			note = fmt.Sprintf("caps.max-store-connections auto: the store is not listening yet; "+
				"store connections are capped at %d until it is", limit)
		default:
			limit, warn = fallbackStoreConnections, true
			note = fmt.Sprintf("caps.max-store-connections auto: cannot read the store's descriptor limit (%v); "+
				"store connections are capped at %d: set caps.max-store-connections if the store can hold more", err, limit)
		}
	}
	s.slots.SetLimits(limit, caps.PerSourceStoreConnections)
	if note != "" && note != s.limiter.note {
		attrs = append(attrs, "limit", limit)
		if warn {
			s.log.Warn(note, attrs...)
		} else {
			s.log.Info(note, attrs...)
		}
	}
	s.limiter.note = note
}

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
	release, reason := c.s.slots.TryTake(c.src.Addr())
	if reason != "" {
		c.s.heldBack(reason)
		return false
	}
	c.storeSlot = release
	return true
}

// heldBack asks for the store's descriptor limit to be read again when a cap held a client back
// (auto may raise it); a dial rate needs no reading, its tokens come due.
func (s *Server) heldBack(reason admission.Reason) {
	if reason == admission.MaxStoreConnections || reason == admission.SourceStoreConnections {
		s.kickStoreLimit()
	}
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
	release, reason := c.s.slots.TryTake(src)
	if reason == "" {
		c.storeSlot = release
		return true, false
	}
	c.s.heldBack(reason)
	c.s.m.storeQueued.WithLabelValues(string(reason)).Inc()
	ctx, cancel := c.s.waitFor(c.st.cfg.Timeouts.UpstreamDial)
	defer cancel()
	release, reason = c.s.slots.Take(ctx, src, c.s.servingJob(src, c))
	switch {
	case reason == "":
		c.storeSlot = release
		return true, false
	case c.isClosed():
		return false, false // drain closed it
	case frozeFirst(ctx):
		return false, true
	}
	c.s.refuseStore(c, reason)
	return false, false
}

// refuseStore counts and records a client closed for want of a store connection.
func (s *Server) refuseStore(c *conn, reason admission.Reason) {
	s.m.storeRefused.WithLabelValues(string(reason)).Inc()
	c.decided(audit.VerdictRefused, string(reason))
	c.ended(endedByGuard)
	e := s.event(c.src, c.dst, audit.ActionDenied, string(reason))
	e.ConnID = c.id
	s.writeAudit(e)
	if s.storeCapLog.allow(s.now()) {
		key, limit := storeHold(reason, c.st.cfg.Caps, s.slots.Limit())
		s.log.Warn("closing a client that waited timeouts.upstream-dial for a store connection: "+key+
			" held it back (not a violation; logged at most once a second)", "conn", c.id, "source", c.src.String(),
			"limit", limit, "waited", c.st.cfg.Timeouts.UpstreamDial.String())
	}
}

// storeHold names the setting behind a reason a client got no store connection, and its value
// (limit: the cap in all in effect).
func storeHold(reason admission.Reason, caps config.Caps, limit int) (key string, value float64) {
	switch reason {
	case admission.SourceStoreConnections:
		return "caps.per-source-store-connections", float64(caps.PerSourceStoreConnections)
	case admission.StoreDialRate:
		return "caps.store-dial-rate", caps.StoreDialRate
	case admission.SourceStoreDialRate:
		return "caps.per-source-store-dial-rate", caps.PerSourceStoreDialRate
	}
	return "caps.max-store-connections", float64(limit)
}
