package storeinfo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/config"
)

// Store connections are capped (caps.max-store-connections, caps.per-source-store-connections)
// below what the store can hold: torch 1.13 aborts on EMFILE, and 1,010 connections that each sent
// one valid message were enough for a store with the usual soft RLIMIT_NOFILE of 1024. Limiter
// keeps the caps of the admission.StoreSlots every connection to the store takes a slot of.

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
	// FallbackConnections is auto's cap when the store's limit cannot be read (and before it is
	// first read): the usual soft limit, 1024, less the reserve.
	FallbackConnections = 1024 - storeReserve
	// storeLimitEvery is how often auto reads the store's process again.
	storeLimitEvery = 10 * time.Second
	// storeLimitRetry is the shortest time between two readings a full cap asks for.
	storeLimitRetry = time.Second
	// listenEvery is how often the store's listening socket is looked for until it is there (the
	// route, the accept queue's size): a sidecar guard starts before torch's store, and a job's
	// ranks come as soon as it listens.
	listenEvery = time.Second
)

// readAgain is when to read the store's listening socket again: soon while it is not there yet.
func readAgain(listening bool) time.Duration {
	if listening {
		return storeLimitEvery
	}
	return listenEvery
}

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
	ln, err := storeListener(upstream)
	if err != nil {
		return storeProcess{}, err
	}
	return listenersProcess(ln, last)
}

// storeListener finds the socket that listens on upstream, on this host.
func storeListener(upstream string) (procListener, error) {
	host, portStr, err := net.SplitHostPort(upstream)
	if err != nil {
		return procListener{}, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return procListener{}, err
	}
	addrs, err := hostAddrs(host)
	if err != nil {
		return procListener{}, err
	}
	var found procListener
	for _, l := range procListeners() {
		if uint64(l.addr.Port()) != port {
			continue
		}
		for _, a := range addrs {
			if l.addr.Addr() == a || l.addr.Addr().IsUnspecified() {
				found = l
			}
		}
	}
	if found.inode == 0 {
		return procListener{}, errNotListening
	}
	return found, nil
}

// listenersProcess finds the process that holds the listening socket ln and reads its descriptor
// limit; last as findStore's.
func listenersProcess(ln procListener, last storeProcess) (storeProcess, error) {
	pid := last.pid
	if ln.inode != last.inode || pid <= 0 {
		var err error
		if pid, err = socketOwner(ln.inode, pid); err != nil {
			return storeProcess{}, fmt.Errorf("the store's listening socket: %w", err)
		}
	}
	soft, open, err := procFiles(pid)
	if err != nil {
		return storeProcess{}, fmt.Errorf("the store's process %d: %w", pid, err)
	}
	return storeProcess{pid: pid, inode: ln.inode, soft: soft, open: open}, nil
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

// Limiter keeps the caps of a StoreSlots: as configured, or auto's, from the store's process.
type Limiter struct {
	slots    *admission.StoreSlots
	settings func() config.Config // the settings now
	log      *slog.Logger
	kick     chan struct{}
	refused  atomic.Int64 // the second a refusal was last logged (Refused)
	// Only Run's goroutine uses these.
	last  storeProcess // the store's process, last found
	early bool         // the store did not listen yet at the last reading
	note  string       // what was last logged about where the cap comes from
}

// NewLimiter keeps the caps of slots by settings, read anew each time; nothing is read of the
// store's process until Run.
func NewLimiter(slots *admission.StoreSlots, settings func() config.Config, log *slog.Logger) *Limiter {
	return &Limiter{slots: slots, settings: settings, log: log, kick: make(chan struct{}, 1)}
}

// Run sets the store-connection caps and the store's accept-queue size now, again every
// storeLimitEvery (every listenEvery until the store listens), after a reload (Kick), and when a client
// finds the cap full (HeldBack, at most every storeLimitRetry), until ctx ends. Accepting does not
// wait for the first reading (looking through /proc took up to 170 ms on a loaded host): until
// then auto's cap is FallbackConnections, and clients past it wait for the reading.
func (l *Limiter) Run(ctx context.Context) {
	t := time.NewTimer(storeLimitEvery)
	defer t.Stop()
	l.apply()
	for {
		t.Reset(readAgain(!l.early))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.kick:
			select { // a full cap asks again at most every storeLimitRetry
			case <-ctx.Done():
				return
			case <-time.After(storeLimitRetry):
			}
		}
		l.apply()
	}
}

