package tlsrec

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"
)

// TestResumption: a session resumes between every pairing of our ends and crypto/tls's, and
// data flows both ways after each handshake. Our server counts the ticket crypto/tls sends
// under its application keys (a wrong count: the client cannot open the first reply); our
// client hands crypto/tls the server's ticket from the records it reads (none handed: the second
// handshake is a full one).
func TestResumption(t *testing.T) {
	p := newPKI(t)
	keys := [][32]byte{{1, 2, 3}}
	for _, tc := range []struct {
		name             string
		ourServer, ourCl bool
	}{
		{"ours-both", true, true},
		{"our-server", true, false},
		{"our-client", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scfg := p.serverConfig()
			scfg.SetSessionTicketKeys(keys) // one set for every clone of it
			ccfg := p.clientConfig()
			ccfg.ClientSessionCache = tls.NewLRUClientSessionCache(4)
			for i, want := range []bool{false, true, true} {
				a, b := pair(t)
				a.SetDeadline(time.Now().Add(10 * time.Second))
				b.SetDeadline(time.Now().Add(10 * time.Second))
				served := make(chan error, 1)
				go func() { served <- serveEcho(b, scfg, tc.ourServer) }()
				var c io.ReadWriter
				var resumed bool
				if tc.ourCl {
					s, cs, err := Client(a, ccfg, time.Now().Add(5*time.Second))
					if err != nil {
						t.Fatal(err)
					}
					c, resumed = &Conn{Conn: a, S: s}, cs.DidResume
				} else {
					cc := tls.Client(a, ccfg)
					if err := cc.Handshake(); err != nil {
						t.Fatal(err)
					}
					c, resumed = cc, cc.ConnectionState().DidResume
				}
				if resumed != want {
					t.Fatalf("handshake %d: resumed %v, want %v", i, resumed, want)
				}
				roundTrips(t, c)
				a.Close()
				if err := <-served; err != nil {
					t.Fatalf("handshake %d: server: %v", i, err)
				}
			}
		})
	}
}

// serveEcho runs one server end, ours or crypto/tls's, and echoes until the client leaves. The
// peer's certificate must be there on a resumed handshake too (from the ticket).
func serveEcho(b net.Conn, cfg *tls.Config, ours bool) error {
	var c io.ReadWriter
	var cs tls.ConnectionState
	if ours {
		s, st, err := Server(b, cfg, time.Now().Add(5*time.Second))
		if err != nil {
			return err
		}
		c, cs = &Conn{Conn: b, S: s}, st
	} else {
		tc := tls.Server(b, cfg)
		if err := tc.Handshake(); err != nil {
			return err
		}
		c, cs = tc, tc.ConnectionState()
	}
	if len(cs.PeerCertificates) == 0 {
		return io.ErrUnexpectedEOF
	}
	echo(c)
	return nil
}
