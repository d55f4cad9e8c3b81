package tlsrec

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Server runs crypto/tls's server handshake on raw, which must be fresh, and returns the
// session that takes the connection over, with the handshake's state (the peer's certificates).
// cfg is cloned: TLS 1.3 only, its key log read here. Nothing of the connection is read past the
// client's Finished. With session tickets on (cfg.SessionTicketsDisabled false), crypto/tls
// sends one under the application keys before the hand-off; it is counted (through
// WrapSession, which then seals tickets with cfg's keys: set them with SetSessionTicketKeys,
// since each handshake runs on a clone), so the session writes on from the next sequence
// number. The deadline bounds the whole handshake.
func Server(raw net.Conn, cfg *tls.Config, deadline time.Time) (*Session, tls.ConnectionState, error) {
	return handshake(raw, cfg, deadline, true)
}

// Client is Server's counterpart for the connecting side. With cfg.ClientSessionCache set, it
// offers a cached session, and the session's Ticket gives crypto/tls the server's first ticket
// when it comes, to cache for the next handshake.
func Client(raw net.Conn, cfg *tls.Config, deadline time.Time) (*Session, tls.ConnectionState, error) {
	return handshake(raw, cfg, deadline, false)
}

func handshake(raw net.Conn, cfg *tls.Config, deadline time.Time, server bool) (*Session, tls.ConnectionState, error) {
	kl := &keyLog{}
	cfg = takeOver(cfg, kl)
	if cfg.GetConfigForClient != nil {
		get := cfg.GetConfigForClient
		cfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			c, err := get(h)
			if c == nil || err != nil {
				return c, err
			}
			return takeOver(c, kl), nil
		}
	}
	ex := &exact{Conn: raw}
	var tc *tls.Conn
	if server {
		tc = tls.Server(ex, cfg)
	} else {
		tc = tls.Client(ex, cfg)
	}
	raw.SetDeadline(deadline)
	err := tc.HandshakeContext(context.Background())
	raw.SetDeadline(time.Time{})
	cs := tc.ConnectionState()
	if err != nil {
		return nil, cs, err
	}
	// tc is left as it is: closing it would send an alert under keys that now belong to the
	// session.
	if cs.Version != tls.VersionTLS13 {
		return nil, cs, errors.New("tlsrec: the handshake did not negotiate TLS 1.3")
	}
	if ex.left != 0 || ex.hdrN != 0 {
		return nil, cs, errors.New("tlsrec: the handshake ended inside a record")
	}
	client, server13, err := kl.secrets()
	if err != nil {
		return nil, cs, err
	}
	st := State{Suite: cs.CipherSuite, InSecret: client, OutSecret: server13, OutSeq: kl.ticketsSent()}
	if !server {
		st.InSecret, st.OutSecret = server13, client
	}
	s, err := New(st)
	if err == nil && !server && cfg.ClientSessionCache != nil && !cfg.SessionTicketsDisabled {
		s.Ticket = func(rec []byte) { ticketTo(tc, ex, rec) }
	}
	return s, cs, err
}

// takeOver is cfg for one handshake: cloned, TLS 1.3 only, its key log kl's, and its tickets
// (a server's) counted in kl.
func takeOver(cfg *tls.Config, kl *keyLog) *tls.Config {
	cfg = cfg.Clone()
	cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS13, tls.VersionTLS13
	cfg.KeyLogWriter = kl
	if !cfg.SessionTicketsDisabled {
		cfg.WrapSession = func(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
			kl.mu.Lock()
			kl.tickets++
			kl.mu.Unlock()
			return cfg.EncryptTicket(cs, ss) // as crypto/tls would without WrapSession
		}
	}
	return cfg
}

// ticketTo gives crypto/tls's client tc the sealed record rec, the server's first after the
// handshake, which carries a NewSessionTicket: tc opens it (at its sequence number 0, as the
// session did) and caches the session. ex then reads rec and nothing more, so tc stops there;
// tc is not used again.
func ticketTo(tc *tls.Conn, ex *exact, rec []byte) {
	ex.Conn = &fed{Conn: ex.Conn, rest: rec}
	ex.left, ex.hdrN = 0, 0
	tc.Read(make([]byte, 1)) // ends at errFed, the ticket taken
}

