package tlsrelay

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/testpki"
	"github.com/storeguard/storeguard/tlsrec"
)

func configs(t *testing.T) (srv, cli *tls.Config) {
	t.Helper()
	ca := testpki.NewCA(t, "x CA")
	cert := ca.Issue(t, testpki.Leaf{CN: "x", DNS: []string{"x"}}).TLS
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert},
		&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool(), ServerName: "x"}
}

func tcpPair(t *testing.T) (a, b *net.TCPConn) {
	t.Helper()
	a, b, err := LoopbackPair()
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// handshake runs mutual TLS between a crypto/tls client on remote and tlsrec on tlsSide.
func handshake(t *testing.T, remote, tlsSide *net.TCPConn, srvCfg, cliCfg *tls.Config) (*tls.Conn, *tlsrec.Session) {
	t.Helper()
	hs := make(chan *tls.Conn)
	go func() {
		c := tls.Client(remote, cliCfg)
		c.Handshake()
		hs <- c
	}()
	s, _, err := tlsrec.Server(tlsSide, srvCfg, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return <-hs, s
}

// TestRelayFreezeAndResume: a crypto/tls client streams through a relay (TLS side → plaintext
// side) and back, with both directions backed up, while the relay is frozen and resumed as a
// new relay from its Left several times: every byte arrives once and in order, both ways.
func TestRelayFreezeAndResume(t *testing.T) {
	srvCfg, cliCfg := configs(t)
	remote, tlsSide := tcpPair(t)
	plainRelay, app := tcpPair(t)
	client, s := handshake(t, remote, tlsSide, srvCfg, cliCfg)
	r, err := New(tlsSide, plainRelay, s, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	r.OnEnd = func(err error) { ended <- err }
	r.Run()

	// The app echoes what it reads back, through the relay, to the client.
	go func() {
		io.Copy(app, app)
		app.CloseWrite()
	}()
	want := streamFrom(client)
	for i := 0; i < 5; i++ {
		time.Sleep(30 * time.Millisecond)
		if !r.Freeze(5 * time.Second) {
			t.Fatal("the relay did not park")
		}
		left, err := r.Left()
		if err != nil {
			t.Fatal(err)
		}
		r.Abandon()
		next, err := Resume(tlsSide, plainRelay, left, nil)
		if err != nil {
			t.Fatal(err)
		}
		next.OnEnd = r.OnEnd
		r = next
		r.Run()
	}
	// Only now does the client read: until here both directions were backed up, so the freezes
	// stopped writes half done.
	awaitEcho(t, client, want, ended)
}

// streamFrom writes 8 MiB of random bytes to client, then half-closes it, on a goroutine of its
// own; it returns their SHA-256.
func streamFrom(client *tls.Conn) [32]byte {
	data := make([]byte, 8<<20)
	rand.Read(data)
	go func() {
		for p := data; len(p) > 0; {
			n := min(len(p), 100000)
			client.Write(p[:n])
			p = p[n:]
		}
		client.CloseWrite()
	}()
	return sha256.Sum256(data)
}

// awaitEcho reads client to its end and fails t unless what came is what hashes to want, and
// the relay then ends (ended) without an error.
func awaitEcho(t *testing.T, client *tls.Conn, want [32]byte, ended <-chan error) {
	t.Helper()
	got := make(chan [32]byte)
	go func() {
		h := sha256.New()
		io.Copy(h, client)
		var sum [32]byte
		copy(sum[:], h.Sum(nil))
		got <- sum
	}()
	select {
	case sum := <-got:
		if sum != want {
			t.Fatal("the echo came back different")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the echo did not finish")
	}
	select {
	case err := <-ended:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(35 * time.Second):
		t.Fatal("the relay did not end")
	}
}
