package proxy

import (
	"bytes"
	"crypto/tls"
	"net/netip"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/internal/testpki"
	"github.com/storeguard/storeguard/protocol"
)

// leaf issues a certificate of ca for a SPIFFE ID, valid from notBefore for an hour.
func leaf(t *testing.T, ca *testpki.CA, spiffe string, notBefore time.Time) tls.Certificate {
	t.Helper()
	return ca.Issue(t, testpki.Leaf{URIs: []string{spiffe}, NotBefore: notBefore, NotAfter: notBefore.Add(time.Hour)}).TLS
}

const (
	masterID = "spiffe://sg.test/master"
	workerID = "spiffe://sg.test/worker/w1"
)

// startTLS starts a server with mutual TLS on for every source (none may speak plaintext),
// allowing spiffe://sg.test/worker/*, in front of a recorder.
func startTLS(t *testing.T, m mode, ca *testpki.CA) *harness {
	t.Helper()
	h, _ := startTLSWith(t, m, ca, func(*config.Config) {})
	return h
}

// startTLSWith is startTLS with its configuration changed by mutate first; it returns it too.
func startTLSWith(t *testing.T, m mode, ca *testpki.CA, mutate func(*config.Config)) (*harness, config.Config) {
	t.Helper()
	return startTLSOptions(t, m, ca, mutate, Options{})
}

// startTLSOptions is startTLSWith with more of the server's options.
func startTLSOptions(t *testing.T, m mode, ca *testpki.CA, mutate func(*config.Config), opts Options) (*harness, config.Config) {
	t.Helper()
	store := recorder(t, reservedAddr(t))
	nb := time.Now().Add(-time.Minute)
	cert, key, caFile := ca.Files(t, t.TempDir(), "master", ca.Issue(t, testpki.Leaf{URIs: []string{masterID}, NotBefore: nb, NotAfter: nb.Add(time.Hour)}))
	ids, err := identity.Files(cert, key, caFile, identity.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ids.Close() })
	cfg := testConfig(m, store.Addr())
	cfg.TLS = config.TLS{Mode: "on", CertFile: cert, KeyFile: key, CAFile: caFile, Allow: []string{"spiffe://sg.test/worker/*"},
		PlaintextSources: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, HandshakeTimeout: 2 * time.Second}
	mutate(&cfg)
	opts.Identity = ids
	h := startWithOptions(t, cfg, opts)
	h.store = store
	return h, cfg
}

// dialTLS connects to h with cert, as a client guard does.
func (h *harness) dialTLS(ca *testpki.CA, cert tls.Certificate) (*tls.Conn, error) {
	return h.dialTLSCached(ca, cert, nil)
}