// fed is the socket a client's tls.Conn sees after the hand-off: one record, then errFed. Its
// addresses are the socket's, which the session cache may key on.
type fed struct {
	net.Conn
	rest []byte
}

var errFed = errors.New("tlsrec: the connection belongs to the session")

func (f *fed) Read(p []byte) (int, error) {
	if len(f.rest) == 0 {
		return 0, errFed
	}
	n := copy(p, f.rest)
	f.rest = f.rest[n:]
	return n, nil
}

// Write refuses: an alert crypto/tls might send about the record would go out under keys that
// now belong to the session, and break its stream.
func (f *fed) Write([]byte) (int, error) { return 0, errFed }

// keyLog takes the application traffic secrets from crypto/tls's key log (NSS format).
type keyLog struct {
	mu             sync.Mutex
	client, server []byte
	tickets        uint64 // NewSessionTickets a server sealed (under the application keys)
}

func (k *keyLog) ticketsSent() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.tickets
}

func (k *keyLog) Write(line []byte) (int, error) {
	f := bytes.Fields(line)
	if len(f) != 3 {
		return len(line), nil
	}
	secret, err := hex.DecodeString(string(f[2]))
	if err != nil {
		return len(line), nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	switch string(f[0]) {
	case "CLIENT_TRAFFIC_SECRET_0":
		k.client = secret
	case "SERVER_TRAFFIC_SECRET_0":
		k.server = secret
	}
	return len(line), nil
}

func (k *keyLog) secrets() (client, server []byte, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.client == nil || k.server == nil {
		return nil, nil, errors.New("tlsrec: crypto/tls logged no application traffic secrets")
	}
	return k.client, k.server, nil
}

// exact is the connection crypto/tls handshakes on: its reads stop at every record's end, so
// crypto/tls, which reads ahead when it can, never takes bytes of a record that follows the
// handshake (the peer's first application data, sent right after its Finished).
type exact struct {
	net.Conn
	hdr  [headerLen]byte
	hdrN int
	left int // bytes of the current record's body not read yet
}

func (e *exact) Read(p []byte) (int, error) {
	if e.left > 0 {
		n, err := e.Conn.Read(p[:min(len(p), e.left)])
		e.left -= n
		return n, err
	}
	n, err := e.Conn.Read(p[:min(len(p), headerLen-e.hdrN)])
	copy(e.hdr[e.hdrN:], p[:n])
	e.hdrN += n
	if e.hdrN == headerLen {
		e.hdrN = 0
		e.left = int(e.hdr[3])<<8 | int(e.hdr[4])
	}
	return n, err
}

// Conn is a session over its socket as a net.Conn, for tests and simple callers: one reader and
// one writer at a time.
type Conn struct {
	net.Conn
	S     *Session
	rbuf  []byte // read from the socket, not opened yet
	plain []byte // opened, not returned yet
	wbuf  []byte
	rerr  error
}

func (c *Conn) Read(p []byte) (int, error) {
	for len(c.plain) == 0 {
		if c.rerr != nil {
			return 0, c.rerr
		}
		if len(c.rbuf) == cap(c.rbuf) {
			c.rbuf = append(c.rbuf, make([]byte, MaxRecord)...)[:len(c.rbuf)]
		}
		n, err := c.Conn.Read(c.rbuf[len(c.rbuf):cap(c.rbuf)])
		c.rbuf = c.rbuf[:len(c.rbuf)+n]
		plain, used, oerr := c.S.Open(c.rbuf)
		c.plain = append(c.plain[:0], plain...)
		c.rbuf = c.rbuf[:copy(c.rbuf, c.rbuf[used:])]
		switch {
		case errors.Is(oerr, ErrClosed):
			c.rerr = ioEOF
		case oerr != nil:
			c.rerr = oerr
		case err != nil:
			c.rerr = err
		}
	}
	n := copy(p, c.plain)
	c.plain = c.plain[n:]
	return n, nil
}

func (c *Conn) Write(p []byte) (int, error) {
	c.wbuf = c.S.Seal(c.wbuf[:0], p)
	if _, err := c.Conn.Write(c.wbuf); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close sends close_notify, then closes the socket.
func (c *Conn) Close() error {
	c.Conn.Write(c.S.CloseNotify(nil))
	return c.Conn.Close()
}

var ioEOF = io.EOF
