package proxy

import (
	"github.com/storeguard/storeguard/tlsrelay"
	"github.com/storeguard/storeguard/upgrade"
	"golang.org/x/sys/unix"
)

// A mutual-TLS connection in an upgrade: its relay, frozen with it, goes as data
// (upgrade.TLSConn) with the connection, and the new process resumes it.

// tlsState is a frozen connection's relay as data, with its descriptors (valid while c is).
func (c *conn) tlsState() (*upgrade.TLSConn, error) {
	if c.tls == nil {
		return nil, nil
	}
	r := c.tls.relay
	left, err := r.Left()
	if err != nil {
		return nil, err
	}
	t := &upgrade.TLSConn{Relay: left, Identity: c.tls.id, Info: c.tls.info, Fd: -1, PlainFd: -1}
	for _, s := range []struct {
		sock sock
		fd   *int
	}{{r.TLS, &t.Fd}, {r.Plain, &t.PlainFd}} {
		rc, err := s.sock.SyscallConn()
		if err != nil {
			return nil, err
		}
		if err := rc.Control(func(fd uintptr) { *s.fd = int(fd) }); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// resumeTLS makes an adopted connection's relay from what the previous process handed over
// and starts it; on failure the connection closes (its client's TLS session cannot go on).
func (c *conn) resumeTLS(t *upgrade.TLSConn) error {
	tlsSock, err := attach(int32(t.Fd))
	if err != nil {
		unix.Close(t.PlainFd)
		return err
	}
	plain, err := attach(int32(t.PlainFd))
	if err != nil {
		tlsSock.Close()
		return err
	}
	r, err := tlsrelay.Resume(tlsSock, plain, t.Relay, nil)
	if err != nil {
		tlsSock.Close()
		plain.Close()
		return err
	}
	c.setTLS(&tlsConn{relay: r, info: t.Info, id: t.Identity})
	r.Run()
	return nil
}
