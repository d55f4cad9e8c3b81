package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/nftset"
)

// The peer set (tls.peer-set): the addresses of the hosts that hold a connection whose mutual-TLS
// handshake passed, in a pair of nftables sets, so that the firewall can let only them reach the
// ports torch opens on a free port of this host (configs/nftables/storeguard-peers.nft): the ranks'
// store of torchrun's c10d rendezvous, gloo's listeners. An address goes in as its first
// handshake passes, is refreshed every quarter of tls.peer-set-timeout while it has a connection
// open, and leaves the set by itself a timeout after its last one ended (nftset). A process that
// takes connections over (an upgrade, a keeper's restart) refreshes them within a quarter timeout
// of its start, while the elements its predecessor refreshed still have three quarters left.

// peerSet keeps the sets: handshakes feed it (proved), a reload that revokes hosts takes them out
// (gone), and its loop refreshes every address with a mutual-TLS connection open (live).
type peerSet struct {
	proved    chan netip.Addr
	run       nftset.Runner
	conf      func() *settings    // the settings now (a reload changes them)
	live      func() []netip.Addr // the addresses with a mutual-TLS connection open now
	now       func() time.Time
	log       *slog.Logger
	every     everySecond // the refresh failure's log line
	updates   *prometheus.CounterVec
	addresses prometheus.Gauge
}

// peersQueued: addresses whose handshake passed, waiting for the refresher; beyond them, a
// new address waits for the next refresh (a quarter of tls.peer-set-timeout).
const peersQueued = 256

// peerSetCheckTimeout bounds each change to the sets.
const peerSetCheckTimeout = 10 * time.Second

// checkPeerSet fails unless both sets of cfg's tls.peer-set exist and run can reach them (nothing
// to check without one).
func checkPeerSet(cfg *config.Parsed, run nftset.Runner) error {
	sp, on := cfg.PeerSet()
	if !on {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), peerSetCheckTimeout)
	err := sp.Check(ctx, run)
	cancel()
	if err != nil {
		return fmt.Errorf("tls.peer-set %q: %w (create the sets first: storeguard firewall install peers, or configs/nftables/storeguard-peers.nft; storeguard needs CAP_NET_ADMIN)", cfg.Config().TLS.PeerSet, err)
	}
	return nil
}

// spec is the peer set of the settings now, and their TLS section; false when there is none.
func (p *peerSet) spec() (nftset.Spec, config.TLS, bool) {
	st := p.conf()
	sp, on := st.parsed.PeerSet()
	return sp, st.cfg.TLS, on
}

// tlsNow is the TLS section of the settings now.
func (p *peerSet) tlsNow() config.TLS { return p.conf().cfg.TLS }

// provedBy tells the refresher that a handshake from a passed; it never waits.
func (p *peerSet) provedBy(a netip.Addr) {
	if p.tlsNow().PeerSet == "" {
		return
	}
	select {
	case p.proved <- a:
	default: // the next refresh takes it
	}
}

// loop keeps the peer set until ctx ends: every address a handshake proved at once (unless it was
// refreshed less than a quarter timeout ago), and every address with a connection open each
// quarter timeout, the first time as it starts.
func (p *peerSet) loop(ctx context.Context) {
	quarter := func() time.Duration {
		if t := p.tlsNow().PeerSetTimeout; t >= 4*time.Second {
			return t / 4
		}
		return 30 * time.Second // a config made in code, without the key (Validate holds it to 4s or more)
	}
	period := quarter()
	tick := time.NewTicker(period)
	defer tick.Stop()
	renewed := map[netip.Addr]time.Time{} // when each address last got its full timeout
	refresh := func(addrs []netip.Addr, all bool) {
		sp, tc, on := p.spec()
		if !on {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, peerSetCheckTimeout)
		err := sp.Refresh(rctx, p.run, addrs, tc.PeerSetTimeout)
		cancel()
		now := p.now()
		if err != nil {
			p.updates.WithLabelValues("failed").Inc()
			if p.every.allow(now) {
				p.log.Error("tls.peer-set: cannot refresh the peer set; hosts whose handshake passed may be kept off this host's free ports",
					"set", tc.PeerSet, "addresses", len(addrs), "err", err)
			}
			return
		}
		if len(addrs) > 0 {
			p.updates.WithLabelValues("ok").Inc()
		}
		for _, a := range addrs {
			renewed[a] = now
		}
		if all {
			p.addresses.Set(float64(len(addrs)))
			for a, t := range renewed {
				if now.Sub(t) > tc.PeerSetTimeout {
					delete(renewed, a)
				}
			}
		}
	}
	on := func() bool { return p.tlsNow().PeerSet != "" } // else the registry is not walked
	if on() {
		refresh(p.live(), true)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if q := quarter(); q != period { // a reload changed the timeout
				period = q
				tick.Reset(q)
			}
			if on() {
				refresh(p.live(), true)
			}
		case a := <-p.proved:
			fresh := []netip.Addr{}
			now := p.now()
			for more := true; more; {
				if t, ok := renewed[a]; !ok || now.Sub(t) >= period {
					fresh = append(fresh, a)
				}
				select {
				case a = <-p.proved:
				default:
					more = false
				}
			}
			if len(fresh) > 0 {
				refresh(fresh, false)
			}
		}
	}
}

// gone takes addrs, hosts a reload revoked with no other mutual-TLS connection open, out of the
// peer set at once, on a goroutine of its own (a reload never waits for netlink).
func (p *peerSet) gone(addrs []netip.Addr) {
	sp, tc, on := p.spec()
	if len(addrs) == 0 || !on {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), peerSetCheckTimeout)
		defer cancel()
		if err := sp.Remove(ctx, p.run, addrs); err != nil {
			p.updates.WithLabelValues("failed").Inc()
			p.log.Error("tls.peer-set: cannot take revoked hosts out of the peer set", "set", tc.PeerSet,
				"addresses", len(addrs), "err", err)
			return
		}
		p.updates.WithLabelValues("ok").Inc()
	}()
}

// tlsAddrs is the addresses with a mutual-TLS connection open now.
func (r *registry) tlsAddrs() []netip.Addr {
	seen := map[netip.Addr]struct{}{}
	r.mu.Lock()
	for c := range r.conns {
		if c.cl.proved() {
			seen[c.src.Addr()] = struct{}{}
		}
	}
	r.mu.Unlock()
	out := make([]netip.Addr, 0, len(seen))
	for a := range seen {
		out = append(out, a)
	}
	return out
}
