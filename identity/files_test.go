package identity

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/testpki"
)

var quiet = slog.New(slog.DiscardHandler)

// echoServer accepts mutual TLS with ServerConfig(src) on loopback and echoes each connection.
func echoServer(t *testing.T, src Source, allow Allow) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", ServerConfig(src, allow))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go echo(c)
		}
	}()
	return ln.Addr().String()
}

func echo(c net.Conn) {
	defer c.Close()
	io.Copy(c, c)
}

// dial makes a handshake with the echo server and returns the connection and the serial of
// the certificate the server presented.
func dial(t *testing.T, addr string, client testpki.Issued, roots *tls.Config) (*tls.Conn, string, error) {
	t.Helper()
	cfg := roots.Clone()
	cfg.Certificates = []tls.Certificate{client.TLS}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, "", err
	}
	t.Cleanup(func() { c.Close() })
	return c, c.ConnectionState().PeerCertificates[0].SerialNumber.Text(16), nil
}

// roundTrip proves the server accepted the client and the connection carries data.
func roundTrip(t *testing.T, c *tls.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
		t.Fatalf("echo %q, %v; want %q", got, err, msg)
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// replaceFile writes data beside path and renames it over path, so that a poll sees the old
// content or the new, never a file being written.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	writeFile(t, path+".tmp", data)
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func servedSerial(src Source) string {
	c, _ := src.Certificate()
	return c.Leaf.SerialNumber.Text(16)
}

// nextReload waits for OnReload.
func nextReload(t *testing.T, reloads <-chan error) error {
	t.Helper()
	select {
	case err := <-reloads:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("no reload reported")
		return nil
	}
}

func TestFilesRotation(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	spec := testpki.Leaf{DNS: []string{"store.example"}}
	l1, l2, l3 := ca.Issue(t, spec), ca.Issue(t, spec), ca.Issue(t, spec)
	writeFile(t, certFile, l1.CertPEM)
	writeFile(t, keyFile, l1.KeyPEM)
	writeFile(t, caFile, ca.PEM())

	reloads := make(chan error, 64)
	src, err := Files(certFile, keyFile, caFile, FileOptions{Poll: 10 * time.Millisecond, Log: quiet, OnReload: func(err error) { reloads <- err }})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	addr := echoServer(t, src, Allow{})
	worker := ca.Issue(t, testpki.Leaf{CN: "worker"})
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "store.example"}

	old, serial, err := dial(t, addr, worker, client)
	if err != nil || serial != l1.Serial {
		t.Fatalf("first handshake: serial %s, %v; want %s", serial, err, l1.Serial)
	}
	roundTrip(t, old, "before")

	// cert-manager style: the certificate, then the key, each written in place.
	writeFile(t, certFile, l2.CertPEM)
	writeFile(t, keyFile, l2.KeyPEM)
	for nextReload(t, reloads) != nil { // the certificate with the old key may be seen first
	}
	if _, serial, err = dial(t, addr, worker, client); err != nil || serial != l2.Serial {
		t.Fatalf("after rotation: serial %s, %v; want %s", serial, err, l2.Serial)
	}
	roundTrip(t, old, "established connections keep their keys")

	// A half-written certificate keeps the last good pair and names the file.
	replaceFile(t, certFile, l3.CertPEM[:len(l3.CertPEM)/2])
	var fe *FileError
	if err := nextReload(t, reloads); !errors.As(err, &fe) || fe.File != certFile {
		t.Fatalf("half-written certificate reported as %v, want a FileError for %s", err, certFile)
	}
	// The whole new certificate with the old key: never served, the key file is named.
	replaceFile(t, certFile, l3.CertPEM)
	if err := nextReload(t, reloads); !errors.As(err, &fe) || fe.File != keyFile {
		t.Fatalf("mismatched pair reported as %v, want a FileError for %s", err, keyFile)
	}
	if _, serial, err = dial(t, addr, worker, client); err != nil || serial != l2.Serial {
		t.Fatalf("after bad writes: serial %s, %v; want the last good %s", serial, err, l2.Serial)
	}
	replaceFile(t, keyFile, l3.KeyPEM)
	if err := nextReload(t, reloads); err != nil {
		t.Fatalf("complete pair: %v", err)
	}
	if _, serial, err = dial(t, addr, worker, client); err != nil || serial != l3.Serial {
		t.Fatalf("after the key: serial %s, %v; want %s", serial, err, l3.Serial)
	}
	roundTrip(t, old, "still")
}

