package tlsrec

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/testpki"
)

// testPKI is a CA with one server and one client certificate.
type testPKI struct {
	roots          *x509.CertPool
	server, client tls.Certificate
}

func newPKI(t testing.TB) testPKI {
	p, _ := newPKIWithCA(t)
	return p
}

// newPKIWithCA also returns the CA's certificate.
func newPKIWithCA(t testing.TB) (testPKI, []byte) {
	t.Helper()
	ca := testpki.NewCA(t, "test CA")
	leaf := func(eku x509.ExtKeyUsage) tls.Certificate {
		return ca.Issue(t, testpki.Leaf{CN: "leaf", DNS: []string{"localhost"}, Usages: []x509.ExtKeyUsage{eku}}).TLS
	}
	return testPKI{roots: ca.Pool(), server: leaf(x509.ExtKeyUsageServerAuth), client: leaf(x509.ExtKeyUsageClientAuth)}, ca.DER
}

func tlsSuiteName(id uint16) string { return tls.CipherSuiteName(id) }

func (p testPKI) serverConfig() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.server}, ClientCAs: p.roots, ClientAuth: tls.RequireAndVerifyClientCert,
		MinVersion: tls.VersionTLS13}
}

func (p testPKI) clientConfig() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.client}, RootCAs: p.roots, ServerName: "localhost",
		MinVersion: tls.VersionTLS13}
}

// pair is a loopback TCP connection.
func pair(t testing.TB) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan net.Conn)
	go func() {
		c, _ := ln.Accept()
		done <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-done
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// payloads are the messages each test sends: empty-ish, one record, several records.
var payloads = [][]byte{[]byte("x"), bytes.Repeat([]byte("a"), MaxPlaintext), bytes.Repeat([]byte("0123456789"), 10000)}

// echo copies what r reads back to it until EOF.
func echo(c io.ReadWriter) { io.Copy(c, c) }

// roundTrips writes each payload to c and reads it back.
func roundTrips(t *testing.T, c io.ReadWriter) {
	t.Helper()
	for _, p := range payloads {
		if _, err := c.Write(p); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(p))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, p) {
			t.Fatalf("echo of %d bytes came back different", len(p))
		}
	}
}

// moved rebuilds a connection's session from its state as JSON: what a hand-over does.
func moved(t *testing.T, c *Conn) *Conn {
	t.Helper()
	b, err := json.Marshal(c.S.State())
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	s, err := New(st)
	if err != nil {
		t.Fatal(err)
	}
	return &Conn{Conn: c.Conn, S: s, rbuf: c.rbuf, plain: c.plain}
}