// dialTLSCached is dialTLS offering a session of cache (nil: none).
func (h *harness) dialTLSCached(ca *testpki.CA, cert tls.Certificate, cache tls.ClientSessionCache) (*tls.Conn, error) {
	c, err := tls.Dial("tcp", h.addr, &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool(),
		InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, ClientSessionCache: cache})
	if err == nil {
		h.t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// TestMutualTLSForwardsAndNamesThePeer: a client with an allowed identity reaches the store
// through the relay, byte for byte both ways; its flow record and events carry its identity.
func TestMutualTLSForwardsAndNamesThePeer(t *testing.T) { run(t, testMutualTLSForwardsAndNamesThePeer) }

func testMutualTLSForwardsAndNamesThePeer(t *testing.T, m mode) {
	ca := testpki.NewCA(t, "sg.test CA")
	h := startTLS(t, m, ca)
	c, err := h.dialTLS(ca, leaf(t, ca, workerID, time.Now().Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	msg := enc(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: bytes.Repeat([]byte("v"), 40000)},
		protocol.Request{Op: protocol.OpGet, Key: []byte("k")})
	h.store.Answer(protocol.GenSetting{Gen: protocol.G0})
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the messages at the store", func() bool { return bytes.Equal(h.store.Received(0), msg) })
	readReply(t, c, 8) // GET's reply (a recorder answers the shortest), back through the relay
	c.Close()
	eventually(t, "the flow record", func() bool {
		for _, f := range h.audit.flows(t) {
			if f["storeguard.identity"] == workerID && f["tls.established"] == true && f["tls.version"] == "1.3" {
				return true
			}
		}
		return false
	})
	if v := h.metric(`storeguard_tls_handshakes_total{result="ok"}`); v != "1" {
		t.Errorf("handshakes ok = %q, want 1", v)
	}
}

// TestMutualTLSResumes: with tls.resumption, a client's second connection resumes its session
// (no certificate sent) and is forwarded both ways; the ticket the guard's crypto/tls sent under
// the application keys is counted (else the client could not open the reply), and the resumed
// connection carries the identity of the certificate in the ticket. A reload that takes that
// identity off the allow list refuses the next resumption, as it would a full handshake.
func TestMutualTLSResumes(t *testing.T) { run(t, testMutualTLSResumes) }

func testMutualTLSResumes(t *testing.T, m mode) {
	ca := testpki.NewCA(t, "sg.test CA")
	h, cfg := startTLSWith(t, m, ca, func(c *config.Config) { c.TLS.Resumption = true })
	h.store.Answer(protocol.GenSetting{Gen: protocol.G0})
	cert := leaf(t, ca, workerID, time.Now().Add(-time.Minute))
	cache := tls.NewLRUClientSessionCache(4)
	for i, want := range []bool{false, true, true} {
		c, err := h.dialTLSCached(ca, cert, cache)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ConnectionState().DidResume; got != want {
			t.Fatalf("connection %d: resumed %v, want %v", i, got, want)
		}
		key := []byte{'k', byte('0' + i)}
		msg := enc(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: key, Value: []byte("v")},
			protocol.Request{Op: protocol.OpGet, Key: key})
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the messages at the store", func() bool { return bytes.Equal(h.store.Received(i), msg) })
		readReply(t, c, 8) // the GET's reply, sealed after the ticket
		c.Close()
	}
	eventually(t, "three flow records with the identity", func() bool {
		n := 0
		for _, f := range h.audit.flows(t) {
			if f["storeguard.identity"] == workerID {
				n++
			}
		}
		return n == 3
	})
	cfg.TLS.Allow = []string{"spiffe://sg.test/other/*"}
	if err := h.srv.Reload(parsed(t, cfg)); err != nil {
		t.Fatal(err)
	}
	c, err := h.dialTLSCached(ca, cert, cache)
	if err == nil {
		if !c.ConnectionState().DidResume {
			t.Fatal("the client did not offer its session again")
		}
		c.SetReadDeadline(time.Now().Add(patience))
		if n, rerr := c.Read(make([]byte, 8)); rerr == nil {
			t.Fatalf("read %d bytes after a refused resumption", n)
		}
		c.Close()
	}
	eventually(t, "the refused resumption", func() bool {
		for _, e := range h.audit.events(t) {
			if e["event.action"] == "denied" && e["event.reason"] == "tls_identity_not_allowed" {
				return true
			}
		}
		return false
	})
	if n := h.store.NumConns(); n != 3 {
		t.Fatalf("the store saw %d connections, want 3", n)
	}
	if v := h.metric("storeguard_tls_resumed_total"); v != "2" {
		t.Errorf("resumed = %q, want 2", v)
	}
}

// TestMutualTLSRefusals: plaintext, no certificate, another CA, an expired certificate and an
// identity not on the list each get nothing to the store, and each refusal is audited with why.
func TestMutualTLSRefusals(t *testing.T) { run(t, testMutualTLSRefusals, loopsOnly) }

func testMutualTLSRefusals(t *testing.T, m mode) {
	ca := testpki.NewCA(t, "sg.test CA")
	other := testpki.NewCA(t, "other CA")
	h := startTLS(t, m, ca)
	probe := enc(t, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("/torchelastic/rdzv/state"), Value: []byte("x")})
	for _, tc := range []struct {
		name, reason string
		cert         *tls.Certificate
	}{
		{"plaintext", "tls_not_tls", nil},
		{"no certificate", "tls_no_certificate", &tls.Certificate{}},
		{"another CA", "tls_unknown_ca", ptr(leaf(t, other, workerID, time.Now().Add(-time.Minute)))},
		{"expired", "tls_expired", ptr(leaf(t, ca, workerID, time.Now().Add(-2*time.Hour)))},
		{"not allowed", "tls_identity_not_allowed", ptr(leaf(t, ca, "spiffe://sg.test/other", time.Now().Add(-time.Minute)))},
	} {
		if tc.cert == nil {
			c := h.dial()
			c.Write(probe)
			closedByPeer(t, c)
		} else {
			var certs []tls.Certificate
			if tc.cert.Certificate != nil {
				certs = []tls.Certificate{*tc.cert}
			}
			c, err := tls.Dial("tcp", h.addr, &tls.Config{Certificates: certs, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
			if err == nil { // TLS 1.3: the client hears of the refusal at its first read
				c.Write(probe)
				c.SetReadDeadline(time.Now().Add(patience))
				if n, rerr := c.Read(make([]byte, 16)); rerr == nil {
					t.Errorf("%s: read %d bytes after a refused handshake", tc.name, n)
				}
				c.Close()
			}
		}
		eventually(t, tc.name+"'s refusal", func() bool {
			for _, e := range h.audit.events(t) {
				if e["event.action"] == "denied" && e["event.reason"] == tc.reason {
					return true
				}
			}
			return false
		})
	}
	if n := h.store.NumConns(); n != 0 {
		t.Fatalf("the store saw %d connections", n)
	}
}

func ptr[T any](v T) *T { return &v }

// TestProofBeatsAddress: plaintext from a worker's address (a local user on it, a neighbour
// behind its NAT) gets the address banned; the worker's ranks, which prove their identity, are
// still forwarded. What proven connections break bans that identity at that address alone.
func TestProofBeatsAddress(t *testing.T) { run(t, testProofBeatsAddress, loopsOnly) }

func testProofBeatsAddress(t *testing.T, m mode) {
	ca := testpki.NewCA(t, "sg.test CA")
	h, _ := startTLSWith(t, m, ca, func(c *config.Config) {
		c.Ban.Violations, c.Ban.Window, c.Ban.Duration = 3, time.Minute, time.Minute
		c.Ban.Exempt = nil // the test's clients are on loopback, exempt by default
	})
	h.store.Answer(protocol.GenSetting{Gen: protocol.G0})
	probe := enc(t, protocol.G0, protocol.Request{Op: protocol.OpGet, Key: []byte("k")})
	for range 3 { // the plaintext prober
		c := h.dial()
		c.Write(probe)
		closedByPeer(t, c)
	}
	eventually(t, "the address's ban", func() bool { return h.metric(`storeguard_bans_active`) == "1" })
	closedByPeer(t, h.dial()) // plaintext stays out

	worker := leaf(t, ca, workerID, time.Now().Add(-time.Minute))
	ok := func(what string, cert tls.Certificate) {
		t.Helper()
		c, err := h.dialTLS(ca, cert)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		before := h.store.NumConns()
		c.Write(probe)
		readReply(t, c, 8)
		c.Close()
		if h.store.NumConns() != before+1 {
			t.Fatalf("%s: the store saw %d connections, want %d", what, h.store.NumConns(), before+1)
		}
	}
	ok("the worker's rank from the banned address", worker)

	for range 3 { // the worker's own connections break the protocol
		c, err := h.dialTLS(ca, worker)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte{0xff})
		c.SetReadDeadline(time.Now().Add(patience))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("a violating proven connection was answered")
		}
		c.Close()
	}
	eventually(t, "the identity's ban", func() bool { return h.metric(`storeguard_bans_active`) == "2" })
	if c, err := h.dialTLS(ca, worker); err == nil {
		c.Write(probe)
		c.SetReadDeadline(time.Now().Add(patience))
		if n, err := c.Read(make([]byte, 8)); err == nil {
			t.Fatalf("the banned identity at its address read %d bytes", n)
		}
	}
	eventually(t, "identity_banned", func() bool {
		return h.metric(`storeguard_connections_refused_total{reason="identity_banned"}`) == "1"
	})
	ok("another identity at that address", leaf(t, ca, "spiffe://sg.test/worker/w2", time.Now().Add(-time.Minute)))
	var banned []string
	for _, e := range h.audit.events(t) {
		if e["event.action"] == "banned" {
			id, _ := e["storeguard.identity"].(string)
			banned = append(banned, id)
		}
	}
	if len(banned) != 2 || banned[0] != "" || banned[1] != workerID {
		t.Fatalf("banned events' identities %q, want the address's (none), then %s's", banned, workerID)
	}
}
