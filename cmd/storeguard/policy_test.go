package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
)

// TestPolicyLearnedFromARealCapturePassesIt learns a policy from each real torch capture, then
// replays the same capture with it (policy.file), in enforce and monitor mode: not one finding,
// every stream passed, no would_block in the audit log.
func TestPolicyLearnedFromARealCapturePassesIt(t *testing.T) {
	pcaps, _ := filepath.Glob("../../replay/testdata/pcap/*.pcapng")
	if len(pcaps) == 0 {
		t.Fatal("no real capture to learn from")
	}
	for _, pcap := range pcaps {
		release, _, _ := strings.Cut(filepath.Base(pcap), "-")
		gen := strings.Join(strings.Split(release, ".")[:2], ".") // 2.1 clients need telling (see replay)
		t.Run(filepath.Base(pcap), func(t *testing.T) {
			dir := t.TempDir()
			learned := filepath.Join(dir, "learned.yaml")
			port := realPort(t, pcap)
			var out, errOut bytes.Buffer
			if status := run([]string{"policy", "learn", "--generation", gen, "--ports", port, "--out", learned, pcap}, &out, &errOut); status != 0 {
				t.Fatalf("learn: status %d, stderr %s", status, errOut.String())
			}
			if !strings.Contains(errOut.String(), "learned: ") {
				t.Errorf("learn says %q", errOut.String())
			}
			b, err := os.ReadFile(learned)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(b), "# Learned by `storeguard policy learn` from "+filepath.Base(pcap)) {
				t.Errorf("no header:\n%s", trim(string(b)))
			}
			rules, err := policy.ParseFile(b, learned)
			if err != nil || len(rules) < 2 || rules[len(rules)-1].Name != policy.NotLearned {
				t.Fatalf("the learned file does not read back: %v\n%s", err, b)
			}
			if status := run([]string{"policy", "check", learned}, &out, &errOut); status != 0 {
				t.Fatalf("policy check of the learned file: status %d: %s", status, errOut.String())
			}
			for _, mode := range []string{"enforce", "monitor"} {
				cfg := filepath.Join(dir, mode+".yaml")
				os.WriteFile(cfg, []byte("mode: "+mode+"\npolicy:\n  file: "+learned+"\n"), 0o600)
				auditLog := filepath.Join(dir, mode+".jsonl")
				streams, events := replayWith(t, cfg, gen, port, auditLog, pcap, 0)
				for _, s := range streams {
					if s["verdict"] != "pass" || s["flow_verdict"] == "would_block" {
						t.Errorf("%s: stream %v", mode, s)
					}
				}
				for _, e := range events {
					if a := e["event.action"]; a == "blocked" || a == "would_block" {
						t.Errorf("%s: finding on the traffic the policy was learned from: %v", mode, e)
					}
				}
			}
		})
	}
}

