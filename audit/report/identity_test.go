package report

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

const (
	workerID   = "spiffe://job.example/ns/train/sa/worker"
	notAllowed = "spiffe://job.example/ns/other/sa/x"
)

var (
	workerA, workerB = ip("10.0.1.1"), ip("10.0.1.2")
	rogue            = ip("192.0.2.9")
	intruder4        = ip("198.51.100.4")
	intruder6        = ip("2001:db8::66")
)

// writeTLSLog writes a job over mutual TLS: the worker identity from two hosts (a pod that
// moved), its connections passed but for one blocked message; the master host's own rank in
// plaintext on loopback; a workload of the CA whose identity is not allowed; and an intruder with
// a certificate of another CA, from two addresses.
func writeTLSLog(t testing.TB, path string) {
	t.Helper()
	w, err := audit.Open(path, audit.Options{Observer: &audit.Observer{Hostname: "master-0", Type: "proxy", Version: "test", Host: true}})
	if err != nil {
		t.Fatal(err)
	}
	write := func(e audit.Event) {
		t.Helper()
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	session := &audit.TLS{Version: "1.3", VersionProtocol: "tls", Cipher: "TLS_AES_128_GCM_SHA256", Established: true,
		Subject: "O=job", Issuer: "CN=job CA", AltNames: []string{workerID}, Serial: "01", SHA256: "AB", Identity: workerID}
	var conn uint64
	flow := func(src netip.Addr, hhmm string, v audit.Verdict, reason string, tls *audit.TLS) {
		conn++
		write((&audit.Flow{ConnID: conn, Src: netip.AddrPortFrom(src, uint16(40000+conn)), Dst: storeAddr,
			Start: at(hhmm), End: at(hhmm).Add(30e9), Verdict: v, Reason: reason, Generation: "G3", Mode: audit.ModeEnforce,
			ClosedBy: audit.ClosedByClient, FromClient: 900, ToStore: 900, FromStore: 70, Messages: 12, Replies: 12, TLS: tls}).Event())
	}
	for _, h := range []netip.Addr{workerA, workerA, workerB} {
		flow(h, "12:00", audit.VerdictPassed, "", session)
	}
	flow(ip("127.0.0.1"), "12:00", audit.VerdictPassed, "", nil)
	v := &protocol.Violation{Rule: protocol.RuleKeyTooLong, Field: protocol.FieldKey, Offset: 3, Op: protocol.OpSet,
		Generation: protocol.G3, Declared: 1 << 20, Limit: 8192}
	blocked := audit.ViolationEvent(v, true, netip.AddrPortFrom(workerB, 41000), storeAddr, audit.ActionBlocked, audit.ModeEnforce, nil, 9)
	blocked.TLS, blocked.Timestamp = session, at("12:05")
	write(blocked)
	refuse := func(src netip.Addr, hhmm, why string, tls *audit.TLS) {
		e := audit.HandshakeEvent(netip.AddrPortFrom(src, 50000), storeAddr, why, tls)
		e.Timestamp = at(hhmm)
		write(e)
		conn++
		write((&audit.Flow{ConnID: conn, Src: netip.AddrPortFrom(src, 50000), Dst: storeAddr, Start: at(hhmm), End: at(hhmm),
			Verdict: audit.VerdictRefused, Reason: e.Reason, ClosedBy: audit.ClosedByGuard, Mode: audit.ModeEnforce, TLS: e.TLS}).Event())
	}
	other := *session
	other.Identity, other.AltNames = notAllowed, []string{notAllowed}
	refuse(rogue, "12:10", "identity_not_allowed", &other)
	claimed := *session // another CA's certificate that claims the worker's name
	for range 3 {
		refuse(intruder4, "12:20", "unknown_ca", &claimed)
	}
	refuse(intruder6, "12:21", "unknown_ca", &claimed)
	refuse(intruder6, "12:22", "not_tls", nil)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSourcesByIdentity: a row per identity with its addresses, a row per address for what came
// without one; a certificate of another CA that claims the worker's name groups nothing under it.
func TestSourcesByIdentity(t *testing.T) {
	t.Chdir(t.TempDir())
	writeTLSLog(t, "audit.log")
	s, err := Summarize([]string{"audit.log"}, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		key, role string
		ips       string
		conns     uint64
	}
	var got []row
	for _, st := range s.Sources {
		key := st.Identity
		if key == "" {
			key = st.IP.String()
		}
		got = append(got, row{key, st.Role, ipsText(st.IPs), st.Connections})
	}
	want := []row{
		{intruder4.String(), RoleHostile, "", 3},
		{intruder6.String(), RoleHostile, "", 2},
		{workerID, RoleMixed, "10.0.1.1, 10.0.1.2", 3},
		{notAllowed, RoleHostile, rogue.String(), 1},
		{"127.0.0.1", RoleJob, "", 1},
	}
	if !slices.Equal(got, want) {
		t.Errorf("sources:\n got %v\nwant %v", got, want)
	}
	if s.TotalSources != 5 || s.JobSources != 1 || s.HostileSources != 4 {
		t.Errorf("sources %d, job %d, hostile %d; want 5, 1, 4", s.TotalSources, s.JobSources, s.HostileSources)
	}
	if r := s.ByRule[0]; r.Key != "key_too_long" || r.Sources != 1 {
		t.Errorf("rule %s from %d sources, want key_too_long from 1 (the worker identity)", r.Key, r.Sources)
	}
	wantHS := []HandshakeStats{
		{Key: "tls_unknown_ca", Events: 4, Connections: 4, Sources: 2, IPs: []netip.Addr{intruder4, intruder6}},
		{Key: "tls_identity_not_allowed", Events: 1, Connections: 1, Sources: 1, IPs: []netip.Addr{rogue}},
		{Key: "tls_not_tls", Events: 1, Connections: 1, Sources: 1, IPs: []netip.Addr{intruder6}},
	}
	if !slices.EqualFunc(s.Handshakes, wantHS, func(a, b HandshakeStats) bool {
		return a.Key == b.Key && a.Events == b.Events && a.Connections == b.Connections && a.Sources == b.Sources && slices.Equal(a.IPs, b.IPs)
	}) {
		t.Errorf("handshakes:\n got %+v\nwant %+v", s.Handshakes, wantHS)
	}

	var table, csv, html bytes.Buffer
	s.Write(&table, "table")
	s.Write(&csv, "csv")
	s.WriteHTML(&html)
	for _, c := range []struct {
		format, out, want string
	}{
		{"table", table.String(), "REFUSED HANDSHAKES: tls_unknown_ca 4 (2 addresses: 198.51.100.4, 2001:db8::66),\ntls_identity_not_allowed 1 (1 address: 192.0.2.9)"},
		{"table", table.String(), "\n  " + notAllowed + "       hostile  12:10:00-12:10:00  1"},
		{"table", table.String(), "jobs: 127.0.0.1 (1 connection passed)"},
		{"table", table.String(), "  " + workerID + " from 10.0.1.1, 10.0.1.2\n"},
		{"csv", csv.String(), "source," + workerID + ",1,0,1,"},
		{"csv", csv.String(), ",mixed,nothing,,,,,,3 passed,,,2,10.0.1.1 10.0.1.2\n"},
		{"csv", csv.String(), "handshake,tls_unknown_ca,4,0,4,,,4,,,,,,,,,,,,2,198.51.100.4 2001:db8::66\n"},
		{"html", html.String(), `data-figure="source:` + workerID + `:ips">10.0.1.1, 10.0.1.2</span>`},
		{"html", html.String(), `data-figure="handshake:tls_unknown_ca:ips">198.51.100.4, 2001:db8::66</td>`},
		{"html", html.String(), `data-figure="source:198.51.100.4:ip">198.51.100.4</code>`},
	} {
		if !strings.Contains(c.out, c.want) {
			t.Errorf("%s lacks %q:\n%s", c.format, c.want, c.out)
		}
	}
	if strings.Contains(table.String(), "REFUSED (admission, not rules)") {
		t.Errorf("the handshakes are listed as admission refusals too:\n%s", table.String())
	}
}

// TestIdentityGolden: the TLS scenario in each format. Rewrite with: go test ./audit/report -run Golden -update
func TestIdentityGolden(t *testing.T) {
	testdata, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	writeTLSLog(t, "audit.log")
	for _, format := range []string{"table", "json", "csv", "html"} {
		t.Run(format, func(t *testing.T) {
			got := summaryOutput(t, format, "audit.log")
			path := filepath.Join(testdata, "identity."+format+".golden")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("output differs from %s:\n%s", path, lineDiff(string(want), string(got)))
			}
		})
	}
}

// TestLongIdentityIsOther: a log may come from anywhere; an identity longer than a SPIFFE ID can
// be is grouped as other, and the event's shared TLS is left as it was.
func TestLongIdentityIsOther(t *testing.T) {
	tls := &audit.TLS{Established: true, Identity: "spiffe://td/" + strings.Repeat("a", 3000)}
	e := audit.Event{Action: audit.ActionBlocked, Reason: "key_too_long", SourceIP: workerA, TLS: tls}
	if ke := knownNames(e); ke.PeerIdentity() != OtherName {
		got := ke.PeerIdentity()
		t.Errorf("identity %d bytes long read as %.20q, want %q", len(tls.Identity), got, OtherName)
	}
	if len(tls.Identity) != 3012 {
		t.Error("knownNames changed the event's TLS in place")
	}
}
