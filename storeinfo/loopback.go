package storeinfo

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/config"
)

// A torch 2.6+ store looks up the name of every connection's peer (getnameinfo), in the one thread
// that serves every rank. Behind the guard that peer is the guard, on loopback. torch listens on
// [::] (IPv6, dual stack), so a connection from 127.0.0.1 reaches it as ::ffff:127.0.0.1: no
// /etc/hosts names that address (Debian's and Kubernetes' name 127.0.0.1 and ::1), so each lookup
// asks DNS, and a resolver that stalls stalls the store for every rank (docs/scaling.md). From
// ::1 the store's lookup is answered by /etc/hosts. With upstream-loopback: auto, Route dials
// [::1] at upstream's port when upstream is an IPv4 loopback address, the store listens for it
// only on [::] (no IPv4 socket takes 127.0.0.1 at that port) and this host has ::1.

// hostsFile is the hosts file the store's lookups read; tests point it at a fixture.
var hostsFile = "/etc/hosts"

// Route is where the guard dials the store.
type Route struct {
	Dial  string         // host:port for net.Dial
	Local netip.AddrPort // Dial as an address of this host's loopback; invalid when it is not one
	// Seen is the guard's address as the store sees it, when the store listens on this host
	// (invalid otherwise): what its lookup of the peer's name asks about.
	Seen netip.Addr
}

// chooseRoute is the route to upstream (host:port) under mode, given the listening sockets of this
// network namespace and whether it has ::1; listening reports whether the store's socket is there
// (the choice may change once it is).
func chooseRoute(upstream string, mode config.UpstreamLoopback, ls []procListener, have6 bool) (r Route, listening bool) {
	r.Dial = upstream
	ap, err := netip.ParseAddrPort(upstream)
	if err != nil || !ap.Addr().Unmap().IsLoopback() {
		return r, false
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	r.Local = ap
	// v4: an IPv4 socket takes the connection to ap (procListeners unmaps one bound to ::ffff:127.x);
	// v6: an IPv6 wildcard or ::1 one is there.
	var v4, v6 bool
	for _, l := range ls {
		a := l.addr.Addr()
		switch {
		case l.addr.Port() != ap.Port():
		case a.Is4() && (a == ap.Addr() || a.IsUnspecified()):
			v4 = true
		case a.Is6() && (a.IsUnspecified() || a == netip.IPv6Loopback()):
			v6 = true
		}
	}
	switch {
	case ap.Addr().Is6():
		r.Seen = ap.Addr()
	case v4:
		r.Seen = ap.Addr()
	case v6 && mode == config.UpstreamLoopbackAuto && have6:
		r.Local = netip.AddrPortFrom(netip.IPv6Loopback(), ap.Port())
		r.Dial, r.Seen = r.Local.String(), netip.IPv6Loopback()
	case v6:
		r.Seen = netip.AddrFrom16(ap.Addr().As16()) // ::ffff:127.x
	}
	return r, v4 || v6
}

// hasIPv6Loopback reports whether this network namespace's lo has ::1.
func hasIPv6Loopback() bool {
	b, err := os.ReadFile(procRoot + "/self/net/if_inet6")
	return err == nil && strings.Contains(string(b), "00000000000000000000000000000001")
}

// hostsNames reports whether the hosts file has a line for a (compared as written there:
// ::ffff:127.0.0.1 is not 127.0.0.1).
func hostsNames(a netip.Addr) bool {
	f, err := os.Open(hostsFile)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		if h, err := netip.ParseAddr(fields[0]); err == nil && h == a {
			return true
		}
	}
	return false
}

// Router keeps the route to the store: chosen anew on Set (the settings changed), then every
// listenEvery while the store is not listening yet, and every storeLimitEvery after.
type Router struct {
	settings func() config.Config
	log      *slog.Logger
	route    atomic.Pointer[Route]
	mu       sync.Mutex // one choice at a time; the fields below are under it
	known    bool       // the store was listening at the last choice
	said     string     // what was last logged
}

// NewRouter chooses the route now, for settings' upstream.
func NewRouter(settings func() config.Config, log *slog.Logger) *Router {
	r := &Router{settings: settings, log: log}
	r.refresh()
	return r
}

// Route is the route to dial now.
func (r *Router) Route() *Route { return r.route.Load() }

// Set chooses the route again, for cfg (a reload's, once the server holds it).
func (r *Router) Set(cfg config.Config) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setLocked(cfg)
}

// refresh chooses the route again for the settings as they are once it holds mu: a reload's Set
// that comes after is not undone by an older reading.
func (r *Router) refresh() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setLocked(r.settings())
}

func (r *Router) setLocked(cfg config.Config) {
	rt, listening := chooseRoute(cfg.Upstream, cfg.UpstreamLoopback, procListeners(), hasIPv6Loopback())
	r.known = listening
	r.route.Store(&rt)
	if !listening {
		return
	}
	var say string
	level := slog.LevelInfo
	if rt.Dial != cfg.Upstream {
		v4 := netip.MustParseAddrPort(cfg.Upstream).Addr().Unmap()
		say = fmt.Sprintf("upstream-loopback auto: dialing the store at %s: it listens on [::] only, and would see a "+
			"connection from %s as %s, which no hosts file names: its lookup of each peer (torch 2.6+) would ask DNS",
			rt.Dial, v4, netip.AddrFrom16(v4.As16()))
	}
	if rt.Seen.IsValid() && !hostsNames(rt.Seen) {
		level = slog.LevelWarn
		say = strings.TrimPrefix(say+"; ", "; ") + fmt.Sprintf("the store sees storeguard as %s, which %s does not "+
			"name: its lookup of each connection's peer (torch 2.6+) asks DNS, in the thread that serves every rank; "+
			"add a line \"%s localhost\" to %s", rt.Seen, hostsFile, rt.Seen, hostsFile)
	}
	if say != "" && say != r.said {
		r.log.Log(context.Background(), level, say, "upstream", cfg.Upstream)
	}
	r.said = say
}

// Run chooses the route again until ctx ends: every listenEvery until the store listens (a sidecar
// guard starts before torch's store), every storeLimitEvery after.
func (r *Router) Run(ctx context.Context) {
	for {
		r.mu.Lock()
		every := readAgain(r.known)
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		r.refresh()
	}
}
