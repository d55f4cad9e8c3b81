package probename

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/storeguard/storeguard/protocol"
)

// vector is one capture of testdata/observed.json: the first bytes one tool sent to a silent
// listener, and the name Name must give them.
type vector struct {
	Tool  string   `json:"tool"`
	Probe string   `json:"probe"`
	Via   string   `json:"via"`
	Runs  []string `json:"runs"`
	Hex   string   `json:"hex"`
	Want  string   `json:"want"`
	bytes []byte
}

func (v vector) String() string {
	if v.Probe != "" {
		return v.Tool + "/" + v.Probe
	}
	return v.Tool + "/" + v.Via
}

func loadObserved(t testing.TB) []vector {
	b, err := os.ReadFile("testdata/observed.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Vectors []vector `json:"vectors"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Vectors) == 0 {
		t.Fatal("observed.json has no vectors")
	}
	for i := range doc.Vectors {
		if doc.Vectors[i].bytes, err = hex.DecodeString(doc.Vectors[i].Hex); err != nil {
			t.Fatalf("%s: %v", doc.Vectors[i], err)
		}
	}
	return doc.Vectors
}

func TestObserved(t *testing.T) {
	for _, v := range loadObserved(t) {
		if got := Name(v.bytes); got != v.Want {
			t.Errorf("%s (%d bytes %.16x…): Name = %q, want %q", v, len(v.bytes), v.bytes, got, v.Want)
		}
		if v.Want != "" && !Known(v.Want) {
			t.Errorf("%s: Known(%q) is false", v, v.Want)
		}
	}
}

// TestKnown: Known knows every name of the table and the families, and nothing else.
func TestKnown(t *testing.T) {
	for _, name := range []string{"nmap_terminal_server_cookie", "masscan_http_get", "http_options", "rtsp", "smtp_helo"} {
		if !Known(name) {
			t.Errorf("Known(%q) is false", name)
		}
	}
	for _, name := range []string{"", "other", "rdp_x224\x1b]0;t\x07", "=cmd|' /C calc'!A0", "HTTP_GET"} {
		if Known(name) {
			t.Errorf("Known(%q) is true", name)
		}
	}
}

// TestTruncated: a prefix of a capture is named the same or not at all, and only its first
// MaxPrefix bytes count.
func TestTruncated(t *testing.T) {
	for _, v := range loadObserved(t) {
		for k := range len(v.bytes) + 1 {
			got := Name(v.bytes[:k])
			if got != "" && got != v.Want {
				t.Errorf("%s cut to %d bytes: Name = %q, want %q or \"\"", v, k, got, v.Want)
			}
			if k >= MaxPrefix && got != v.Want {
				t.Errorf("%s cut to %d >= MaxPrefix bytes: Name = %q, want %q", v, k, got, v.Want)
			}
		}
	}
}

var nameSyntax = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// TestTable: names are snake case, each exact pattern is the start of a capture with its name
// (the table is made of what the tools sent, not of what their sources say), and no pattern is
// shadowed by an earlier one.
func TestTable(t *testing.T) {
	vs := loadObserved(t)
	seen := map[string]bool{}
	for i, e := range exacts {
		if !nameSyntax.MatchString(e.name) {
			t.Errorf("%q is not lower snake case", e.name)
		}
		if seen[e.name] {
			t.Errorf("%s: two exact entries", e.name)
		}
		seen[e.name] = true
		captured := false
		for _, v := range vs {
			captured = captured || (v.Want == e.name && strings.HasPrefix(string(v.bytes), e.pat))
		}
		if !captured {
			t.Errorf("%s: pattern %x is the start of no capture named so", e.name, e.pat)
		}
		for _, earlier := range exacts[:i] {
			if strings.HasPrefix(e.pat, earlier.pat) {
				t.Errorf("%s is shadowed by %s", e.name, earlier.name)
			}
		}
		if got := Name([]byte(e.pat)); got != e.name {
			t.Errorf("Name(pattern of %s) = %q", e.name, got)
		}
	}
}

