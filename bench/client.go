package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// maxReplyBytes bounds a length read from a reply: the bench trusts no store with its memory.
const maxReplyBytes = 64 << 20

// client is one TCPStore connection speaking generation gen.
type client struct {
	gen    protocol.Generation
	c      net.Conn
	r      *bufio.Reader
	out    []byte // scratch for encoding
	keyBuf []byte // scratch for derived keys
}

// dialer opens connections with bounded concurrency, retrying the errors a loopback storm
// produces (ephemeral ports exhausted, a full accept backlog) until its deadline.
type dialer struct {
	addr    string
	sem     chan struct{}
	timeout time.Duration // per connection, retries included
	perHost int           // Config.PerHost
}

func newDialer(addr string, concurrency int, timeout time.Duration, perHost int) *dialer {
	return &dialer{addr: addr, sem: make(chan struct{}, max(concurrency, 1)), timeout: timeout, perHost: perHost}
}

// hostAddrs is how many loopback sources PerHost can name: 127.10.0.1 to 127.10.255.254.
const hostAddrs = 1<<16 - 2

// source is the address client id dials from (Config.PerHost), or nil: the system's choice.
func (d *dialer) source(id int) *net.TCPAddr {
	if d.perHost <= 0 {
		return nil
	}
	h := id/d.perHost%hostAddrs + 1
	return &net.TCPAddr{IP: net.IPv4(127, 10, byte(h>>8), byte(h))}
}

// retryable reports whether a dial error is a transient loopback condition.
func retryable(err error) bool {
	return errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ETIMEDOUT) ||
		errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR)
}

// dial connects client id, retrying with jittered backoff; retries counts the failed attempts.
func (d *dialer) dial(ctx context.Context, id int) (c net.Conn, retries int, err error) {
	select {
	case d.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	defer func() { <-d.sem }()
	deadline := time.Now().Add(d.timeout)
	backoff := 5 * time.Millisecond
	nd := net.Dialer{}
	if src := d.source(id); src != nil {
		nd.LocalAddr = src
	}
	for {
		dctx, cancel := context.WithDeadline(ctx, deadline)
		c, err = nd.DialContext(dctx, "tcp", d.addr)
		cancel()
		if err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			return c, retries, nil
		}
		if !retryable(err) || time.Now().Add(backoff).After(deadline) || ctx.Err() != nil {
			return nil, retries, err
		}
		retries++
		time.Sleep(backoff/2 + rand.N(backoff))
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func newClient(c net.Conn, gen protocol.Generation) *client {
	return &client{gen: gen, c: c, r: bufio.NewReaderSize(c, 4096)}
}

// handshake sends what a torch client of the generation sends first (VALIDATE, PING) and reads
// the PING reply, which must echo the nonce.
func (cl *client) handshake(nonce uint32) error {
	cl.out = protocol.AppendHandshake(cl.out[:0], cl.gen, nonce)
	if len(cl.out) == 0 {
		return nil
	}
	if _, err := cl.c.Write(cl.out); err != nil {
		return err
	}
	if _, ok := protocol.WireOf(cl.gen, protocol.OpPing); !ok {
		return nil
	}
	var b [4]byte
	if _, err := io.ReadFull(cl.r, b[:]); err != nil {
		return fmt.Errorf("ping reply: %w", err)
	}
	if got := binary.LittleEndian.Uint32(b[:]); got != nonce {
		return fmt.Errorf("ping reply %#x, want nonce %#x", got, nonce)
	}
	return nil
}

// do writes encoded requests and reads the replies of ops, in order.
func (cl *client) do(req []byte, ops ...replyShape) error {
	if _, err := cl.c.Write(req); err != nil {
		return err
	}
	for _, o := range ops {
		if err := cl.readReply(o); err != nil {
			return err
		}
	}
	return nil
}

// replyShape is what the store sends back for one request: nothing, fixed bytes, or n
// length-prefixed byte strings.
type replyShape struct {
	fixed   int // bytes of a fixed-size reply: 8 for ADD/GETNUMKEYS, 1 for CHECK/WAIT, 4 for PING
	strings int // length-prefixed strings: 1 for GET, n for MULTI_GET
}

var (
	replyInt   = replyShape{fixed: 8}
	replyByte  = replyShape{fixed: 1}
	replyBytes = replyShape{strings: 1}
)

func (cl *client) readReply(s replyShape) error {
	if s.fixed > 0 {
		if _, err := cl.r.Discard(s.fixed); err != nil {
			return fmt.Errorf("reply: %w", err)
		}
	}
	for range s.strings {
		var b [8]byte
		if _, err := io.ReadFull(cl.r, b[:]); err != nil {
			return fmt.Errorf("reply length: %w", err)
		}
		n := binary.LittleEndian.Uint64(b[:])
		if n > maxReplyBytes {
			return fmt.Errorf("reply declares %d bytes (limit %d)", n, maxReplyBytes)
		}
		if _, err := cl.r.Discard(int(n)); err != nil {
			return fmt.Errorf("reply body: %w", err)
		}
	}
	return nil
}

// readInt reads an ADD or GETNUMKEYS reply.
func (cl *client) readInt() (int64, error) {
	var b [8]byte
	if _, err := io.ReadFull(cl.r, b[:]); err != nil {
		return 0, fmt.Errorf("reply: %w", err)
	}
	return int64(binary.LittleEndian.Uint64(b[:])), nil
}

// encode appends r in the client's generation.
func (cl *client) encode(dst []byte, r protocol.Request) []byte {
	out, err := protocol.Append(dst, cl.gen, r)
	if err != nil {
		panic(err) // ops are checked against the generation before any client runs
	}
	return out
}

func (cl *client) close() { cl.c.Close() }