// Kick asks Run to read the store's limit again soon.
func (l *Limiter) Kick() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// HeldBack asks for the store's descriptor limit to be read again when a cap held a client back
// (auto may raise it); a dial rate needs no reading, its tokens come due.
func (l *Limiter) HeldBack(reason admission.Reason) {
	if reason == admission.MaxStoreConnections || reason == admission.SourceStoreConnections {
		l.Kick()
	}
}

// apply sets the caps of l.slots from the configuration, reading the store's process for auto,
// and logs where the cap comes from when that changes.
func (l *Limiter) apply() {
	caps := l.settings().Caps
	limit, note, warn := caps.MaxStoreConnections.N, "", false
	attrs := []any{}
	ln, err := storeListener(l.settings().Upstream)
	l.early = errors.Is(err, errNotListening)
	l.slots.SetBacklog(ln.backlog)
	if caps.MaxStoreConnections.Auto {
		var p storeProcess
		if err == nil {
			p, err = listenersProcess(ln, l.last)
		}
		l.last = p
		switch {
		case err == nil:
			var floored bool
			limit, floored = autoStoreLimit(p.soft, p.open, l.slots.InUse())
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
			limit = FallbackConnections
			note = fmt.Sprintf("caps.max-store-connections auto: the store is not listening yet; "+
				"store connections are capped at %d until it is", limit)
		default:
			limit, warn = FallbackConnections, true
			note = fmt.Sprintf("caps.max-store-connections auto: cannot read the store's descriptor limit (%v); "+
				"store connections are capped at %d: set caps.max-store-connections if the store can hold more", err, limit)
		}
	}
	l.slots.SetLimits(limit, caps.PerSourceStoreConnections)
	if note != "" && note != l.note {
		attrs = append(attrs, "limit", limit)
		if warn {
			l.log.Warn(note, attrs...)
		} else {
			l.log.Info(note, attrs...)
		}
	}
	l.note = note
}

// Refused logs, at most once a second, that connection id from source was closed after waiting
// timeouts.upstream-dial of cfg for a store connection, naming the setting that held it back.
func (l *Limiter) Refused(now time.Time, reason admission.Reason, cfg config.Config, id uint64, source string) {
	if t, prev := now.Unix(), l.refused.Load(); t == prev || !l.refused.CompareAndSwap(prev, t) {
		return
	}
	key, limit := storeHold(reason, cfg.Caps, l.slots.Limit())
	l.log.Warn("closing a client that waited timeouts.upstream-dial for a store connection: "+key+
		" held it back (not a violation; logged at most once a second)", "conn", id, "source", source,
		"limit", limit, "waited", cfg.Timeouts.UpstreamDial.String())
}

// storeHold names the setting behind a reason a client got no store connection, and its value
// (limit: the cap in all in effect).
func storeHold(reason admission.Reason, caps config.Caps, limit int) (key string, value float64) {
	switch reason {
	case admission.SourceStoreConnections:
		return "caps.per-source-store-connections", float64(caps.PerSourceStoreConnections)
	case admission.StoreDialRate:
		return "caps.store-dial-rate", caps.StoreDialRate.Rate
	case admission.StorePacing:
		return "caps.store-dial-rate (auto: the store's pace; caps.store-dial-slow)", 0
	case admission.SourceStoreDialRate:
		return "caps.per-source-store-dial-rate", caps.PerSourceStoreDialRate
	}
	return "caps.max-store-connections", float64(limit)
}
