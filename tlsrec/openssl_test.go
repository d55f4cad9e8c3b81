package tlsrec

import (
	"bufio"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writePEM writes the test PKI as files for OpenSSL.
func (p testPKI) files(t *testing.T, caDER []byte) (dir string) {
	dir = t.TempDir()
	put := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	put("ca.pem", "CERTIFICATE", caDER)
	for name, c := range map[string][]byte{"server": p.server.Certificate[0], "client": p.client.Certificate[0]} {
		put(name+".pem", "CERTIFICATE", c)
	}
	for name, k := range map[string]any{"server": p.server.PrivateKey, "client": p.client.PrivateKey} {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		put(name+".key", "PRIVATE KEY", der)
	}
	return dir
}

// freePort is a loopback port nothing listens on.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestAgainstOpenSSL: our client against `openssl s_server -rev` (which reverses each line it
// reads, and sends its session tickets) in every TLS 1.3 suite, the state moved mid-stream; and
// our server against `openssl s_client`, which asks for a KeyUpdate (its K command).
func TestAgainstOpenSSL(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed (scripts/install-deps.sh installs it)")
	}
	p, caDER := newPKIWithCA(t)
	dir := p.files(t, caDER)
	f := func(n string) string { return filepath.Join(dir, n) }
	for _, suite := range []string{"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"} {
		t.Run("client-"+suite, func(t *testing.T) {
			port := freePort(t)
			srv := exec.Command("openssl", "s_server", "-accept", fmt.Sprintf("127.0.0.1:%d", port), "-tls1_3",
				"-ciphersuites", suite, "-cert", f("server.pem"), "-key", f("server.key"), "-CAfile", f("ca.pem"),
				"-Verify", "1", "-rev", "-naccept", "1", "-quiet")
			srv.Stdout, srv.Stderr = io.Discard, io.Discard
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { srv.Process.Kill(); srv.Wait() }()
			var raw net.Conn
			var err error
			for range 100 {
				if raw, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			s, cs, err := Client(raw, p.clientConfig(), time.Now().Add(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if name := tlsSuiteName(cs.CipherSuite); name != suite {
				t.Fatalf("negotiated %s", name)
			}
			raw.SetDeadline(time.Now().Add(10 * time.Second))
			c := &Conn{Conn: raw, S: s}
			r := bufio.NewReader(c)
			for i, line := range []string{"hello", strings.Repeat("ab", 3000), "after the move"} {
				if i == 2 {
					c = moved(t, c)
					r = bufio.NewReader(c)
				}
				if _, err := c.Write([]byte(line + "\n")); err != nil {
					t.Fatal(err)
				}
				got, err := r.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if want := reverse(line) + "\n"; got != want {
					t.Fatalf("line %d: %d bytes back, want %d", i, len(got), len(want))
				}
			}
		})
	}
	t.Run("server", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cli := exec.Command("openssl", "s_client", "-connect", ln.Addr().String(), "-tls1_3", "-cert", f("client.pem"),
			"-key", f("client.key"), "-CAfile", f("ca.pem"), "-verify_return_error", "-servername", "localhost")
		in, _ := cli.StdinPipe()
		out, _ := cli.StdoutPipe()
		cli.Stderr = io.Discard
		if err := cli.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cli.Process.Kill(); cli.Wait() }()
		raw, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		s, _, err := Server(raw, p.serverConfig(), time.Now().Add(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		raw.SetDeadline(time.Now().Add(10 * time.Second))
		c := &Conn{Conn: raw, S: s}
		r := bufio.NewReader(c)
		for i, line := range []string{"one", "K", "two"} { // K: s_client sends KeyUpdate(update_requested)
			fmt.Fprintln(in, line)
			if line == "K" {
				time.Sleep(300 * time.Millisecond) // s_client takes a read of stdin as one command
				continue
			}
			got, err := r.ReadString('\n')
			if err != nil || got != line+"\n" {
				t.Fatalf("line %d: %q, %v", i, got, err)
			}
			if _, err := c.Write([]byte("re:" + got)); err != nil {
				t.Fatal(err)
			}
		}
		if st := s.State(); st.UpdateOwed {
			t.Fatal("the KeyUpdate s_client asked for was not paid with our next record")
		}
		// s_client prints what it reads: the session ticket our server's crypto/tls sent under
		// the application keys (sequence number 0, so our replies are sealed from 1), then our
		// replies, the second sealed after the KeyUpdate. Its ticket dump ends without a newline,
		// so a reply may follow on the same line.
		sc := bufio.NewScanner(out)
		seen, ticket := 0, false
		go func() { time.Sleep(10 * time.Second); cli.Process.Kill() }() // a reply never printed ends the scan
		for seen < 2 && sc.Scan() {
			ticket = ticket || strings.Contains(sc.Text(), "New Session Ticket arrived")
			seen += strings.Count(sc.Text(), "re:")
		}
		if !ticket {
			t.Fatal("s_client got no session ticket: the replies' sequence numbers were not tested from 1")
		}
		if seen != 2 {
			t.Fatalf("s_client decrypted %d of our 2 replies", seen)
		}
	})
}

func reverse(s string) string {
	b := []byte(s)
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	return string(b)
}