// TestPolicyLearnedRecordsAHostileSet: a SET the job never did is recorded by the learned policy's
// catch-all (would_block, policy_denied, forwarded); learning from a capture that holds an attack
// says the capture is not clean.
func TestPolicyLearnedRecordsAHostileSet(t *testing.T) {
	pcap := "../../replay/testdata/pcap/2.15.0-libuv.pcapng"
	port := realPort(t, pcap)
	dir := t.TempDir()
	learned := filepath.Join(dir, "learned.yaml")
	var out, errOut bytes.Buffer
	if status := run([]string{"policy", "learn", "--ports", port, "-o", learned, pcap}, &out, &errOut); status != 0 {
		t.Fatalf("learn: status %d, stderr %s", status, errOut.String())
	}
	p, _ := strconv.Atoi(port)
	hostile := filepath.Join(dir, "hostile.pcap")
	set := func(key, value []byte) []byte {
		b := protocol.AppendHandshake(nil, protocol.G6, 7)
		b, err := protocol.Append(b, protocol.G6, protocol.Request{Op: protocol.OpSet, Key: key, Value: value})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	evil, _ := hex.DecodeString("80049527000000000000008c05706f736978948c0673797374656d9493948c0c746f756368202f746d702f7894859452942e")
	writeCapture(t, hostile, uint16(p),
		set([]byte("/torch.rendezvous.job.0/MASTER_ADDR"), []byte("10.6.6.6")), // a key the job never wrote
		set([]byte("/k1"), evil)) // a learned key (utf8 values), and a pickle of os.system
	cfg := filepath.Join(dir, "enforce.yaml")
	os.WriteFile(cfg, []byte("policy:\n  file: "+learned+"\n"), 0o600)
	streams, events := replayWith(t, cfg, "auto", port, filepath.Join(dir, "audit.jsonl"), hostile, 1)
	if len(streams) != 2 || streams[0]["verdict"] != "pass" || streams[0]["flow_verdict"] != "would_block" ||
		streams[1]["verdict"] != "reject" {
		t.Fatalf("streams %v", streams)
	}
	var recorded, blocked bool
	for _, e := range events {
		switch {
		case e["event.action"] == "would_block" && e["event.reason"] == "policy_denied" &&
			e["storeguard.key"] == "/torch.rendezvous.job.0/MASTER_ADDR" && e["storeguard.detail"] == "rule not-learned: set denied":
			recorded = true
		case e["event.action"] == "blocked" && e["event.reason"] == "value_invalid" &&
			strings.HasPrefix(e["storeguard.detail"].(string), "rule learned-") && strings.HasSuffix(e["storeguard.detail"].(string), ": not UTF-8"):
			blocked = true
		}
	}
	if !recorded || !blocked {
		t.Errorf("want the SET recorded by not-learned and the pickle blocked by /k*'s kind; events %v", events)
	}

	// Learning from the hostile capture: exit 1, and the file says so.
	out.Reset()
	errOut.Reset()
	if status := run([]string{"policy", "learn", "--ports", port, hostile}, &out, &errOut); status != 1 ||
		!strings.Contains(out.String(), "NOT A CLEAN CAPTURE: messages that broke a rule, not learned: 1; streams rejected") || strings.Contains(out.String(), "posix") {
		t.Errorf("learn from an attack: status %d, stderr %q\n%s", status, errOut.String(), out.String())
	}
}

func TestPolicyCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(text), 0o600)
		return p
	}
	good := write("good.yaml", "rules:\n  - name: a\n    keys: [\"vllm/*\"]\n    ops: [set]\n    action: value\n    value: {kind: pickle, globals: [builtins.dict]}\n"+
		"  - name: rest\n    action: deny\n    mode: monitor\n")
	badKind := write("kind.yaml", "rules:\n  - name: a\n    action: allow\n  - name: b\n    action: value\n    value: {kind: pickel}\n")
	twice := write("twice.yaml", "rules:\n  - name: a\n    action: allow\n  - name: a\n    action: deny\n")
	unknown := write("unknown.yaml", "rules:\n  - name: a\n    action: allow\n    key: [x]\n")
	for _, tc := range []struct {
		file   string
		status int
		out    string
		errOut string
	}{
		{good, 0, "good.yaml: 2 rules\n  [0] a: value pickle keys vllm/*; ops set\n  [1] rest: deny (monitor) keys every key or none\n", ""},
		{badKind, 2, "", "kind.yaml: rules[1] (b): value.kind: \"pickel\" is not one of"},
		{twice, 2, "", "twice.yaml: rules[1] (a): name \"a\" is used by an earlier rule"},
		{unknown, 2, "", "field key not found"},
		{filepath.Join(dir, "missing.yaml"), 2, "", "missing.yaml"},
	} {
		var out, errOut bytes.Buffer
		status := run([]string{"policy", "check", tc.file}, &out, &errOut)
		if status != tc.status || !strings.Contains(out.String(), tc.out) || !strings.Contains(errOut.String(), tc.errOut) {
			t.Errorf("%s: status %d, stdout %q, stderr %q; want %d, %q, %q", filepath.Base(tc.file), status, out.String(), errOut.String(),
				tc.status, tc.out, tc.errOut)
		}
	}
}

// replayWith replays pcap with the config file cfg and returns each stream's JSON result and
// the audit events; the exit status must be status.
func replayWith(t *testing.T, cfg, gen, port, auditLog, pcap string, status int) (streams, events []map[string]any) {
	t.Helper()
	var out, errOut bytes.Buffer
	if got := run([]string{"replay", "--config", cfg, "--json", "--generation", gen, "--port", port, "--audit", auditLog, pcap}, &out, &errOut); got != status {
		t.Fatalf("replay: status %d, want %d; stderr %s\n%s", got, status, errOut.String(), trim(out.String()))
	}
	for _, ln := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(ln), &m); err != nil {
			t.Fatalf("%v: %q", err, ln)
		}
		streams = append(streams, m)
	}
	f, err := os.Open(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		events = append(events, m)
	}
	return streams, events
}

