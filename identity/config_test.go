package identity

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/testpki"
)

// handshake runs a real crypto/tls handshake over loopback TCP and a one-byte exchange after it:
// in TLS 1.3 the client's handshake is done before the server has judged the client's
// certificate, so a refused client only learns of it on its first read.
func handshake(t *testing.T, server, client *tls.Config) (serverErr, clientErr error, serverSaw *tls.ConnectionState) {
	t.Helper()
	sc, cc := tcpPair(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer sc.Close()
		s := tls.Server(sc, server)
		s.SetDeadline(time.Now().Add(5 * time.Second))
		if serverErr = s.Handshake(); serverErr != nil {
			return
		}
		cs := s.ConnectionState()
		serverSaw = &cs
		_, serverErr = s.Write([]byte{1})
	}()
	c := tls.Client(cc, client)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if clientErr = c.Handshake(); clientErr == nil {
		_, clientErr = c.Read(make([]byte, 1))
	}
	cc.Close()
	<-done
	return serverErr, clientErr, serverSaw
}

// tcpPair is a connected loopback pair: net.Pipe has no buffer, so a peer that stops reading
// mid-flight to send an alert would deadlock where TCP does not.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if server, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	return server, client
}

func mustAllow(t *testing.T, patterns ...string) Allow {
	t.Helper()
	a, err := ParseAllow(patterns)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestServerRefusals(t *testing.T) {
	ours, theirs := testpki.NewCA(t, "ours"), testpki.NewCA(t, "theirs")
	server := source(ours.Issue(t, testpki.Leaf{DNS: []string{"store.example"}}), ours)
	past := time.Now().Add(-48 * time.Hour)
	workerSpec := testpki.Leaf{URIs: []string{"spiffe://job.example/ns/train/worker"}}
	for _, tc := range []struct {
		name   string
		allow  []string
		from   *testpki.CA // nil: the client sends no certificate
		spec   testpki.Leaf
		want   Reason // "": accepted
		wantID string
	}{
		{"ours, any allowed", nil, ours, workerSpec, "", "spiffe://job.example/ns/train/worker"},
		{"ours, on the list", []string{"spiffe://job.example/ns/*/worker"}, ours, workerSpec, "", "spiffe://job.example/ns/train/worker"},
		{"dns SAN on the list", []string{"dns:*.hosts.example"}, ours, testpki.Leaf{DNS: []string{"w1.hosts.example"}}, "", "dns:w1.hosts.example"},
		{"cn only, on the list", []string{"cn:rank-host"}, ours, testpki.Leaf{CN: "rank-host"}, "", "cn:rank-host"},
		{"no certificate", nil, nil, testpki.Leaf{}, NoCertificate, ""},
		{"another CA", nil, theirs, workerSpec, UnknownCA, "spiffe://job.example/ns/train/worker"},
		{"expired", nil, ours, testpki.Leaf{CN: "old", NotBefore: past, NotAfter: past.Add(time.Hour)}, Expired, "cn:old"},
		{"not yet valid", nil, ours, testpki.Leaf{CN: "early", NotBefore: time.Now().Add(time.Hour), NotAfter: time.Now().Add(2 * time.Hour)}, Expired, "cn:early"},
		{"expired, another CA", nil, theirs, testpki.Leaf{CN: "old", NotBefore: past, NotAfter: past.Add(time.Hour)}, UnknownCA, "cn:old"},
		{"server-only usage", nil, ours, testpki.Leaf{CN: "srv", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, UnknownCA, "cn:srv"},
		{"not on the list", []string{"spiffe://job.example/ns/other/*"}, ours, workerSpec, NotAllowed, "spiffe://job.example/ns/train/worker"},
		{"cn not on a dns list", []string{"dns:rank-host"}, ours, testpki.Leaf{CN: "rank-host"}, NotAllowed, "cn:rank-host"},
		{"two SPIFFE IDs", nil, ours, testpki.Leaf{URIs: []string{"spiffe://job.example/ns/train/worker", "spiffe://otherjob.test/ns/x/y"}},
			Ambiguous, "spiffe://job.example/ns/train/worker"},
		{"a SPIFFE ID and another URI", []string{"spiffe://job.example/**"}, ours,
			testpki.Leaf{URIs: []string{"spiffe://job.example/ns/train/worker", "https://evil.example/x"}}, Ambiguous, "spiffe://job.example/ns/train/worker"},
		{"cn beside a SAN", []string{"cn:rank-host"}, ours, testpki.Leaf{CN: "rank-host", DNS: []string{"w1.hosts.example"}}, NotAllowed, "dns:w1.hosts.example"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := &tls.Config{RootCAs: ours.Pool(), ServerName: "store.example"}
			if tc.from != nil {
				client.Certificates = []tls.Certificate{tc.from.Issue(t, tc.spec).TLS}
			}
			serverErr, clientErr, saw := handshake(t, ServerConfig(server, mustAllow(t, tc.allow...)), client)
			if got := Classify(serverErr); got != tc.want {
				t.Fatalf("server: %v (%q), want %q", serverErr, got, tc.want)
			}
			if tc.want == "" {
				if clientErr != nil {
					t.Fatalf("client: %v", clientErr)
				}
				if id := PeerOf(saw.PeerCertificates[0]).ID; id != tc.wantID {
					t.Errorf("server saw %q, want %q", id, tc.wantID)
				}
				return
			}
			if clientErr == nil {
				t.Error("the client did not see the refusal")
			}
			var refused *RefusedError
			errors.As(serverErr, &refused)
			gotID := ""
			if refused.Peer != nil {
				gotID = refused.Peer.ID
			}
			if gotID != tc.wantID {
				t.Errorf("refused peer %q, want %q", gotID, tc.wantID)
			}
		})
	}
}

func TestClientRefusals(t *testing.T) {
	ours, theirs := testpki.NewCA(t, "ours"), testpki.NewCA(t, "theirs")
	me := source(ours.Issue(t, testpki.Leaf{URIs: []string{"spiffe://job.example/worker"}}), ours)
	past := time.Now().Add(-48 * time.Hour)
	store := ours.Issue(t, testpki.Leaf{DNS: []string{"store.example"}, URIs: []string{"spiffe://job.example/store"}})
	for _, tc := range []struct {
		name       string
		allow      []string
		serverName string
		server     testpki.Issued
		want       Reason
	}{
		{"host name matches", nil, "store.example", store, ""},
		{"on the list, name ignored", []string{"spiffe://job.example/store"}, "10.0.0.1", store, ""},
		{"host name differs", nil, "other.example", store, NotAllowed},
		{"no host name, no list", nil, "", store, NotAllowed},
		{"not on the list", []string{"spiffe://job.example/other"}, "store.example", store, NotAllowed},
		{"another CA", nil, "store.example", theirs.Issue(t, testpki.Leaf{DNS: []string{"store.example"}}), UnknownCA},
		{"expired", nil, "store.example", ours.Issue(t, testpki.Leaf{DNS: []string{"store.example"}, NotBefore: past, NotAfter: past.Add(time.Hour)}), Expired},
		{"client-only usage", nil, "store.example", ours.Issue(t, testpki.Leaf{DNS: []string{"store.example"}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}), UnknownCA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			server := &tls.Config{Certificates: []tls.Certificate{tc.server.TLS}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ours.Pool()}
			serverErr, clientErr, _ := handshake(t, server, ClientConfig(me, mustAllow(t, tc.allow...), tc.serverName))
			if got := Classify(clientErr); got != tc.want {
				t.Fatalf("client: %v (%q), want %q", clientErr, got, tc.want)
			}
			if (serverErr == nil) != (tc.want == "") {
				t.Errorf("server: %v", serverErr)
			}
		})
	}
}

