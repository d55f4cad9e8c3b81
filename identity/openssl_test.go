package identity

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/testpki"
)

// openssl runs the openssl command line with args and returns its stdout as lines. Its stdin
// stays open (at EOF s_client and s_server quit) and it is killed when the test ends.
func openssl(t *testing.T, args ...string) <-chan string {
	t.Helper()
	bin, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("openssl is not installed (scripts/install-deps.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	cmd := exec.CommandContext(ctx, bin, args...)
	stdin, hold := io.Pipe()
	cmd.Stdin = stdin
	cmd.Stderr = &testWriter{t: t, prefix: "openssl: "}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hold.Close(); cancel(); cmd.Wait() })
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
	}()
	return lines
}

// testWriter logs a process's stderr with the test, for the failure that needs it.
type testWriter struct {
	t      *testing.T
	prefix string
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(w.prefix + strings.TrimSpace(string(p)))
	return len(p), nil
}

func waitLine(t *testing.T, lines <-chan string, want string) bool {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return false
			}
			if strings.Contains(l, want) {
				return true
			}
		case <-timeout:
			return false
		}
	}
}

// pemFiles writes a leaf's certificate and key and a CA bundle for openssl.
func pemFiles(t *testing.T, l testpki.Issued, ca *testpki.CA) (cert, key, bundle string) {
	dir := t.TempDir()
	cert, key, bundle = filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem"), filepath.Join(dir, "ca.PEM()")
	for path, data := range map[string][]byte{cert: l.CertPEM, key: l.KeyPEM, bundle: ca.PEM()} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cert, key, bundle
}

// TestOpenSSLClient: openssl s_client against ServerConfig, with and without a certificate.
func TestOpenSSLClient(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	store := source(ca.Issue(t, testpki.Leaf{DNS: []string{"store.example"}}), ca)
	cert, key, bundle := pemFiles(t, ca.Issue(t, testpki.Leaf{URIs: []string{"spiffe://td/worker/openssl"}}), ca)
	for _, tc := range []struct {
		name   string
		args   []string
		want   Reason
		wantID string
	}{
		{"with a certificate", []string{"-cert", cert, "-key", key}, "", "spiffe://td/worker/openssl"},
		{"without", nil, NoCertificate, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			lines := openssl(t, append([]string{"s_client", "-connect", ln.Addr().String(), "-tls1_3",
				"-CAfile", bundle, "-verify_return_error", "-verify_hostname", "store.example", "-quiet"}, tc.args...)...)
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s := tls.Server(c, ServerConfig(store, mustAllow(t, "spiffe://td/worker/*")))
			s.SetDeadline(time.Now().Add(10 * time.Second))
			err = s.Handshake()
			if got := Classify(err); got != tc.want {
				t.Fatalf("handshake: %v (%q), want %q", err, got, tc.want)
			}
			if err != nil {
				return
			}
			if id := PeerOf(s.ConnectionState().PeerCertificates[0]).ID; id != tc.wantID {
				t.Errorf("peer %q, want %q", id, tc.wantID)
			}
			// s_client prints what it receives only after it verified us.
			s.Write([]byte("hello from the guard\n"))
			if !waitLine(t, lines, "hello from the guard") {
				t.Error("s_client did not accept the guard's certificate")
			}
		})
	}
}

// TestOpenSSLServer: ClientConfig against openssl s_server, which requires a client certificate.
func TestOpenSSLServer(t *testing.T) {
	ours, theirs := testpki.NewCA(t, "ours"), testpki.NewCA(t, "theirs")
	me := source(ours.Issue(t, testpki.Leaf{URIs: []string{"spiffe://td/worker/go"}}), ours)
	spec := testpki.Leaf{DNS: []string{"store.example"}, URIs: []string{"spiffe://td/store"}}
	for _, tc := range []struct {
		name   string
		issuer *testpki.CA
		want   Reason
	}{
		{"server of our CA", ours, ""},
		{"server of another CA", theirs, UnknownCA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cert, key, _ := pemFiles(t, tc.issuer.Issue(t, spec), tc.issuer)
			_, _, clientCA := pemFiles(t, testpki.Issued{}, ours)
			addr := freePort(t)
			lines := openssl(t, "s_server", "-accept", addr, "-naccept", "1", "-tls1_3",
				"-cert", cert, "-key", key, "-CAfile", clientCA, "-Verify", "1", "-verify_return_error")
			if !waitLine(t, lines, "ACCEPT") {
				t.Fatal("s_server did not start")
			}
			c, err := tls.Dial("tcp", addr, ClientConfig(me, mustAllow(t, "spiffe://td/store"), ""))
			if got := Classify(err); got != tc.want {
				t.Fatalf("handshake: %v (%q), want %q", err, got, tc.want)
			}
			if err != nil {
				return
			}
			defer c.Close()
			// s_server prints what it receives only from a client it verified.
			c.Write([]byte("hello from the client guard\n"))
			if !waitLine(t, lines, "hello from the client guard") {
				t.Error("s_server did not take the client guard's certificate")
			}
		})
	}
}

// freePort is a loopback address nothing listens on, for a server that binds its own.
func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
