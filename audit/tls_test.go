package audit_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

// clientCert is a real client certificate, self-signed: its names are what a peer presents.
func clientCert(t testing.TB, cn string, uris []string, dns []string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(0x55fbb9c7debf),
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"storeguard test"}},
		NotBefore:    time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:     time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		DNSNames:     dns,
		IPAddresses:  []net.IP{net.ParseIP("::ffff:10.77.0.2")},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dst6 is the guard's address as the IPv6 intruder reaches it.
var dst6 = netip.MustParseAddrPort("[2001:db8::1]:29499")

const workerID = "spiffe://job.example/ns/train/sa/worker"

// tlsKinds writes, through a real Writer with obs, the events a mutual-TLS connection makes: the
// events and flow of an established session (storeguard.identity set), and a refused handshake of
// every reason with its refused flow. everyKind and tlsKinds together are every kind storeguard
// writes; the golden (TestEventLinesGolden) holds everyKind's alone, which set no TLS field.
func tlsKinds(t *testing.T, obs *audit.Observer) []doc {
	t.Helper()
	var buf bytes.Buffer
	now := t0
	w := audit.New(&buf, audit.Options{Observer: obs, Clock: func() time.Time { return now }})
	var docs []doc
	write := func(name string, e audit.Event) {
		t.Helper()
		mark := buf.Len()
		if err := w.Write(e); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		docs = append(docs, splitLines(t, name, buf.Bytes()[mark:])...)
		now = now.Add(time.Millisecond)
	}
	worker := clientCert(t, "worker-0", []string{workerID}, []string{"worker-0.job.example"})
	session := audit.NewTLS(tls.VersionTLS13, tls.TLS_AES_128_GCM_SHA256, worker, true, workerID)

	keyTooLong := &protocol.Violation{Rule: protocol.RuleKeyTooLong, Field: protocol.FieldKey, Offset: 3,
		Op: protocol.OpSet, Wire: 0x03, Generation: protocol.G0, Declared: 1 << 40, Limit: 8192}
	blocked := audit.ViolationEvent(keyTooLong, true, srcV4, dstV4, audit.ActionBlocked, audit.ModeEnforce, []byte{3, 0, 0, 0x0b}, 4)
	blocked.TLS = session
	write("blocked (tls)", blocked)
	banned := audit.AdmissionEvent(srcV4, dstV4, audit.ActionBanned, string(protocol.RuleKeyTooLong)) // a source banned, its last connection over TLS
	banned.TLS = session
	write("banned (tls)", banned)
	fl := audit.Flow{ConnID: 300, Src: srcV4, Dst: dstV4, Start: now.Add(-time.Minute), End: now, Verdict: audit.VerdictPassed,
		ClosedBy: audit.ClosedByClient, Generation: "G3", Mode: audit.ModeEnforce, FromClient: 90, ToStore: 90, FromStore: 40,
		Messages: 3, Replies: 3, TLS: session}
	write("flow/passed (tls)", fl.Event())

	intruder := clientCert(t, "worker-0", []string{workerID}, nil) // claims the worker's name, of another CA
	for _, c := range []struct {
		why  string
		tls  *audit.TLS
		cert bool
	}{
		{"unknown_ca", audit.NewTLS(tls.VersionTLS13, tls.TLS_AES_128_GCM_SHA256, intruder, false, workerID), true},
		{"identity_not_allowed", audit.NewTLS(tls.VersionTLS13, tls.TLS_AES_256_GCM_SHA384, worker, false, "spiffe://job.example/ns/other"), true},
		{"expired", audit.NewTLS(tls.VersionTLS13, 0, worker, false, workerID), true},
		{"no_certificate", audit.NewTLS(tls.VersionTLS13, tls.TLS_CHACHA20_POLY1305_SHA256, nil, false, ""), false},
		{"not_tls", nil, false},
		{"handshake_timeout", audit.NewTLS(0, 0, nil, false, ""), false},
	} {
		write("denied/tls_"+c.why, audit.HandshakeEvent(srcScan, dst6, c.why, c.tls))
		refused := audit.Flow{ConnID: 400, Src: srcScan, Dst: dst6, Start: now, End: now, Verdict: audit.VerdictRefused,
			Reason: audit.TLSReasonPrefix + c.why, ClosedBy: audit.ClosedByGuard, Mode: audit.ModeEnforce,
			TLS: audit.HandshakeEvent(srcScan, dst6, c.why, c.tls).TLS}
		write("flow/refused/tls_"+c.why, refused.Event())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return docs
}

// allKinds is every kind of event storeguard writes: everyKind's and tlsKinds'.
func allKinds(t *testing.T, obs *audit.Observer) []doc {
	return append(everyKind(t, obs), tlsKinds(t, obs)...)
}

func TestNewTLS(t *testing.T) {
	c := clientCert(t, "worker-0", []string{workerID}, []string{"worker-0.job.example"})
	got := audit.NewTLS(tls.VersionTLS13, tls.TLS_AES_128_GCM_SHA256, c, true, workerID)
	sum := sha256.Sum256(c.Raw)
	want := &audit.TLS{
		Version: "1.3", VersionProtocol: "tls", Cipher: "TLS_AES_128_GCM_SHA256", Established: true,
		Subject: "CN=worker-0,O=storeguard test", Issuer: "CN=worker-0,O=storeguard test",
		AltNames: []string{workerID, "worker-0.job.example", "10.77.0.2"},
		Serial:   "55FBB9C7DEBF", NotBefore: c.NotBefore, NotAfter: c.NotAfter,
		SHA256: strings.ToUpper(hex.EncodeToString(sum[:])), Identity: workerID,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("NewTLS:\n got %+v\nwant %+v", got, want)
	}
	if got := audit.NewTLS(tls.VersionTLS12, 0, nil, false, ""); got.Version != "1.2" || got.Cipher != "" || got.SHA256 != "" {
		t.Errorf("NewTLS of TLS 1.2 without a certificate: %+v", got)
	}
	cs := &tls.ConnectionState{Version: tls.VersionTLS13, CipherSuite: tls.TLS_AES_128_GCM_SHA256, HandshakeComplete: true,
		PeerCertificates: []*x509.Certificate{c}}
	if got := audit.TLSOf(cs, workerID); !reflect.DeepEqual(got, want) {
		t.Errorf("TLSOf:\n got %+v\nwant %+v", got, want)
	}
}

// TestNewTLSBounded: a certificate of any CA may be presented; what it puts in an event is bounded.
func TestNewTLSBounded(t *testing.T) {
	var dns []string
	for i := range 100 {
		dns = append(dns, strings.Repeat("a", 60)+"."+strings.Repeat("b", 60)+"."+strings.Repeat("c", 60)+"."+
			strings.Repeat("d", 60)+"."+strings.Repeat("e", 60)+".x"+string(rune('a'+i%26)))
	}
	c := clientCert(t, strings.Repeat("é", 200), nil, dns)
	got := audit.NewTLS(tls.VersionTLS13, 0, c, false, "")
	if len(got.AltNames) != audit.MaxAltNames {
		t.Errorf("%d alternative names, want %d", len(got.AltNames), audit.MaxAltNames)
	}
	for _, s := range append([]string{got.Subject, got.Issuer}, got.AltNames...) {
		if len(s) > audit.MaxCertField || !utf8Valid(s) {
			t.Errorf("a field of %d bytes (valid UTF-8 %v), want at most %d", len(s), utf8Valid(s), audit.MaxCertField)
		}
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

// TestHandshakeEvent: a refused handshake is a denied event, reason tls_<why>, never established,
// with storeguard.identity only when the certificate chained to a configured CA.
func TestHandshakeEvent(t *testing.T) {
	c := clientCert(t, "w", []string{workerID}, nil)
	presented := audit.NewTLS(tls.VersionTLS13, 0, c, true, workerID)
	for why, wantID := range map[string]string{"unknown_ca": "", "expired": "", "identity_not_allowed": workerID, "no_certificate": ""} {
		e := audit.HandshakeEvent(srcScan, dst6, why, presented)
		if e.Action != audit.ActionDenied || e.Reason != "tls_"+why || e.TLS == nil || e.TLS.Established ||
			e.PeerIdentity() != wantID || e.TLS.SHA256 != presented.SHA256 || e.CommunityID == "" {
			t.Errorf("%s: %+v, TLS %+v; want denied tls_%s, identity %q", why, e, e.TLS, why, wantID)
		}
	}
	if !presented.Established || presented.Identity != workerID {
		t.Error("HandshakeEvent changed the TLS it was given (shared by the connection's other events)")
	}
	if e := audit.HandshakeEvent(srcScan, dst6, "not_tls", nil); e.TLS != nil || e.PeerIdentity() != "" {
		t.Errorf("not_tls: TLS %+v, want none", e.TLS)
	}
}

// TestTLSClassified: a refused handshake is a failed authentication (ECS authentication, start,
// outcome failure) and a refused connection; a session's events keep their class.
func TestTLSClassified(t *testing.T) {
	type class struct {
		category, typ   string
		outcome         string
		severity        string
		ruleCategory    string
		identity, estab any
	}
	want := map[string]class{
		"denied/tls_unknown_ca":           {"network authentication", "connection denied start", "failure", "3", "tls", nil, false},
		"denied/tls_identity_not_allowed": {"network authentication", "connection denied start", "failure", "3", "tls", "spiffe://job.example/ns/other", false},
		"denied/tls_not_tls":              {"network authentication", "connection denied start", "failure", "3", "tls", nil, nil},
		"flow/refused/tls_unknown_ca":     {"network", "connection end", "success", "3", "tls", nil, false},
		"blocked (tls)":                   {"network intrusion_detection", "connection denied", "success", "5", "protocol", workerID, true},
		"flow/passed (tls)":               {"network", "connection end", "success", "1", "", workerID, true},
	}
	for _, d := range tlsKinds(t, nil) {
		w, ok := want[d.name]
		if !ok {
			continue
		}
		delete(want, d.name)
		rc, _ := d.m["rule.category"].(string)
		got := class{strings.Join(strs(d.m["event.category"]), " "), strings.Join(strs(d.m["event.type"]), " "),
			str(d.m["event.outcome"]), str(d.m["event.severity"]), rc, d.m["storeguard.identity"], d.m["tls.established"]}
		if got != w {
			t.Errorf("%s:\n got %+v\nwant %+v\n%s", d.name, got, w, d.line)
		}
	}
	for name := range want {
		t.Errorf("the corpus has no %s", name)
	}
}

// str is a decoded value as text: "" for none.
func str(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

// TestTLSReadBack: the reader gives back every TLS field as written; an event without them has
// no TLS.
func TestTLSReadBack(t *testing.T) {
	c := clientCert(t, "w", []string{workerID}, []string{"w.job.example"})
	session := audit.NewTLS(tls.VersionTLS13, tls.TLS_AES_128_GCM_SHA256, c, true, workerID)
	var buf bytes.Buffer
	w := audit.New(&buf, audit.Options{Clock: func() time.Time { return t0 }})
	plain := audit.Flow{ConnID: 1, Src: srcV4, Dst: dstV4, Start: t0, End: t0, Verdict: audit.VerdictPassed}
	withTLS := plain
	withTLS.ConnID, withTLS.TLS = 2, session
	for _, e := range []audit.Event{plain.Event(), withTLS.Event(), audit.HandshakeEvent(srcScan, dst6, "no_certificate",
		audit.NewTLS(tls.VersionTLS13, 0, nil, false, ""))} {
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	var got []audit.Event
	for e, err := range audit.Events(&buf) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	if len(got) != 3 {
		t.Fatalf("read %d events, want 3", len(got))
	}
	if got[0].TLS != nil {
		t.Errorf("an event without TLS fields read back with TLS %+v", got[0].TLS)
	}
	if !reflect.DeepEqual(got[1].TLS, session) {
		t.Errorf("TLS read back:\n got %+v\nwant %+v", got[1].TLS, session)
	}
	if h := got[2].TLS; h == nil || h.Established || h.Version != "1.3" || got[2].Reason != "tls_no_certificate" {
		t.Errorf("refused handshake read back: reason %q, TLS %+v", got[2].Reason, h)
	}
}

// TestTLSSampledAndRotatedAsDenials: sampling takes a refused handshake as another denial (its
// first of a kind kept, the rest counted by kind in the summary) and the flows file set never
// takes it.
func TestTLSSampledAndRotatedAsDenials(t *testing.T) {
	var buf bytes.Buffer
	now := t0
	w := audit.New(&buf, audit.Options{Clock: func() time.Time { return now }, SampleFirst: 1, SampleWindow: time.Minute})
	for range 5 {
		if err := w.Write(audit.HandshakeEvent(srcScan, dst6, "unknown_ca", nil)); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
	}
	w.Close()
	var denied, summaries int
	for e, err := range audit.Events(&buf) {
		if err != nil {
			t.Fatal(err)
		}
		switch e.Action {
		case audit.ActionDenied:
			denied++
		case audit.ActionSampledSummary:
			summaries++
			if e.SuppressedBy["denied/tls_unknown_ca"] != 4 {
				t.Errorf("suppressed_by %v, want denied/tls_unknown_ca 4", e.SuppressedBy)
			}
		}
	}
	if denied != 1 || summaries != 1 {
		t.Errorf("%d denied and %d summaries written, want 1 and 1", denied, summaries)
	}

	dir := t.TempDir()
	path := dir + "/audit.log"
	fw, err := audit.Open(path, audit.Options{SeparateFlows: true})
	if err != nil {
		t.Fatal(err)
	}
	c := clientCert(t, "w", []string{workerID}, nil)
	passed := audit.Flow{ConnID: 1, Src: srcV4, Dst: dstV4, Start: t0, End: t0, Verdict: audit.VerdictPassed,
		TLS: audit.NewTLS(tls.VersionTLS13, 0, c, true, workerID)}
	refused := audit.Flow{ConnID: 2, Src: srcScan, Dst: dst6, Start: t0, End: t0, Verdict: audit.VerdictRefused, Reason: "tls_unknown_ca"}
	for _, e := range []audit.Event{passed.Event(), refused.Event(), audit.HandshakeEvent(srcScan, dst6, "unknown_ca", nil)} {
		if err := fw.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	fw.Close()
	events, flows := readFile(t, path), readFile(t, audit.FlowsPath(path))
	if len(events) != 2 || events[0].Reason != "tls_unknown_ca" || events[1].Reason != "tls_unknown_ca" {
		t.Errorf("audit log: %d events %v, want the refused flow and the denied event", len(events), reasons(events))
	}
	if len(flows) != 1 || flows[0].PeerIdentity() != workerID {
		t.Errorf("flows file: %d records, want the passed one with its identity", len(flows))
	}
}

func readFile(t *testing.T, path string) []audit.Event {
	t.Helper()
	var out []audit.Event
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for e, err := range audit.Events(bytes.NewReader(b)) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

func reasons(es []audit.Event) []string {
	var out []string
	for _, e := range es {
		out = append(out, string(e.Action)+"/"+e.Reason)
	}
	return out
}

// TestTLSCostsNothingWhenOff: an event's TLS is a pointer the connection's events share: with TLS
// off it is nil, and with it on a flow record allocates no more than without.
func TestTLSCostsNothingWhenOff(t *testing.T) {
	var ops [32]uint64
	ops[protocol.OpSet] = 1
	f := audit.Flow{ConnID: 1, Src: srcV4, Dst: dstV4, Start: t0, End: t0.Add(time.Second), Verdict: audit.VerdictPassed, Ops: &ops}
	if e := f.Event(); e.TLS != nil {
		t.Fatalf("a flow without TLS has TLS %+v", e.TLS)
	}
	off := testing.AllocsPerRun(100, func() { _ = f.Event() })
	f.TLS = audit.NewTLS(tls.VersionTLS13, 0, nil, true, workerID)
	on := testing.AllocsPerRun(100, func() { _ = f.Event() })
	if on != off {
		t.Errorf("Flow.Event allocates %v times with TLS, %v without: the TLS is to be shared, not copied", on, off)
	}
	if e := f.Event(); e.TLS != f.TLS {
		t.Error("a flow's event does not share the connection's TLS")
	}
}
