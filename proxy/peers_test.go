package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/internal/testpki"
	"github.com/storeguard/storeguard/nftset"
	"github.com/storeguard/storeguard/protocol"
)

// nftCalls stands in for netlink: it records what the guard asks, in nft's syntax, and fails
// while fail is set.
type nftCalls struct {
	mu    sync.Mutex
	calls []string
	fail  bool
}

func (n *nftCalls) record(call string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls = append(n.calls, call)
	if n.fail {
		return errors.New("netlink: operation not permitted")
	}
	return nil
}

func (n *nftCalls) Check(_ context.Context, sp nftset.Spec) error {
	return n.record(fmt.Sprintf("list set %[1]s %[2]s %[3]s\nlist set %[1]s %[2]s %[3]s6\n", sp.Family, sp.Table, sp.Set))
}

func (n *nftCalls) Apply(_ context.Context, t nftset.Txn) error { return n.record(t.String()) }

// since returns the calls from the i-th on, and how many there are.
func (n *nftCalls) since(i int) ([]string, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.calls[min(i, len(n.calls)):]...), len(n.calls)
}

func mentions(calls []string, s string) bool {
	for _, c := range calls {
		if strings.Contains(c, s) {
			return true
		}
	}
	return false
}

// startPeerSet starts a mutual-TLS guard with tls.peer-set "inet sg peers" and timeout, its nft
// stood in for.
func startPeerSet(t *testing.T, m mode, ca *testpki.CA, timeout time.Duration) (*harness, *nftCalls) {
	nft := &nftCalls{}
	h, _ := startTLSOptions(t, m, ca, func(c *config.Config) {
		c.TLS.PeerSet = "inet sg peers"
		c.TLS.PeerSetTimeout = timeout
	}, Options{PeerSetRunner: nft})
	return h, nft
}

// TestPeerSetTakesAHostAsItsHandshakePasses: with tls.peer-set, the guard checks both sets as it
// starts, and puts a host in the set as its handshake passes, not a refresh (30 s) later; never a
// host whose handshake was refused, or one that spoke plaintext.
func TestPeerSetTakesAHostAsItsHandshakePasses(t *testing.T) {
	run(t, testPeerSetTakesAHostAsItsHandshakePasses)
}

func testPeerSetTakesAHostAsItsHandshakePasses(t *testing.T, m mode) {
	ca := testpki.NewCA(t, "sg.test CA")
	h, nft := startPeerSet(t, m, ca, 2*time.Minute)
	calls, _ := nft.since(0)
	if !mentions(calls, "list set inet sg peers\n") || !mentions(calls, "list set inet sg peers6\n") {
		t.Fatalf("the guard started without checking both sets: %q", calls)
	}
	// refused: an identity not allowed, from 127.0.0.3
	stranger := leaf(t, ca, "spiffe://sg.test/intruder", time.Now().Add(-time.Minute))
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}, Timeout: 2 * time.Second}
	if c, err := tls.DialWithDialer(d, "tcp", h.addr, &tls.Config{Certificates: []tls.Certificate{stranger}, RootCAs: ca.Pool(),
		InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}); err == nil {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		c.Read(make([]byte, 1)) // the refusal arrives as an alert on the first read
		c.Close()
	}
	// plaintext, from the plaintext source 127.0.0.2
	d.LocalAddr = &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}
	if c, err := d.Dial("tcp", h.addr); err == nil {
		defer c.Close()
	}
	eventually(t, "the refusal counted", func() bool {
		return h.metric(`storeguard_tls_handshakes_total{result="identity_not_allowed"}`) == "1"
	})
	if _, err := h.dialTLS(ca, leaf(t, ca, workerID, time.Now().Add(-time.Minute))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the worker's address in the peer set", func() bool {
		calls, _ := nft.since(0)
		return mentions(calls, "add element inet sg peers { 127.0.0.1 timeout 120s }")
	})
	if calls, _ := nft.since(0); mentions(calls, "127.0.0.3") || mentions(calls, "127.0.0.2") {
		t.Errorf("a refused or plaintext client went into the peer set: %q", calls)
	}
	if v := h.metric(`storeguard_peer_set_updates_total{result="ok"}`); v != "1" {
		t.Errorf("peer_set_updates_total ok = %q, want 1", v)
	}
}