// writeCapture writes a pcap of one TCP connection to 127.0.0.1:port per payload: handshake, the
// payload from the client, the store's empty reply, and both FINs.
func writeCapture(t *testing.T, path string, port uint16, payloads ...[]byte) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	for i, payload := range payloads {
		client := layers.TCPPort(40000 + i)
		var cseq, sseq uint32 = 1000, 5000
		packet := func(fromClient bool, syn, ack, fin bool, data []byte) {
			tcp := &layers.TCP{SYN: syn, ACK: ack, FIN: fin, PSH: len(data) > 0, Window: 65535}
			src, dst := net.IP{127, 0, 0, 2}, net.IP{127, 0, 0, 1}
			if fromClient {
				tcp.SrcPort, tcp.DstPort, tcp.Seq, tcp.Ack = client, layers.TCPPort(port), cseq, sseq
			} else {
				src, dst = dst, src
				tcp.SrcPort, tcp.DstPort, tcp.Seq, tcp.Ack = layers.TCPPort(port), client, sseq, cseq
			}
			ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src, DstIP: dst}
			tcp.SetNetworkLayerForChecksum(ip)
			eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, EthernetType: layers.EthernetTypeIPv4}
			buf := gopacket.NewSerializeBuffer()
			if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, tcp, gopacket.Payload(data)); err != nil {
				t.Fatal(err)
			}
			at = at.Add(time.Millisecond)
			if err := w.WritePacket(gopacket.CaptureInfo{Timestamp: at, CaptureLength: len(buf.Bytes()), Length: len(buf.Bytes())}, buf.Bytes()); err != nil {
				t.Fatal(err)
			}
			n := uint32(len(data))
			if syn || fin {
				n++
			}
			if fromClient {
				cseq += n
			} else {
				sseq += n
			}
		}
		packet(true, true, false, false, nil)
		packet(false, true, true, false, nil)
		packet(true, false, true, false, nil)
		packet(true, false, true, false, payload)
		packet(false, false, true, false, nil)
		packet(true, false, true, true, nil)
		packet(false, false, true, true, nil)
		packet(true, false, true, false, nil)
	}
}

// TestPolicyJudge: `policy judge` answers for each value as a SET of its key would be judged:
// torch's rendezvous sentinel and a plain dict pass, an os.system pickle and a framework's class
// are blocked, each named; a line that is no object stops it with status 2, naming the line.
func TestPolicyJudge(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "values.jsonl")
	os.WriteFile(in, []byte(`{"name": "sentinel", "key": "/torch.rendezvous.j", "text": "Y2FuaW1hZGFt"}`+"\n"+
		`{"name": "dict", "value": "80047d942e"}`+"\n"+
		`{"name": "system", "value": "63706f7369780a73797374656d0a2856746f7563680a74522e"}`+"\n"+
		`{"name": "framework", "value": "80048c056d796c69628c055468696e679329812e"}`+"\n"), 0o600)
	var out, errOut bytes.Buffer
	if status := run([]string{"policy", "judge", in}, &out, &errOut); status != 0 {
		t.Fatalf("status %d: %s", status, errOut.String())
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var rec struct{ Name, Verdict, Detail string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		got[rec.Name] = rec.Verdict + ": " + rec.Detail
	}
	for name, want := range map[string]string{"sentinel": "pass: ", "dict": "pass: ",
		"system": "blocked: pickle imports posix.system, which runs code", "framework": "blocked: pickle imports mylib.Thing: not on the allow-list"} {
		if !strings.HasPrefix(got[name], want) {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte(`{"text": "x"}`+"\nnot json\n"), 0o600)
	out.Reset()
	errOut.Reset()
	if status := run([]string{"policy", "judge", bad}, &out, &errOut); status != 2 || !strings.Contains(errOut.String(), "line 2: not a JSON object") {
		t.Errorf("status %d, stderr %q", status, errOut.String())
	}
	out.Reset()
	if status := run([]string{"policy", "allowed"}, &out, &errOut); status != 0 || !strings.Contains(out.String(), "\ntorch._utils._rebuild_tensor_v2\n") ||
		strings.Contains(out.String(), "os.system") {
		t.Errorf("policy allowed: status %d, %d bytes", status, out.Len())
	}
}
