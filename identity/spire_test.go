package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The trust domain and the test workload's ID in the SPIRE the test starts.
const (
	spireTD   = "storeguard.test"
	spireNode = "spiffe://" + spireTD + "/node/test-host"
	spireID   = "spiffe://" + spireTD + "/storeguard/test"
)

// spireBin is where scripts/install-spire.sh puts spire-server and spire-agent.
func spireBin(t *testing.T) string {
	dir := os.Getenv("STOREGUARD_SPIRE_BIN")
	if dir == "" {
		dir = "/var/cache/storeguard/spire/bin"
	}
	for _, b := range []string{"spire-server", "spire-agent"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Skipf("real SPIRE is not installed in %s (run scripts/install-spire.sh, or set STOREGUARD_SPIRE_BIN): %v", dir, err)
		}
	}
	return dir
}

// TestSPIRE starts a real spire-server and spire-agent on loopback and unix sockets, takes an
// X509-SVID through Workload, makes mutual TLS between ServerConfig and ClientConfig with it,
// and waits for the agent to rotate the SVID (20s TTL, renewed at about half its life): a new
// handshake presents the new serial and the established connection still carries data.
func TestSPIRE(t *testing.T) {
	bin := spireBin(t)
	dir, err := os.MkdirTemp("", "sg-spire") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	serverSock, agentSock := filepath.Join(dir, "server.sock"), filepath.Join(dir, "agent.sock")
	_, port, _ := net.SplitHostPort(freePort(t))
	writeConf(t, filepath.Join(dir, "server.conf"), `server {
	bind_address = "127.0.0.1"
	bind_port = "`+port+`"
	socket_path = "`+serverSock+`"
	trust_domain = "`+spireTD+`"
	data_dir = "`+dir+`/server-data"
	log_level = "DEBUG"
	default_x509_svid_ttl = "20s"
	agent_ttl = "1h"
}
plugins {
	DataStore "sql" { plugin_data { database_type = "sqlite3", connection_string = "`+dir+`/datastore.sqlite3" } }
	KeyManager "memory" { plugin_data {} }
	NodeAttestor "join_token" { plugin_data {} }
}
`)
	start(ctx, t, dir, "server", filepath.Join(bin, "spire-server"), "run", "-config", filepath.Join(dir, "server.conf"))
	began := time.Now()
	serverCLI := func(args ...string) string {
		t.Helper()
		var out []byte
		var err error
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			cmd := exec.CommandContext(ctx, filepath.Join(bin, "spire-server"), append(args, "-socketPath", serverSock)...)
			if out, err = cmd.CombinedOutput(); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("spire-server %s: %v\n%s%s", strings.Join(args, " "), err, out, logTail(dir, "server"))
		}
		return string(out)
	}
	serverCLI("healthcheck")
	t.Logf("spire-server healthy after %v", time.Since(began).Round(time.Millisecond))
	token := regexp.MustCompile(`Token: (\S+)`).FindStringSubmatch(serverCLI("token", "generate", "-spiffeID", spireNode))
	if token == nil {
		t.Fatal("spire-server token generate printed no token")
	}
	serverCLI("entry", "create", "-parentID", spireNode, "-spiffeID", spireID,
		"-selector", "unix:uid:"+strconv.Itoa(os.Getuid()))

	writeConf(t, filepath.Join(dir, "agent.conf"), `agent {
	data_dir = "`+dir+`/agent-data"
	log_level = "DEBUG"
	server_address = "127.0.0.1"
	server_port = "`+port+`"
	socket_path = "`+agentSock+`"
	trust_domain = "`+spireTD+`"
	insecure_bootstrap = true
	experimental { sync_interval = "1s" }
}
plugins {
	NodeAttestor "join_token" { plugin_data {} }
	KeyManager "memory" { plugin_data {} }
	WorkloadAttestor "unix" { plugin_data {} }
}
`)
	start(ctx, t, dir, "agent", filepath.Join(bin, "spire-agent"), "run", "-config", filepath.Join(dir, "agent.conf"), "-joinToken", token[1])

	src, err := Workload(ctx, "unix://"+agentSock, quiet)
	if err != nil {
		t.Fatalf("Workload: %v%s", err, logTail(dir, "agent"))
	}
	defer src.Close()
	first := servedSerial(src)
	t.Logf("first SVID %s serial %s after %v", PeerOf(mustLeaf(t, src)).ID, first, time.Since(began).Round(time.Millisecond))

	allow := mustAllow(t, "spiffe://"+spireTD+"/storeguard/*")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", ServerConfig(src, allow))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	clientSerials := make(chan string, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				tc := c.(*tls.Conn)
				if tc.Handshake() == nil {
					clientSerials <- tc.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)
				}
				echo(c)
			}()
		}
	}()
	dialSPIRE := func() (*tls.Conn, string) {
		t.Helper()
		c, err := tls.Dial("tcp", ln.Addr().String(), ClientConfig(src, allow, ""))
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		roundTrip(t, c, "ping")
		if id := PeerOf(c.ConnectionState().PeerCertificates[0]).ID; id != spireID {
			t.Errorf("server presented %q, want %q", id, spireID)
		}
		return c, c.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)
	}
	old, serial := dialSPIRE()
	if serial != first || nextSerial(t, clientSerials) != first {
		t.Fatalf("first handshake presented serial %s, want %s", serial, first)
	}

	deadline := time.Now().Add(60 * time.Second)
	for servedSerial(src) == first {
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not rotate the SVID in 60s%s", logTail(dir, "agent"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	second := servedSerial(src)
	t.Logf("rotated to serial %s after %v", second, time.Since(began).Round(time.Millisecond))
	if _, serial = dialSPIRE(); serial != second {
		t.Errorf("after rotation the server presented serial %s, want %s", serial, second)
	}
	if got := nextSerial(t, clientSerials); got != second {
		t.Errorf("after rotation the client presented serial %s, want %s", got, second)
	}
	roundTrip(t, old, "the connection made with the first SVID still works")
}

// nextSerial is the serial of the client certificate the server accepted next.
func nextSerial(t *testing.T, serials <-chan string) string {
	t.Helper()
	select {
	case s := <-serials:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("the server accepted no handshake")
		return ""
	}
}

func mustLeaf(t *testing.T, src Source) *x509.Certificate {
	c, err := src.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf
}

func writeConf(t *testing.T, path, conf string) {
	t.Helper()
	writeFile(t, path, []byte(conf))
}

// start runs a SPIRE daemon with its output in dir/name.log; it gets SIGTERM when the test ends.
func start(ctx context.Context, t *testing.T, dir, name, bin string, args ...string) {
	t.Helper()
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		log.Close()
	})
}

// logTail is the end of a daemon's log, for a failure message.
func logTail(dir, name string) string {
	b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return fmt.Sprintf("\n--- spire-%s log (end) ---\n%s", name, b)
}