// TestPeerSetRefreshesWhileConnected: a host is refreshed every quarter timeout while it has a
// connection open, and no longer once its last one closed (the set then lets it go by itself).
func TestPeerSetRefreshesWhileConnected(t *testing.T) { run(t, testPeerSetRefreshesWhileConnected) }

func testPeerSetRefreshesWhileConnected(t *testing.T, m mode) {
	ca := testpki.NewCA(t, "sg.test CA")
	h, nft := startPeerSet(t, m, ca, 4*time.Second) // refreshed every second
	const added = "add element inet sg peers { 127.0.0.1 timeout 4s }"
	c, err := h.dialTLS(ca, leaf(t, ca, workerID, time.Now().Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the worker's address in the peer set", func() bool { calls, _ := nft.since(0); return mentions(calls, added) })
	_, n := nft.since(0)
	eventually(t, "two refreshes while its connection is open", func() bool {
		calls, _ := nft.since(n)
		k := 0
		for _, c := range calls {
			if strings.Contains(c, added) {
				k++
			}
		}
		return k >= 2
	})
	c.Close()
	eventually(t, "the connection gone", func() bool { return len(h.srv.reg.tlsAddrs()) == 0 })
	_, n = nft.since(0)
	time.Sleep(2500 * time.Millisecond) // two refresh periods
	if calls, _ := nft.since(n); mentions(calls, "127.0.0.1") {
		t.Errorf("the worker was refreshed after its last connection closed: %q", calls)
	}
}

// TestPeerSetMissingStopsTheStart: a guard whose peer set nft cannot read does not start, and
// says which key and why.
func TestPeerSetMissingStopsTheStart(t *testing.T) {
	cfg := testConfig(goroutineMode, "127.0.0.1:1")
	cfg.TLS.PeerSet = "inet sg peers"
	cfg.TLS.Mode, cfg.TLS.CertFile, cfg.TLS.KeyFile, cfg.TLS.CAFile = "on", "c.pem", "k.pem", "ca.pem"
	nft := &nftCalls{fail: true}
	_, err := New(parsed(t, cfg), Options{PeerSetRunner: nft})
	if err == nil || !strings.Contains(err.Error(), `tls.peer-set "inet sg peers"`) || !strings.Contains(err.Error(), "operation not permitted") {
		t.Fatalf("New = %v", err)
	}
}

// TestRevocationClosesLiveConnections: a reload that denies an identity (access.deny-identities)
// or takes it off tls.allow closes its open connections, each audited (identity_revoked), and
// takes the host out of the peer set at once; a connection of an identity still admitted stays.
// Before, the revoked worker's open connection kept working (177 ops in 40 s) and its address
// stayed in the peer set.
func TestRevocationClosesLiveConnections(t *testing.T) { run(t, testRevocationClosesLiveConnections) }

func testRevocationClosesLiveConnections(t *testing.T, m mode) {
	ca := testpki.NewCA(t, "sg.test CA")
	h, nft := startPeerSet(t, m, ca, 2*time.Minute)
	h.store.Answer(protocol.GenSetting{Gen: protocol.G0})
	cfg := h.srv.set.Load().cfg
	open := func(id, from string) *tls.Conn {
		t.Helper()
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: patience}
		c, err := tls.DialWithDialer(d, "tcp", h.addr, &tls.Config{Certificates: []tls.Certificate{leaf(t, ca, id, time.Now().Add(-time.Minute))},
			RootCAs: ca.Pool(), InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.Write(enc(t, protocol.G0, protocol.Request{Op: protocol.OpGet, Key: []byte("k")}))
		readReply(t, c, 8)
		return c
	}
	alive := func(c *tls.Conn) bool {
		if _, err := c.Write(enc(t, protocol.G0, protocol.Request{Op: protocol.OpGet, Key: []byte("k")})); err != nil {
			return false
		}
		c.SetReadDeadline(time.Now().Add(patience))
		_, err := io.ReadFull(c, make([]byte, 8))
		return err == nil
	}
	revoked, other := open(workerID, "127.0.0.4"), open("spiffe://sg.test/worker/w2", "127.0.0.5")
	_, before := nft.since(0)
	cfg.Access.DenyIdentities = []string{workerID}
	if err := h.srv.Reload(parsed(t, cfg)); err != nil {
		t.Fatal(err)
	}
	if alive(revoked) {
		t.Fatal("the revoked identity's connection still works")
	}
	if !alive(other) {
		t.Fatal("another identity's connection was closed")
	}
	eventually(t, "the revoked host out of the peer set", func() bool {
		calls, _ := nft.since(before)
		return mentions(calls, "delete element inet sg peers { 127.0.0.4 }")
	})
	eventually(t, "the revocation audited", func() bool {
		for _, e := range h.audit.events(t) {
			if e["event.reason"] == ReasonRevoked && e["source.ip"] == "127.0.0.4" {
				return true
			}
		}
		return false
	})
	// tls.allow narrowed: the other identity's connection goes too.
	cfg.TLS.Allow = []string{"spiffe://sg.test/worker/w9"}
	if err := h.srv.Reload(parsed(t, cfg)); err != nil {
		t.Fatal(err)
	}
	if alive(other) {
		t.Fatal("a connection tls.allow no longer permits still works")
	}
}

// TestTrustRotationRevokes: a trust bundle that no longer holds a CA closes the live connections
// whose chain ended in it, audited (identity_revoked), and takes their hosts out of the peer set;
// a connection of the CA kept stays, even one whose short-lived certificate expired since it
// connected (judged as at its start: SVIDs renew under live connections).
func TestTrustRotationRevokes(t *testing.T) { run(t, testTrustRotationRevokes, loopsOnly) }

func testTrustRotationRevokes(t *testing.T, m mode) {
	ca := testpki.NewCA(t, "sg.test CA")
	old := testpki.NewCA(t, "sg.test CA, retiring")
	h, nft := startPeerSet(t, m, ca, 2*time.Minute)
	h.store.Answer(protocol.GenSetting{Gen: protocol.G0})
	caFile := h.srv.set.Load().cfg.TLS.CAFile
	both := append(ca.PEM(), old.PEM()...)
	if err := os.WriteFile(caFile, both, 0o600); err != nil {
		t.Fatal(err)
	}
	get := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGet, Key: []byte("k")})
	open := func(of *testpki.CA, from string, notAfter time.Time) *tls.Conn {
		t.Helper()
		cert := of.Issue(t, testpki.Leaf{URIs: []string{workerID}, NotBefore: time.Now().Add(-time.Minute), NotAfter: notAfter}).TLS
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: patience}
		var c *tls.Conn
		eventually(t, "a handshake with a certificate of "+of.Cert.Subject.CommonName, func() bool {
			var err error
			c, err = tls.DialWithDialer(d, "tcp", h.addr, &tls.Config{Certificates: []tls.Certificate{cert},
				InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
			if err != nil {
				return false
			}
			c.Write(get)
			c.SetReadDeadline(time.Now().Add(patience))
			if _, err := io.ReadFull(c, make([]byte, 8)); err != nil {
				c.Close()
				return false
			}
			return true
		})
		t.Cleanup(func() { c.Close() })
		return c
	}
	alive := func(c *tls.Conn) bool {
		if _, err := c.Write(get); err != nil {
			return false
		}
		c.SetReadDeadline(time.Now().Add(patience))
		_, err := io.ReadFull(c, make([]byte, 8))
		return err == nil
	}
	retiring := open(old, "127.0.0.4", time.Now().Add(time.Hour)) // waits for the guard to read both CAs
	kept := open(ca, "127.0.0.5", time.Now().Add(time.Hour))
	shortLived := open(ca, "127.0.0.6", time.Now().Add(2*time.Second))
	time.Sleep(3 * time.Second) // shortLived's certificate expires
	_, before := nft.since(0)
	if err := os.WriteFile(caFile, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the retiring CA's connection closed", func() bool { return !alive(retiring) })
	if !alive(kept) || !alive(shortLived) {
		t.Fatalf("connections of the CA kept closed: kept %v, its certificate expired since %v", alive(kept), alive(shortLived))
	}
	eventually(t, "its host out of the peer set", func() bool {
		calls, _ := nft.since(before)
		return mentions(calls, "delete element inet sg peers { 127.0.0.4 }")
	})
	var revoked []any
	for _, e := range h.audit.events(t) {
		if e["event.reason"] == ReasonRevoked {
			revoked = append(revoked, e["source.ip"])
		}
	}
	if len(revoked) != 1 || revoked[0] != "127.0.0.4" {
		t.Fatalf("identity_revoked events from %v, want 127.0.0.4's alone", revoked)
	}
}
