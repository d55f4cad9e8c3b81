package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// TestExitStatuses drives the command line as users and scripts do: 0 clean, 1 violations found,
// 2 errors, with the output they print.
func TestExitStatuses(t *testing.T) {
	pcaps, _ := filepath.Glob("../../replay/testdata/pcap/1.13.1-legacy.pcapng")
	if len(pcaps) == 0 {
		t.Fatal("no real capture to replay")
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("limits:\n  max-key-byte: 10\n"), 0o600)
	garbage := filepath.Join(dir, "garbage.pcap")
	os.WriteFile(garbage, []byte("not a capture at all"), 0o600)
	probeLog := filepath.Join(dir, "audit.jsonl")
	os.WriteFile(probeLog, []byte(`{"@timestamp":"2026-11-22T14:53:29Z","event.id":"1","event.action":"blocked","event.reason":"key_too_long","source.ip":"10.0.0.9"}`+"\n"), 0o600)

	cases := []struct {
		name   string
		args   []string
		status int
		out    string // in stdout
		errOut string // in stderr
	}{
		{"config check names the bad key", []string{"config", "check", bad}, 2, "", "limits.max-key-byte: unknown key; did you mean limits.max-key-bytes?"},
		{"config default", []string{"config", "default"}, 0, "max-message-bytes: auto", ""},
		{"replay a clean real capture", []string{"replay", "--json", "--generation", "1.13", "--port", realPort(t, pcaps[0]), pcaps[0]}, 0, `"verdict":"pass"`, ""},
		{"replay garbage", []string{"replay", garbage}, 2, "", garbage},
		{"audit summary", []string{"audit", "--format", "json", probeLog}, 0, `"key_too_long"`, ""},
		{"probe needs a generation", []string{"probe", "--target", "127.0.0.1:1", "--generation", "auto"}, 2, "", "not auto"},
		{"serve with a bad flag value", []string{"serve", "--mode", "block"}, 2, "", "mode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			status := run(c.args, &out, &errOut)
			if status != c.status || !strings.Contains(out.String(), c.out) || !strings.Contains(errOut.String(), c.errOut) {
				t.Errorf("status %d, stdout %q, stderr %q; want status %d with %q / %q",
					status, trim(out.String()), trim(errOut.String()), c.status, c.out, c.errOut)
			}
		})
	}
}

// realPort is the store's port in a real capture: the destination of its first SYN (the
// captures recorded a relay on a free port, see replay/testdata/pcap/README.md).
func realPort(t *testing.T, pcap string) string {
	t.Helper()
	f, err := os.Open(pcap)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	for {
		data, _, err := r.ReadPacketData()
		if err != nil {
			t.Fatalf("no SYN in %s: %v", pcap, err)
		}
		pkt := gopacket.NewPacket(data, r.LinkType(), gopacket.Default)
		if tcp, ok := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP); ok && tcp.SYN && !tcp.ACK {
			return strconv.Itoa(int(tcp.DstPort))
		}
	}
}

func trim(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
