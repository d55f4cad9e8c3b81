package connect

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/internal/testpki"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/proxy"
)

// pki writes a CA and a certificate per SPIFFE ID as PEM files: dir/<name>.pem, .key, ca.pem.
func pki(t *testing.T, ids map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	ca := testpki.NewCA(t, "CA")
	for name, id := range ids {
		ca.Files(t, dir, name, ca.Issue(t, testpki.Leaf{URIs: []string{id}}))
	}
	return dir
}

func files(t *testing.T, dir, name string) identity.Source {
	t.Helper()
	src, err := identity.Files(filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key"), filepath.Join(dir, "ca.pem"),
		identity.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

// startMaster starts a recording store (answering as torch 1.13's) and a serving guard in
// front of it with mutual TLS for every source, allowing spiffe://sg.test/worker/*, until ctx
// ends; resume turns tls.resumption on. It returns the PKI's directory (certificates "master" and
// "worker"), the store and the guard's address.
func startMaster(ctx context.Context, t *testing.T, resume bool) (dir string, store *storesim.Store, addr string) {
	t.Helper()
	dir = pki(t, map[string]string{"master": "spiffe://sg.test/master", "worker": "spiffe://sg.test/worker/w1"})
	store, err := storesim.StartRecorder("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	store.Answer(protocol.GenSetting{Gen: protocol.G0})
	cfg := config.Default()
	cfg.Listen, cfg.Upstream, cfg.MetricsListen, cfg.Generation = "127.0.0.1:0", store.Addr(), "", "1.13"
	cfg.TLS = config.TLS{Mode: "on", CertFile: "x", KeyFile: "x", CAFile: "x", Allow: []string{"spiffe://sg.test/worker/*"},
		PlaintextSources: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, HandshakeTimeout: 2 * time.Second,
		Resumption: resume}
	srv, err := proxy.New(config.MustParse(cfg), proxy.Options{Identity: files(t, dir, "master")})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ctx)
	return dir, store, srv.Addr().String()
}

// TestClientGuardEndToEndAndUpgrade: a rank's connection through a client guard and a serving
// guard (mutual TLS, every source) to a store, byte for byte; then the client guard hands its
// relay over to a new one (an upgrade in place) mid-message, and the connection goes on.
func TestClientGuardEndToEndAndUpgrade(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, store, srv := startMaster(ctx, t, false)
	allow, _ := identity.ParseAllow([]string{"spiffe://sg.test/master"})
	opt := Options{Listen: "127.0.0.1:0", Server: srv, Identity: files(t, dir, "worker"), Allow: allow}
	c, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { c.Serve(ctx, time.Second); close(served) }()

	rank, err := net.Dial("tcp", c.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer rank.Close()
	rank.SetDeadline(time.Now().Add(20 * time.Second))
	add := enc(t, protocol.Request{Op: protocol.OpAdd, Key: []byte("/n"), Int: 1})
	set := enc(t, protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: bytes.Repeat([]byte("v"), 70000)})
	rank.Write(add)
	if _, err := io.ReadFull(rank, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	rank.Write(set[:40000])
	for deadline := time.Now().Add(5 * time.Second); c.Stats.Active.Load() != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no relay")
		}
	}

	mine, theirs, err := fdpass.Pair()
	if err != nil {
		t.Fatal(err)
	}
	took := make(chan *Client, 1)
	go func() {
		n, err := TakeOver(opt, theirs)
		if err != nil {
			t.Error(err)
		}
		took <- n
	}()
	if n, err := c.HandOver(mine, nil); err != nil || n != 1 {
		t.Fatalf("handed over %d relays: %v", n, err)
	}
	next := <-took
	if next == nil {
		t.FailNow()
	}
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Fatal("the old client guard's Serve did not return")
	}
	go next.Serve(ctx, time.Second)

	rank.Write(set[40000:])
	rank.Write(add)
	if _, err := io.ReadFull(rank, make([]byte, 8)); err != nil {
		t.Fatalf("after the upgrade: %v", err)
	}
	want := append(append(append([]byte{}, add...), set...), add...)
	for deadline := time.Now().Add(5 * time.Second); !bytes.Equal(store.Received(0), want); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the store has %d bytes, want %d", len(store.Received(0)), len(want))
		}
	}
	// The new client guard accepts on the same address.
	r2, err := net.Dial("tcp", c.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	r2.SetDeadline(time.Now().Add(10 * time.Second))
	r2.Write(add)
	if _, err := io.ReadFull(r2, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
}

func enc(t *testing.T, rs ...protocol.Request) []byte {
	var b []byte
	for _, r := range rs {
		var err error
		if b, err = protocol.Append(b, protocol.G0, r); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// TestClientGuardResumes: with resumption at both guards, a rank's later connections resume the
// session: the relay of the first handed crypto/tls the master's ticket from the records it read,
// and the master counted the ticket it sent (else no reply could be opened). The ticket arrives
// after the first connection's handshake, so a loaded machine may make the second connection
// before it is stored: two resumptions within 20 connections. Off at the client guard, every
// connection makes a full handshake.
func TestClientGuardResumes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, _, srv := startMaster(ctx, t, true)
	allow, _ := identity.ParseAllow([]string{"spiffe://sg.test/master"})
	add := enc(t, protocol.Request{Op: protocol.OpAdd, Key: []byte("/n"), Int: 1})
	for _, resume := range []bool{true, false} {
		opt := Options{Listen: "127.0.0.1:0", Server: srv, Identity: files(t, dir, "worker"), Allow: allow,
			Resumption: resume}
		c, err := New(opt)
		if err != nil {
			t.Fatal(err)
		}
		go c.Serve(ctx, time.Second)
		conns := 3
		if resume {
			conns = 20
		}
		for i := 0; i < conns && (!resume || c.Stats.Resumed.Load() < 2); i++ {
			rank, err := net.Dial("tcp", c.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			rank.SetDeadline(time.Now().Add(10 * time.Second))
			rank.Write(add)
			if _, err := io.ReadFull(rank, make([]byte, 8)); err != nil {
				t.Fatalf("resumption %v, connection %d: %v", resume, i, err)
			}
			rank.Close()
		}
		want := uint64(0)
		if resume {
			want = 2
		}
		if got := c.Stats.Resumed.Load(); got != want {
			t.Fatalf("resumption %v: %d connections resumed, want %d", resume, got, want)
		}
	}
}