func TestBothGuards(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	store := source(ca.Issue(t, testpki.Leaf{URIs: []string{"spiffe://td/store"}}), ca)
	worker := source(ca.Issue(t, testpki.Leaf{URIs: []string{"spiffe://td/worker/1"}}), ca)
	server := ServerConfig(store, mustAllow(t, "spiffe://td/worker/*"))
	client := ClientConfig(worker, mustAllow(t, "spiffe://td/store"), "")
	// What our record layer does: a Clone with a KeyLogWriter must verify the same way.
	var serverKeys, clientKeys bytes.Buffer
	server, client = server.Clone(), client.Clone()
	server.KeyLogWriter, client.KeyLogWriter = &serverKeys, &clientKeys
	serverErr, clientErr, saw := handshake(t, server, client)
	if serverErr != nil || clientErr != nil {
		t.Fatalf("server %v, client %v", serverErr, clientErr)
	}
	if saw.Version != tls.VersionTLS13 || saw.DidResume {
		t.Errorf("version %x, resumed %v", saw.Version, saw.DidResume)
	}
	if !strings.Contains(serverKeys.String(), "SERVER_TRAFFIC_SECRET_0") || serverKeys.String() != clientKeys.String() {
		t.Errorf("key logs differ or lack traffic secrets:\n%s\n%s", serverKeys.String(), clientKeys.String())
	}
	// The clone keeps refusing too.
	stranger := source(testpki.NewCA(t, "x").Issue(t, testpki.Leaf{URIs: []string{"spiffe://td/worker/1"}}), ca)
	serverErr, _, _ = handshake(t, server, ClientConfig(stranger, mustAllow(t, "spiffe://td/store"), ""))
	if Classify(serverErr) != UnknownCA {
		t.Errorf("clone accepted a stranger: %v", serverErr)
	}
}