// TestFilesKubernetesSwap renews the way a Kubernetes secret volume does: every file is a
// symlink through ..data, and ..data is swapped to a new timestamped directory in one rename.
// The renewal also rotates the CA: the bundle gains a new CA that issued the new certificate.
func TestFilesKubernetesSwap(t *testing.T) {
	oldCA, newCA := testpki.NewCA(t, "old ca"), testpki.NewCA(t, "new ca")
	spec := testpki.Leaf{DNS: []string{"store.example"}}
	l1, l2 := oldCA.Issue(t, spec), newCA.Issue(t, spec)
	vol := t.TempDir()
	version := func(name string, l testpki.Issued, bundle []byte) {
		d := filepath.Join(vol, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(d, "tls.crt"), l.CertPEM)
		writeFile(t, filepath.Join(d, "tls.key"), l.KeyPEM)
		writeFile(t, filepath.Join(d, "ca.crt"), bundle)
		if err := os.Symlink(name, filepath.Join(vol, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(vol, "..data_tmp"), filepath.Join(vol, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_11_26_10_00_00.1", l1, oldCA.PEM())
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(vol, f)); err != nil {
			t.Fatal(err)
		}
	}
	src, err := Files(filepath.Join(vol, "tls.crt"), filepath.Join(vol, "tls.key"), filepath.Join(vol, "ca.crt"), FileOptions{Poll: 10 * time.Millisecond, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	addr := echoServer(t, src, Allow{})
	oldWorker, newWorker := oldCA.Issue(t, testpki.Leaf{CN: "w"}), newCA.Issue(t, testpki.Leaf{CN: "w"})
	trustBoth := &tls.Config{RootCAs: oldCA.Pool(), ServerName: "store.example"}
	trustBoth.RootCAs.AddCert(newCA.Cert)

	old, serial, err := dial(t, addr, oldWorker, trustBoth)
	if err != nil || serial != l1.Serial {
		t.Fatalf("first handshake: serial %s, %v", serial, err)
	}
	roundTrip(t, old, "x")
	c, _, err := dial(t, addr, newWorker, trustBoth)
	if err == nil {
		_, err = c.Read(make([]byte, 1))
	}
	if err == nil {
		t.Fatal("a worker of the new CA was accepted before the bundle had it")
	}

	version("..2026_11_26_11_00_00.2", l2, bytes.Join([][]byte{oldCA.PEM(), newCA.PEM()}, nil))
	os.RemoveAll(filepath.Join(vol, "..2026_11_26_10_00_00.1"))
	eventually(t, "the swapped certificate", func() bool { return servedSerial(src) == l2.Serial })
	eventually(t, "the new CA", func() bool {
		roots, _ := src.Roots()
		_, err := newWorker.TLS.Leaf.Verify(x509VerifyOptions(roots))
		return err == nil
	})
	c, serial, err = dial(t, addr, newWorker, trustBoth)
	if err != nil || serial != l2.Serial {
		t.Fatalf("after the swap: serial %s, %v; want %s", serial, err, l2.Serial)
	}
	roundTrip(t, c, "new CA accepted")
	roundTrip(t, old, "old connection kept")
}

func TestFilesErrorsNameTheFile(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	dir := t.TempDir()
	l, other := ca.Issue(t, testpki.Leaf{CN: "a"}), ca.Issue(t, testpki.Leaf{CN: "b"})
	path := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if data != nil {
			writeFile(t, p, data)
		}
		return p
	}
	cert, key, bundle := path("tls.crt", l.CertPEM), path("tls.key", l.KeyPEM), path("ca.crt", ca.PEM())
	for _, tc := range []struct {
		name          string
		cert, key, ca string
		wantFile      string
	}{
		{"missing certificate", path("absent.crt", nil), key, bundle, path("absent.crt", nil)},
		{"key where the certificate goes", path("key-as.crt", l.KeyPEM), key, bundle, path("key-as.crt", nil)},
		{"the key of another certificate", cert, path("other.key", other.KeyPEM), bundle, path("other.key", nil)},
		{"empty CA bundle", cert, key, path("empty.crt", []byte{}), path("empty.crt", nil)},
		{"truncated CA bundle", cert, key, path("cut.crt", ca.PEM()[:len(ca.PEM())-30]), path("cut.crt", nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := Files(tc.cert, tc.key, tc.ca, FileOptions{Log: quiet})
			var fe *FileError
			if !errors.As(err, &fe) || fe.File != tc.wantFile {
				if src != nil {
					src.Close()
				}
				t.Fatalf("Files = %v, want a FileError for %s", err, tc.wantFile)
			}
		})
	}
}
