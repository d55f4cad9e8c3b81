// Package connect is the client guard (storeguard connect): on a host without the store, it
// takes the ranks' plaintext connections to the master (on a local port, or transparently: an
// nftables/iptables OUTPUT rule redirects connections to MASTER_ADDR:MASTER_PORT to it, and the
// kernel keeps where they were going) and carries each to the master's guard over mutual TLS
// 1.3, through a relay (tlsrelay) whose state is data. It judges nothing: the master's guard
// judges every byte; it proves this host's identity and checks the master's.
package connect

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/internal/origdst"
	"github.com/storeguard/storeguard/keeper"
	"github.com/storeguard/storeguard/tlsrec"
	"github.com/storeguard/storeguard/tlsrelay"
)

// Options configure a client guard.
type Options struct {
	Listen string // where ranks' connections arrive
	// Server is the master guard's address; with Transparent and no Server, each connection goes
	// where its rank sent it (SO_ORIGINAL_DST).
	Server      string
	Transparent bool
	// Mark is set (SO_MARK) on the connections to the master, so that the redirect rule lets
	// them pass; 0: none (the rule skips this process's uid instead).
	Mark        int
	Identity    identity.Source
	Allow       identity.Allow // the identities the master's guard may have
	KeyExchange []tls.CurveID  // the key exchange groups, most preferred first; nil: crypto/tls's
	// Resumption: resume sessions with the master's guard from the tickets it sends (its
	// certificate is still checked on each); off, every connection makes a full handshake.
	Resumption       bool
	HandshakeTimeout time.Duration
	DialTimeout      time.Duration
	Log              *slog.Logger
	// Keeper, when set, holds a copy of every relay's two sockets and its state (a shared
	// ledger), and starts another process with them if this one dies (keeper_linux.go).
	Keeper *keeper.Link
}

// Stats are a client guard's counters.
type Stats struct {
	Accepted, Relayed, Refused, HandshakeFailed, DialFailed atomic.Uint64
	Resumed                                                 atomic.Uint64 // handshakes that resumed a session
	Active                                                  atomic.Int64
}

// Client is a client guard.
type Client struct {
	opt    Options
	ln     *net.TCPListener
	Stats  Stats
	nextID atomic.Uint64    // the relays' ids
	ledger *tlsrelay.Ledger // the relays' state: shared with the keeper, or nil (each relay its own)
	// sessions are the master guards' tickets (Options.Resumption), by server name, under this
	// guard's certificate of the moment; nil: no resumption.
	sessions *identity.SessionCache

	mu     sync.Mutex
	relays map[*tlsrelay.Relay]relayInfo
	wg     sync.WaitGroup
	// An upgrade in place (upgrade_linux.go): frozen stops accepting and starting relays;
	// starting counts connections between accept and their relay's start, which a freeze waits
	// for; handedOver is closed once the next process has everything.
	frozen     bool
	starting   int
	thawed     chan struct{}
	handedOver chan struct{}
	handOnce   sync.Once
}

type relayInfo struct {
	id       uint64
	src, dst netip.AddrPort
	peer     string
}

// New listens on opt.Listen.
func New(opt Options) (*Client, error) {
	if opt.Identity == nil {
		return nil, errors.New("connect: no identity (tls.cert-file, tls.key-file, tls.ca-file or tls.spiffe-socket)")
	}
	if opt.Server == "" && !opt.Transparent {
		return nil, errors.New("connect: --server is required without --transparent")
	}
	ln, err := net.Listen("tcp", opt.Listen)
	if err != nil {
		return nil, err
	}
	c := newClient(opt, ln.(*net.TCPListener))
	if err := c.shareLedger(); err != nil {
		ln.Close()
		return nil, err
	}
	return c, nil
}

func newClient(opt Options, ln *net.TCPListener) *Client {
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.HandshakeTimeout <= 0 {
		opt.HandshakeTimeout = 5 * time.Second
	}
	if opt.DialTimeout <= 0 {
		opt.DialTimeout = 10 * time.Second
	}
	c := &Client{opt: opt, ln: ln, relays: make(map[*tlsrelay.Relay]relayInfo), handedOver: make(chan struct{})}
	if opt.Resumption {
		c.sessions = identity.NewSessionCache(opt.Identity, sessionsCached)
	}
	return c
}

// Addr is where the client guard listens.
func (c *Client) Addr() net.Addr { return c.ln.Addr() }

// Serve accepts ranks' connections until ctx ends, then closes the listener and waits for the
// relays under way to end (at most drain; then they are closed).
func (c *Client) Serve(ctx context.Context, drain time.Duration) error {
	stop := context.AfterFunc(ctx, func() { c.ln.Close() })
	defer stop()
	for {
		tc, err := c.ln.AcceptTCP()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				break
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() { // an upgrade paused accepting
				if c.awaitThaw(ctx) {
					continue
				}
				return nil // handed over: the relays are the next process's
			}
			c.opt.Log.Error("accept failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		c.Stats.Accepted.Add(1)
		c.wg.Add(1)
		c.mu.Lock()
		c.starting++
		c.mu.Unlock()
		go c.handle(tc)
	}
	select {
	case <-c.handedOver:
		return nil
	default:
	}
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drain):
		c.closeRelays()
		<-done
	}
	return nil
}

