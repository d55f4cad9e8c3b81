// Package connect is the client guard (storeguard connect): on a host without the store, it
// takes the ranks' plaintext connections to the master (on a local port, or transparently: an
// nftables/iptables OUTPUT rule redirects connections to MASTER_ADDR:MASTER_PORT to it, and the
// kernel keeps where they were going) and carries each to the master's guard over mutual TLS
// 1.3, through a relay (tlsrelay) whose state is data. It judges nothing: the master's guard
// judges every byte; it proves this host's identity and checks the master's.
package connect

import (
	"context"
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
	Mark             int
	Identity         identity.Source
	Allow            identity.Allow // the identities the master's guard may have
	HandshakeTimeout time.Duration
	DialTimeout      time.Duration
	Log              *slog.Logger
}

// Stats are a client guard's counters.
type Stats struct {
	Accepted, Relayed, Refused, HandshakeFailed, DialFailed atomic.Uint64
	Active                                                  atomic.Int64
}

// Client is a client guard.
type Client struct {
	opt   Options
	ln    *net.TCPListener
	Stats Stats

	mu     sync.Mutex
	relays map[*tlsrelay.Relay]relayInfo
	wg     sync.WaitGroup
}

type relayInfo struct {
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
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.HandshakeTimeout <= 0 {
		opt.HandshakeTimeout = 5 * time.Second
	}
	if opt.DialTimeout <= 0 {
		opt.DialTimeout = 10 * time.Second
	}
	ln, err := net.Listen("tcp", opt.Listen)
	if err != nil {
		return nil, err
	}
	return &Client{opt: opt, ln: ln.(*net.TCPListener), relays: make(map[*tlsrelay.Relay]relayInfo)}, nil
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
			c.opt.Log.Error("accept failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		c.Stats.Accepted.Add(1)
		c.wg.Add(1)
		go c.handle(tc)
	}
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drain):
		c.mu.Lock()
		for r := range c.relays {
			r.Close()
		}
		c.mu.Unlock()
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
	if dst == local || !dst.IsValid() {
		return "", errors.New("not redirected: no original destination (connect --transparent takes only connections the OUTPUT rule redirected)")
	}
	return dst.String(), nil
}

func (c *Client) handle(tc *net.TCPConn) {
	defer c.wg.Done()
	src := tc.RemoteAddr().(*net.TCPAddr).AddrPort()
	addr, err := c.target(tc)
	if err != nil {
		c.Stats.Refused.Add(1)
		c.opt.Log.Warn("connection refused", "src", src.String(), "err", err)
		tc.Close()
		return
	}
	up, err := c.dial(addr)
	if err != nil {
		c.Stats.DialFailed.Add(1)
		c.opt.Log.Warn("cannot reach the master's guard; closing the rank's connection", "server", addr, "err", err)
		tc.Close()
		return
	}
	host, _, _ := net.SplitHostPort(addr)
	cfg := identity.ClientConfig(c.opt.Identity, c.opt.Allow, host)
	sess, cs, err := tlsrec.Client(up, cfg, time.Now().Add(c.opt.HandshakeTimeout))
	if err != nil {
		c.Stats.HandshakeFailed.Add(1)
		c.opt.Log.Warn("mutual TLS with the master's guard failed; closing the rank's connection", "server", addr,
			"reason", string(identity.Classify(err)), "err", err)
		up.Close()
		tc.Close()
		return
	}
	peer := identity.PeerOf(cs.PeerCertificates[0])
	r := tlsrelay.New(up, tc, sess)
	done := make(chan struct{})
	r.OnEnd = func(error) { close(done) }
	c.track(r, relayInfo{src: src, dst: up.RemoteAddr().(*net.TCPAddr).AddrPort(), peer: peer.ID})
	c.Stats.Relayed.Add(1)
	c.Stats.Active.Add(1)
	r.Run()
	<-done
	c.Stats.Active.Add(-1)
	c.untrack(r)
}

func (c *Client) track(r *tlsrelay.Relay, info relayInfo) {
	c.mu.Lock()
	c.relays[r] = info
	c.mu.Unlock()
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