func TestServerNotTLSTimeoutOldVersion(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	server := ServerConfig(source(ca.Issue(t, testpki.Leaf{CN: "store"}), ca), Allow{})
	serve := func(client func(net.Conn)) error {
		sc, cc := tcpPair(t)
		go func() { client(cc); cc.Close() }()
		defer sc.Close()
		s := tls.Server(sc, server)
		s.SetDeadline(time.Now().Add(300 * time.Millisecond))
		return s.Handshake()
	}
	// A plaintext TCPStore client: the first bytes of a torch SET (query type 1, key length).
	err := serve(func(c net.Conn) { c.Write([]byte{1, 3, 0, 0, 0, 0, 0, 0, 0, 'k', 'e', 'y'}); io.Copy(io.Discard, c) })
	if Classify(err) != NotTLS {
		t.Errorf("plaintext: %v (%q)", err, Classify(err))
	}
	err = serve(func(c net.Conn) { io.Copy(io.Discard, c) })
	if Classify(err) != Timeout {
		t.Errorf("silent client: %v (%q)", err, Classify(err))
	}
	err = serve(func(c net.Conn) {
		tls.Client(c, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12}).Handshake()
	})
	if Classify(err) != BadHandshake {
		t.Errorf("TLS 1.2 client: %v (%q)", err, Classify(err))
	}
	err = serve(func(c net.Conn) { c.Write([]byte{0x16, 3, 1, 0, 200, 1}) }) // a ClientHello cut short
	if Classify(err) != BadHandshake {
		t.Errorf("cut short: %v (%q)", err, Classify(err))
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Reason
	}{
		{nil, ""},
		{&RefusedError{Reason: Expired}, Expired},
		{errors.Join(errors.New("ctx"), &RefusedError{Reason: NotAllowed}), NotAllowed},
		{tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake", Conn: &net.TCPConn{}}, NotTLS},
		{tls.RecordHeaderError{Msg: "oversized record received with length 20000"}, BadHandshake},
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, Timeout},
		{io.ErrUnexpectedEOF, BadHandshake},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