// target is where a rank's connection goes: --server, or where the rank sent it.
func (c *Client) target(tc *net.TCPConn) (string, error) {
	if c.opt.Server != "" {
		return c.opt.Server, nil
	}
	dst := origdst.Of(tc)
	local := tc.LocalAddr().(*net.TCPAddr).AddrPort()
	// A wildcard listener's local address is IPv4-in-IPv6 while SO_ORIGINAL_DST says IPv4: unmapped,
	// a connection made to this guard itself (not redirected) is refused, never dialled again.
	if !dst.IsValid() || (dst.Addr().Unmap() == local.Addr().Unmap() && dst.Port() == local.Port()) {
		return "", errors.New("not redirected: no original destination (connect --transparent takes only connections the OUTPUT rule redirected)")
	}
	return dst.String(), nil
}

func (c *Client) handle(tc *net.TCPConn) {
	defer c.wg.Done()
	started := false
	defer func() {
		if !started {
			c.started(nil, relayInfo{})
		}
	}()
	src := tc.RemoteAddr().(*net.TCPAddr).AddrPort()
	addr, err := c.target(tc)
	if err != nil {
		c.Stats.Refused.Add(1)
		c.opt.Log.Warn("connection refused", "src", src.String(), "err", err)
		tc.Close()
		return
	}
	up, sess, cs, err := c.reach(addr)
	if err != nil {
		c.opt.Log.Warn("cannot reach the master's guard over mutual TLS; closing the rank's connection", "server", addr,
			"reason", string(identity.Classify(err)), "err", err)
		tc.Close()
		return
	}
	peer := identity.PeerOf(cs.PeerCertificates[0])
	id := c.nextID.Add(1)
	r, err := tlsrelay.New(up, tc, sess, c.ledger, id)
	if err != nil {
		c.opt.Log.Warn("cannot start the relay; closing the rank's connection", "err", err)
		up.Close()
		tc.Close()
		return
	}
	started = true
	c.started(r, relayInfo{id: id, src: src, dst: up.RemoteAddr().(*net.TCPAddr).AddrPort(), peer: peer.ID})
	c.Stats.Relayed.Add(1)
	if cs.DidResume {
		c.Stats.Resumed.Add(1)
	}
}

// started ends a connection's start: its relay r (nil: it failed) runs, tracked until it ends.
func (c *Client) started(r *tlsrelay.Relay, info relayInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starting--
	if r != nil {
		c.relays[r] = info
		c.keep(r, info)
		c.run(r, info.id)
	}
}

// run starts r, counted among the active relays until it ends. Under c.mu.
func (c *Client) run(r *tlsrelay.Relay, id uint64) {
	c.Stats.Active.Add(1)
	c.wg.Add(1)
	r.OnEnd = func(error) {
		select {
		case <-c.handedOver: // the next process has its sockets, and the keeper keeps them for it
		default:
			c.opt.Keeper.Ended(id)
		}
		c.Stats.Active.Add(-1)
		c.untrack(r)
		c.wg.Done()
	}
	r.Run()
}

// sessionsCached is how many master guards' tickets a client guard keeps: one per master it
// reaches (a transparent guard may reach several jobs' masters).
const sessionsCached = 64

// attempts is how many times a connection to the master's guard is tried: the rank's bytes wait
// in its socket meanwhile, so a master guard that restarts or upgrades (and cuts a handshake
// short) costs the rank a delay, not its connection.
const attempts = 6

// reach connects to the master's guard at addr and completes mutual TLS, trying again after a
// refused connection or a handshake cut short; never after the master's certificate was refused.
func (c *Client) reach(addr string) (*net.TCPConn, *tlsrec.Session, tls.ConnectionState, error) {
	host, _, _ := net.SplitHostPort(addr)
	cfg := identity.ClientConfig(c.opt.Identity, c.opt.Allow, host)
	cfg.CurvePreferences = c.opt.KeyExchange
	if c.sessions != nil {
		cfg.ClientSessionCache = c.sessions
	}
	wait := 50 * time.Millisecond
	for i := 1; ; i++ {
		up, err := c.dial(addr)
		if err != nil {
			c.Stats.DialFailed.Add(1)
		} else {
			sess, cs, herr := tlsrec.Client(up, cfg, time.Now().Add(c.opt.HandshakeTimeout))
			if herr == nil {
				return up, sess, cs, nil
			}
			up.Close()
			c.Stats.HandshakeFailed.Add(1)
			err = herr
			if r := identity.Classify(herr); r != identity.BadHandshake && r != identity.Timeout {
				return nil, nil, cs, err // the master's certificate was refused: trying again changes nothing
			}
		}
		if i == attempts {
			return nil, nil, tls.ConnectionState{}, err
		}
		time.Sleep(wait)
		wait *= 2
	}
}

// closeRelays closes every relay at once.
func (c *Client) closeRelays() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for r := range c.relays {
		r.Close()
	}
}

func (c *Client) untrack(r *tlsrelay.Relay) {
	c.mu.Lock()
	delete(c.relays, r)
	c.mu.Unlock()
}

// dial connects to the master's guard, marked so that the redirect lets it pass.
func (c *Client) dial(addr string) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: c.opt.DialTimeout}
	if c.opt.Mark != 0 {
		mark := c.opt.Mark
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) { serr = setMark(int(fd), mark) })
			if err == nil {
				err = serr
			}
			if err != nil {
				return fmt.Errorf("SO_MARK %#x (needs CAP_NET_ADMIN): %w", mark, err)
			}
			return nil
		}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return nc.(*net.TCPConn), nil
}

// ParseMark reads a mark given as decimal or 0x hex.
func ParseMark(s string) (int, error) {
	n, err := strconv.ParseInt(s, 0, 32)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("mark %q: want a number such as 0x5347", s)
	}
	return int(n), nil
}