// TestServerAgainstCryptoTLS: our server side, crypto/tls's client, which writes its first
// data right behind its Finished (the handshake must not swallow it), records of every size,
// a KeyUpdate each way, and the state moved to a new session twice mid-stream.
func TestServerAgainstCryptoTLS(t *testing.T) {
	p := newPKI(t)
	a, b := pair(t)
	errc := make(chan error, 1)
	go func() {
		tc := tls.Client(a, p.clientConfig())
		if _, err := tc.Write([]byte("first")); err != nil { // handshake, then data at once
			errc <- err
			return
		}
		echo(tc)
		errc <- tc.Close()
	}()
	s, cs, err := Server(b, p.serverConfig(), time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.PeerCertificates) != 1 || cs.PeerCertificates[0].SerialNumber.Cmp(p.client.Leaf.SerialNumber) != 0 {
		t.Fatalf("peer certificates %v", cs.PeerCertificates)
	}
	b.SetDeadline(time.Now().Add(20 * time.Second)) // a lost record fails the test instead of hanging it
	c := &Conn{Conn: b, S: s}
	got := make([]byte, 5)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "first" {
		t.Fatalf("first data %q, %v", got, err)
	}
	roundTrips(t, c)
	c = moved(t, c)
	// Ask the peer to update its keys too: crypto/tls answers with its own KeyUpdate.
	if _, err := b.Write(c.S.RequestUpdate(nil)); err != nil {
		t.Fatal(err)
	}
	roundTrips(t, c)
	c = moved(t, c)
	roundTrips(t, c)
	c.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestClientAgainstCryptoTLS: our client side, crypto/tls's server with session tickets on (it
// sends NewSessionTicket records the session must skip) and a KeyUpdate the server asks for
// being answered before the client's next record.
func TestClientAgainstCryptoTLS(t *testing.T) {
	p := newPKI(t)
	a, b := pair(t)
	errc := make(chan error, 1)
	go func() {
		tc := tls.Server(b, p.serverConfig())
		echo(tc)
		errc <- tc.Close()
	}()
	s, cs, err := Client(a, p.clientConfig(), time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if cs.PeerCertificates[0].SerialNumber.Cmp(p.server.Leaf.SerialNumber) != 0 {
		t.Fatal("not the server's certificate")
	}
	a.SetDeadline(time.Now().Add(20 * time.Second))
	c := &Conn{Conn: a, S: s}
	roundTrips(t, c)
	c = moved(t, c)
	if _, err := a.Write(c.S.RequestUpdate(nil)); err != nil {
		t.Fatal(err)
	}
	roundTrips(t, c)
	c.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestOwedUpdate: a KeyUpdate the peer asks for is paid before the next record, and survives a
// move of the state.
func TestOwedUpdate(t *testing.T) {
	p := newPKI(t)
	a, b := pair(t)
	type res struct {
		s   *Session
		err error
	}
	sc := make(chan res)
	go func() {
		s, _, err := Server(b, p.serverConfig(), time.Now().Add(5*time.Second))
		sc <- res{s, err}
	}()
	cli, _, err := Client(a, p.clientConfig(), time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := <-sc
	if r.err != nil {
		t.Fatal(r.err)
	}
	srv := r.s
	buf := cli.RequestUpdate(nil)
	if _, _, err := srv.Open(buf); err != nil {
		t.Fatal(err)
	}
	st := srv.State()
	if !st.UpdateOwed {
		t.Fatal("a requested update is not owed")
	}
	srv2, err := New(st)
	if err != nil {
		t.Fatal(err)
	}
	rec := srv2.Seal(nil, []byte("after"))
	plain, used, err := cli.Open(append([]byte(nil), rec...))
	if err != nil || string(plain) != "after" || used != len(rec) {
		t.Fatalf("client read %q (%d of %d), %v", plain, used, len(rec), err)
	}
	if srv2.State().UpdateOwed {
		t.Fatal("still owed after paying")
	}
}

// TestOpenPartial: records arriving a byte at a time come out whole, once.
func TestOpenPartial(t *testing.T) {
	p := newPKI(t)
	a, b := pair(t)
	sc := make(chan *Session)
	go func() {
		s, _, _ := Server(b, p.serverConfig(), time.Now().Add(5*time.Second))
		sc <- s
	}()
	cli, _, err := Client(a, p.clientConfig(), time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srv := <-sc
	wire := cli.Seal(nil, payloads[2])
	var buf, out []byte
	for _, x := range wire {
		buf = append(buf, x)
		plain, used, err := srv.Open(buf)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, plain...)
		buf = buf[:copy(buf, buf[used:])]
	}
	if !bytes.Equal(out, payloads[2]) || len(buf) != 0 {
		t.Fatalf("%d bytes out, %d left", len(out), len(buf))
	}
	// A flipped bit is an error, never data.
	wire = cli.Seal(nil, []byte("tamper"))
	wire[len(wire)-1] ^= 1
	if plain, _, err := srv.Open(wire); err == nil || len(plain) != 0 {
		t.Fatalf("a tampered record opened: %q, %v", plain, err)
	}
}

// TestHandshakeRefusals: a plaintext client and a certificate of no CA fail the handshake.
func TestHandshakeRefusals(t *testing.T) {
	p := newPKI(t)
	a, b := pair(t)
	go a.Write([]byte{0x06, 0, 0, 0, 0xe0, 0x06, 0x0b, 0, 0}) // a TCPStore-shaped probe
	if _, _, err := Server(b, p.serverConfig(), time.Now().Add(2*time.Second)); err == nil {
		t.Fatal("plaintext passed the handshake")
	}
	other := newPKI(t)
	a, b = pair(t)
	go func() {
		cfg := p.clientConfig()
		cfg.Certificates = other.clientConfig().Certificates
		tls.Client(a, cfg).Handshake()
	}()
	if _, _, err := Server(b, p.serverConfig(), time.Now().Add(2*time.Second)); err == nil {
		t.Fatal("a certificate of another CA passed")
	}
}