// TestFamilies: the structural rules on openings built from their specifications, and on
// near-misses.
func TestFamilies(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		want string
	}{
		{"GET, HTTP/0.9", "GET /\r\n", "http_get"},
		{"PUT", "PUT /x HTTP/1.1\r\nHost: a\r\n\r\n", "http"},
		{"GET absolute-form", "GET http://a/ HTTP/1.1\r\n\r\n", "http_get"},
		{"GET, long URL cut at MaxPrefix", "GET /" + strings.Repeat("a", 80) + " HTTP/1.1\r\n\r\n", "http_get"},
		{"GET, headers not ended", "GET / HTTP/1.1\r\nHost: a\r\n", ""},
		{"GET of no HTTP target", "GET SERVER\r\n\r\n", ""},
		{"GET, other protocol", "GET / FOO/1.0\r\n\r\n", ""},
		{"lower-case method", "get / HTTP/1.0\r\n\r\n", ""},
		{"RTSP DESCRIBE", "DESCRIBE rtsp://a/b RTSP/1.0\r\nCSeq: 1\r\n\r\n", "rtsp"},
		{"SIP OPTIONS", "OPTIONS sip:alice@example.com SIP/2.0\r\nVia: SIP/2.0/TCP h\r\n\r\n", "sip_options"},
		{"SIP INVITE", "INVITE sip:bob@example.com SIP/2.0\r\n\r\n", "sip"},
		{"ssh 1.99", "SSH-1.99-Foo\r\n", "ssh"},
		{"ssh, line not ended", "SSH-2.0-OpenSSH_9.2p1", ""},
		{"ssh, no version", "SSH-\r\n", ""},
		{"RESP, three args", "*3\r\n$3\r\nset\r\n$1\r\nk\r\n$1\r\nv\r\n", "redis_resp"},
		{"RESP, cut in the length", "*1\r\n$", ""},
		{"inline redis command", "PING\r\n", ""},
		{"SMTP EHLO", "EHLO client.example\r\n", "smtp_ehlo"},
		{"SMTP HELO", "HELO x\r\n", "smtp_helo"},
		{"SMTP, line not ended", "EHLO client", ""},
		// RFC 1035 4.2.2: dig's "example.com A" query, id 0x1234, RD.
		{"DNS query", "\x00\x1d\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01", "dns_tcp"},
		{"DNS response", "\x00\x1d\x12\x34\x81\x00\x00\x01\x00\x00\x00\x00\x00\x00", ""},
		{"DNS, two questions", "\x00\x1d\x12\x34\x01\x00\x00\x02\x00\x00\x00\x00\x00\x00", ""},
		// MS-RDPBCGR 4.1.1: an X.224 Connection Request with a mstshash cookie and RDP_NEG_REQ.
		{"RDP, mstsc", "\x03\x00\x00\x2b\x26\xe0\x00\x00\x00\x00\x00Cookie: mstshash=alice\r\n\x01\x00\x08\x00\x03\x00\x00\x00", "rdp_x224"},
		{"RDP, cut", "\x03\x00\x00\x2b\x26\xe0\x00\x00\x00\x00\x00Cookie: msts", ""},
		{"RDP, LI disagrees", "\x03\x00\x00\x0b\x07\xe0\x00\x00\x00\x00\x00", ""},
		// MS-SMB2 2.2.3: an SMB2 NEGOTIATE behind its NetBIOS header.
		{"SMB2 negotiate", "\x00\x00\x00\x66\xfeSMB\x40\x00\x00\x00\x00\x00\x00\x00\x00\x00", "smb_negotiate"},
		{"SMB2 other command", "\x00\x00\x00\x66\xfeSMB\x40\x00\x00\x00\x00\x00\x00\x00\x01\x00", ""},
		// RFC 4120 7.2.2: a short TGS-REQ, its DER length agreeing with the TCP length.
		{"Kerberos TGS-REQ", "\x00\x00\x00\x10\x6c\x0e" + strings.Repeat("\x00", 14), "kerberos"},
		{"Kerberos, lengths disagree", "\x00\x00\x00\x10\x6c\x0f" + strings.Repeat("\x00", 14), ""},
		// RFC 5531: a NULL call to NFS (100003) v3.
		{"RPC NULL call", "\x80\x00\x00\x28" + "\x00\x00\x00\x01" + "\x00\x00\x00\x00" + "\x00\x00\x00\x02" +
			"\x00\x01\x86\xa3" + "\x00\x00\x00\x03" + "\x00\x00\x00\x00" + strings.Repeat("\x00", 16), "sunrpc"},
		{"RPC reply", "\x80\x00\x00\x28" + "\x00\x00\x00\x01" + "\x00\x00\x00\x01" + "\x00\x00\x00\x02" +
			"\x00\x01\x86\xa3" + "\x00\x00\x00\x03" + "\x00\x00\x00\x00", ""},
		// RFC 4511: an anonymous LDAPv3 bind, message id 1, and a StartTLS extended request.
		{"LDAP bind", "\x30\x0c\x02\x01\x01\x60\x07\x02\x01\x03\x04\x00\x80\x00", "ldap"},
		{"LDAP StartTLS", "\x30\x1d\x02\x01\x01\x77\x18\x80\x161.3.6.1.4.1.1466.20037", "ldap"},
		{"LDAP delete", "\x30\x0c\x02\x01\x01\x4a\x07", ""},
		{"X11, big-endian", "B\x00\x00\x0b\x00\x00\x00\x00\x00\x00\x00\x00", "x11"},
		{"X11, version 10", "l\x00\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00", ""},
		{"Java RMI, single op", "JRMI\x00\x02\x4c", "java_rmi"},
		{"Java RMI, bad protocol", "JRMI\x00\x02\x50", ""},
		{"SSLv2 hello, cut", "\x80\x2e\x01\x00\x02\x00\x15\x00\x00\x00", ""},
		{"TLS alert", "\x15\x03\x03\x00\x02\x02\x28", ""},
	} {
		if got := Name([]byte(c.in)); got != c.want {
			t.Errorf("%s: Name = %q, want %q", c.name, got, c.want)
		}
		if c.want != "" && !Known(c.want) {
			t.Errorf("%s: Known(%q) is false", c.name, c.want)
		}
	}
}

func TestNoAllocs(t *testing.T) {
	vs := loadObserved(t)
	torch := torchStreams(t)
	allocs := testing.AllocsPerRun(20, func() {
		for _, v := range vs {
			Name(v.bytes)
		}
		for _, s := range torch {
			Name(s.bytes)
		}
	})
	if allocs != 0 {
		t.Fatalf("Name allocates: %v per run", allocs)
	}
}

func BenchmarkName(b *testing.B) {
	vs := loadObserved(b)
	validate := protocol.AppendHandshake(nil, protocol.LatestGeneration, 1)
	b.Run("observed", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			Name(vs[i%len(vs)].bytes)
		}
	})
	b.Run("torch_validate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Name(validate)
		}
	})
}

// goldenDir holds the protocol package's captures of real torch traffic, one directory per
// release and backend (interop/capture-all.sh).
const goldenDir = "../protocol/testdata/golden"

func goldenGlob(t testing.TB) []string {
	files, _ := filepath.Glob(filepath.Join(goldenDir, "*", "conn*.c2s"))
	if len(files) == 0 {
		t.Fatalf("no torch captures under %s", goldenDir)
	}
	return files
}
