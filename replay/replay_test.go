package replay

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/replay/internal/gencap"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

var (
	t0     = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	server = netip.MustParseAddrPort("10.0.0.1:29500")
	// The #106294 probe: read as G0, an ADD whose key length is 0xe0060b0000.
	probe106294 = []byte{0x03, 0x00, 0x00, 0x0b, 0x06, 0xe0, 0x00, 0x00, 0x00, 0x00, 0x00}
)

func client(n int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(2 + n)}), uint16(40000+n))
}

func client6(n int) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("fd00::%d", 2+n)), uint16(40000+n))
}

var server6 = netip.MustParseAddrPort("[fd00::1]:29500")

func ms(n int) time.Time  { return t0.Add(time.Duration(n) * time.Millisecond) }
func sec(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }

// traffic is what a clean client of generation g sends: its handshake and a mix of requests.
func traffic(t testing.TB, g protocol.Generation) []byte {
	t.Helper()
	b := protocol.AppendHandshake(nil, g, 7)
	reqs := []protocol.Request{
		{Op: protocol.OpSet, Key: []byte("rank0/addr"), Value: []byte("10.0.0.2:41000")},
		{Op: protocol.OpAdd, Key: []byte("counter"), Int: 1},
		{Op: protocol.OpGet, Key: []byte("rank1/addr")},
		{Op: protocol.OpCheck, Keys: [][]byte{[]byte("a"), []byte("b")}},
		{Op: protocol.OpWait, Keys: [][]byte{[]byte("a")}},
		{Op: protocol.OpSet, Key: []byte("pickled"), Value: bytes.Repeat([]byte{0x80, 0x04, 0x95}, 3000)},
		{Op: protocol.OpCompareSet, Key: []byte("cas"), Value: []byte("old"), Desired: []byte("new")},
		{Op: protocol.OpGetNumKeys},
		{Op: protocol.OpDeleteKey, Key: []byte("a")},
	}
	if _, ok := protocol.WireOf(g, protocol.OpMultiGet); ok {
		reqs = append(reqs,
			protocol.Request{Op: protocol.OpMultiGet, Keys: [][]byte{[]byte("a"), []byte("b")}},
			protocol.Request{Op: protocol.OpMultiSet, Keys: [][]byte{[]byte("x")}, Values: [][]byte{[]byte("1")}})
	}
	for _, r := range reqs {
		var err error
		if b, err = protocol.Append(b, g, r); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// scenario writes packets into a capture.
type scenario func(t testing.TB, w *gencap.Writer)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// session is a whole connection: handshake, payload in mss-sized segments with a reply, close.
func session(t testing.TB, w *gencap.Writer, cl, srv netip.AddrPort, at time.Time, payload []byte) {
	c := w.Conn(cl, srv, 1000, 5000)
	must(t, c.Open(at))
	must(t, c.Send(at.Add(time.Millisecond), payload, 1448))
	must(t, c.Reply(at.Add(2*time.Millisecond), []byte{1, 2, 3}, 1448))
	must(t, c.Close(at.Add(3*time.Millisecond)))
}

// cleanAndProbe is one clean G3 session and one #106294 probe.
func cleanAndProbe(v6 bool) scenario {
	return func(t testing.TB, w *gencap.Writer) {
		c0, c1, srv := client(0), client(1), server
		if v6 {
			c0, c1, srv = client6(0), client6(1), server6
		}
		session(t, w, c0, srv, ms(0), traffic(t, protocol.G3))
		session(t, w, c1, srv, ms(10), probe106294)
	}
}

// reordered sends payload over one connection with its segments shuffled, some duplicated and
// one retransmitted re-cut across two others.
func reordered(t testing.TB, w *gencap.Writer, cl netip.AddrPort, at time.Time, payload []byte, seed uint64) {
	c := w.Conn(cl, server, 77, 88)
	must(t, c.Open(at))
	segs := c.Segments(payload, 500)
	rng := rand.New(rand.NewPCG(seed, 1))
	out := slices.Clone(segs)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	for i := 0; i < len(segs); i += 3 {
		out = slices.Insert(out, rng.IntN(len(out)+1), segs[i]) // exact duplicates
	}
	if len(segs) >= 3 { // a retransmission re-cut: the second half of one segment and the first of the next
		a, b := segs[1], segs[2]
		recut := gencap.Segment{Seq: a.Seq + uint32(len(a.Payload)/2), Ack: a.Ack, Flags: a.Flags,
			Payload: append(slices.Clone(a.Payload[len(a.Payload)/2:]), b.Payload[:len(b.Payload)/2]...)}
		out = slices.Insert(out, len(out)/2, recut)
	}
	for i, s := range out {
		must(t, c.Write(at.Add(time.Duration(i+1)*time.Millisecond), s))
	}
	must(t, c.Close(at.Add(time.Duration(len(out)+2)*time.Millisecond)))
}

// drip sends payload's pieces at the given offsets from t0, without closing.
func drip(t testing.TB, c *gencap.Conn, payload []byte, at ...time.Duration) {
	n := len(payload) / len(at)
	for i, d := range at {
		end := (i + 1) * n
		if i == len(at)-1 {
			end = len(payload)
		}
		must(t, c.Send(t0.Add(d), payload[i*n:end], 1448))
	}
}

// bigSet is one SET of a 30 KB value in G0.
func bigSet(t testing.TB) []byte {
	b, err := protocol.Append(nil, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: make([]byte, 30000)})
	must(t, err)
	return b
}

type goldenCase struct {
	name   string
	format gencap.Format
	link   gencap.Link
	gzip   bool
	cfg    func(*config.Config)
	opts   Options
	build  scenario
	mangle func([]byte) []byte // applied to the finished file
	audit  bool                // record the audit log in the golden file
}

var goldenCases = []goldenCase{
	{name: "clean_g0", build: func(t testing.TB, w *gencap.Writer) {
		session(t, w, client(0), server, ms(0), traffic(t, protocol.G0))
	}},
	{name: "clean_g3", build: func(t testing.TB, w *gencap.Writer) {
		session(t, w, client(0), server, ms(0), traffic(t, protocol.G3))
	}},
	{name: "clean_g0_fixed_generation", cfg: func(c *config.Config) { c.Generation = "1.13" }, build: func(t testing.TB, w *gencap.Writer) {
		session(t, w, client(0), server, ms(0), traffic(t, protocol.G0))
	}},
	{name: "probe_106294", audit: true, build: func(t testing.TB, w *gencap.Writer) {
		session(t, w, client(1), server, ms(0), probe106294)
	}},
	{name: "probe_106294_monitor", audit: true, cfg: func(c *config.Config) { c.Mode = config.ModeMonitor },
		build: func(t testing.TB, w *gencap.Writer) { session(t, w, client(1), server, ms(0), probe106294) }},
	{name: "reordered_retransmitted", build: func(t testing.TB, w *gencap.Writer) {
		reordered(t, w, client(0), ms(0), traffic(t, protocol.G3), 1)
		reordered(t, w, client(1), ms(500), append(traffic(t, protocol.G0), probe106294...), 2)
	}},
	{name: "midstream", build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		c.CSeq++ // the handshake happened before the capture
		must(t, c.Send(ms(1), traffic(t, protocol.G3), 1448))
		must(t, c.Close(ms(2)))
	}},
	{name: "gap", build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		segs := c.Segments(append(traffic(t, protocol.G3), bigSet(t)...), 1448)
		must(t, c.Write(ms(1), segs[:3]...))
		must(t, c.Write(ms(2), segs[4:]...)) // segment 3 never captured
		must(t, c.Close(ms(3)))
	}},
	{name: "snaplen", build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		segs := c.Segments(traffic(t, protocol.G3), 1448)
		must(t, c.Write(ms(1), segs[:2]...))
		b, err := w.Frame(c.Client, c.Server, segs[2])
		must(t, err)
		must(t, w.WritePacket(ms(2), slices.Clone(b), 96)) // cut by a 96-byte snap length
		must(t, c.Write(ms(3), segs[3:]...))
		must(t, c.Close(ms(4)))
	}},
	{name: "vlan", link: gencap.VLAN, build: cleanAndProbe(false)},
	{name: "sll", link: gencap.SLL, build: cleanAndProbe(false)},
	{name: "sll2", link: gencap.SLL2, build: cleanAndProbe(false)},
	{name: "ipv6", build: cleanAndProbe(true)},
	{name: "null_loopback", link: gencap.Null, build: func(t testing.TB, w *gencap.Writer) {
		cleanAndProbe(false)(t, w)
		cleanAndProbe(true)(t, w)
	}},
	{name: "raw_ip", link: gencap.Raw, build: func(t testing.TB, w *gencap.Writer) {
		cleanAndProbe(false)(t, w)
		cleanAndProbe(true)(t, w)
	}},
	{name: "pcapng_sll2", format: gencap.Pcapng, link: gencap.SLL2, build: cleanAndProbe(false)},
	{name: "gzip_pcap", gzip: true, build: cleanAndProbe(false)},
	{name: "gzip_pcapng", gzip: true, format: gencap.Pcapng, build: cleanAndProbe(true)},
	{name: "drip_timeout", audit: true, build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(t0))
		drip(t, c, bigSet(t), time.Millisecond, 10*time.Second, 20*time.Second, 35*time.Second)
		must(t, c.Close(sec(36)))
	}},
	{name: "drip_in_time", build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(t0))
		drip(t, c, bigSet(t), time.Millisecond, 10*time.Second, 20*time.Second, 29*time.Second)
		must(t, c.Close(sec(60)))
	}},
	{name: "partial_capture_ends_before_deadline", build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(t0))
		must(t, c.Send(sec(1), bigSet(t)[:5000], 1448))
		session(t, w, client(1), server, sec(20), traffic(t, protocol.G3))
	}},
	{name: "partial_capture_goes_past_deadline", build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(t0))
		must(t, c.Send(sec(1), bigSet(t)[:5000], 1448))
		session(t, w, client(1), server, sec(40), traffic(t, protocol.G3))
	}},
	{name: "partial_closed_before_deadline", build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(t0))
		must(t, c.Send(sec(1), bigSet(t)[:5000], 1448))
		must(t, c.Close(sec(5)))
		session(t, w, client(1), server, sec(40), traffic(t, protocol.G3))
	}},
	{name: "truncated_client_fin", audit: true, build: func(t testing.TB, w *gencap.Writer) {
		session(t, w, client(0), server, ms(0), bigSet(t)[:19]) // a SET cut short by the client's FIN
	}},
	{name: "truncated_store_rst", audit: true, build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		must(t, c.Send(ms(1), bigSet(t)[:2], 1448))
		must(t, c.W.WriteSegment(ms(1).Add(230*time.Microsecond), c.Server, c.Client,
			gencap.Segment{Seq: c.SSeq, Ack: c.CSeq, Flags: gencap.RST | gencap.ACK})) // the store resets it
		session(t, w, client(1), server, sec(40), traffic(t, protocol.G0)) // the capture goes on past the deadline
	}},
	{name: "silent", build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(t0)) // never sends, never closes
		session(t, w, client(1), server, sec(3600), traffic(t, protocol.G0))
	}},
	{name: "first_message_timeout", audit: true, cfg: func(c *config.Config) {
		c.Timeouts.FirstMessage = 10 * time.Second
		c.Generation = "G3"
	}, build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(t0))
		session(t, w, client(1), server, sec(20), traffic(t, protocol.G3))
	}},
	{name: "first_message_spared_g0", cfg: func(c *config.Config) { c.Timeouts.FirstMessage = 10 * time.Second },
		build: func(t testing.TB, w *gencap.Writer) {
			// torch <= 2.0: a working connection, then a silent one from the same host.
			work := w.Conn(client(0), server, 1000, 5000)
			must(t, work.Open(t0))
			must(t, work.Send(ms(1), traffic(t, protocol.G0), 1448))
			silent := w.Conn(netip.AddrPortFrom(client(0).Addr(), 40999), server, 3000, 6000)
			must(t, silent.Open(ms(2)))
			must(t, work.Send(sec(30), traffic(t, protocol.G0), 1448))
			must(t, work.Close(sec(31)))
			must(t, silent.Close(sec(31)))
		}},
	{name: "ports", opts: Options{Ports: []uint16{29400}}, build: func(t testing.TB, w *gencap.Writer) {
		other := netip.MustParseAddrPort("10.0.0.1:29400")
		session(t, w, client(0), other, ms(0), traffic(t, protocol.G3))
		session(t, w, client(1), server, ms(10), probe106294) // 29500 is not selected
	}},
	{name: "port_reuse", build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		must(t, c.Send(ms(1), probe106294, 1448))
		// The store resets it (not in the capture); the same source port comes back with a
		// new ISN and clean traffic.
		c2 := w.Conn(client(0), server, 900000, 5000)
		must(t, c2.Open(ms(100)))
		must(t, c2.Send(ms(101), traffic(t, protocol.G3), 1448))
		must(t, c2.Close(ms(102)))
	}},
	{name: "store_direction_ignored", build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		must(t, c.Send(ms(1), traffic(t, protocol.G3), 1448))
		must(t, c.Reply(ms(2), probe106294, 1448))
		must(t, c.Close(ms(3)))
	}},
	{name: "gap_flushed_while_capture_goes_on", build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		segs := c.Segments(traffic(t, protocol.G3), 1448)
		must(t, c.Write(ms(1), segs[:2]...))
		must(t, c.Write(ms(2), segs[3:]...)) // segment 2 never captured; no FIN either
		for i := range 4 {
			session(t, w, client(1+i), server, sec(30*(i+1)), traffic(t, protocol.G3))
		}
	}},
	{name: "idle_close_then_resume", opts: Options{IdleClose: time.Minute}, build: func(t testing.TB, w *gencap.Writer) {
		c := w.Conn(client(0), server, 1000, 5000)
		must(t, c.Open(ms(0)))
		must(t, c.Send(ms(1), traffic(t, protocol.G3), 1448))
		session(t, w, client(1), server, sec(90), traffic(t, protocol.G3))
		must(t, c.Send(sec(100), traffic(t, protocol.G3)[:100], 1448)) // the first connection again
	}},
	{name: "max_streams", opts: Options{MaxStreams: 2}, build: func(t testing.TB, w *gencap.Writer) {
		var conns []*gencap.Conn
		for i := range 3 { // opening the third lets the first go
			c := w.Conn(client(i), server, uint32(1000*i), 5000)
			must(t, c.Open(ms(i)))
			conns = append(conns, c)
		}
		must(t, conns[1].Send(ms(10), probe106294, 1448))
		must(t, conns[2].Send(ms(11), probe106294, 1448))
		must(t, conns[0].Send(ms(12), probe106294, 1448)) // judged as a new, midstream, stream
	}},
	// A source banned at its 5th violation: its next connections are refused, their first bytes
	// read for ban.peek and judged (bans_test.go has the details).
	{name: "banned_scan", audit: true, cfg: g0, build: scanThenBanned(scanner)},
	{name: "truncated_file", build: func(t testing.TB, w *gencap.Writer) {
		session(t, w, client(0), server, ms(0), traffic(t, protocol.G3))
		c := w.Conn(client(1), server, 1000, 5000)
		must(t, c.Open(ms(10)))
		must(t, c.Send(ms(11), traffic(t, protocol.G0), 1448))
	}, mangle: func(b []byte) []byte { return b[:len(b)-20] }},
	{name: "garbage_file", mangle: func([]byte) []byte {
		return []byte("this is not a capture, it is a text file\n")
	}},
	{name: "corrupt_record", build: cleanAndProbe(false), mangle: func(b []byte) []byte {
		// The third record's captured length says 1 GB.
		off := 24
		for range 2 {
			off += 16 + int(uint32(b[off+8])|uint32(b[off+9])<<8|uint32(b[off+10])<<16|uint32(b[off+11])<<24)
		}
		copy(b[off+8:], []byte{0, 0, 0, 0x40})
		return b
	}},
}

// buildCapture returns the bytes of tc's capture file.
func buildCapture(t testing.TB, tc goldenCase) []byte {
	var buf bytes.Buffer
	w, err := gencap.NewWriter(&buf, tc.format, tc.link)
	must(t, err)
	if tc.build != nil {
		tc.build(t, w)
	}
	must(t, w.Flush())
	b := buf.Bytes()
	if tc.gzip {
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		_, err := zw.Write(b)
		must(t, err)
		must(t, zw.Close())
		b = z.Bytes()
	}
	if tc.mangle != nil {
		b = tc.mangle(b)
	}
	return b
}

// run replays one capture and returns its results, error and audit events.
func run(t testing.TB, tc goldenCase, data []byte) ([]StreamResult, error, []map[string]any) {
	cfg := config.Default()
	if tc.cfg != nil {
		tc.cfg(&cfg)
	}
	opts := tc.opts
	var got []StreamResult
	opts.OnStream = func(r StreamResult) error { got = append(got, r); return nil }
	if tc.audit {
		opts.AuditFile = filepath.Join(t.TempDir(), "audit.jsonl")
	}
	r, err := New(cfg, opts)
	must(t, err)
	err = r.ReadCapture(context.Background(), tc.name+".cap", bytes.NewReader(data))
	must(t, r.Close())
	sum := r.Summary()
	if sum.Streams != len(got) || sum.Pass+sum.Reject+sum.Incomplete+sum.Refused+sum.HalfOpen != sum.Streams {
		t.Errorf("summary %+v does not add up to %d results", sum, len(got))
	}
	var events []map[string]any
	if tc.audit {
		for _, line := range auditLines(t, opts.AuditFile) {
			var e map[string]any
			must(t, json.Unmarshal([]byte(line), &e))
			delete(e, "event.id") // random
			events = append(events, e)
		}
	}
	return got, err, events
}

func render(results []StreamResult, err error, events []map[string]any) []byte {
	var b bytes.Buffer
	jw := NewJSONWriter(&b)
	for _, r := range results {
		jw.Write(r)
	}
	if err != nil {
		fmt.Fprintf(&b, "# error: %v\n", err)
	}
	if len(events) > 0 {
		b.WriteString("# audit\n")
		for _, e := range events {
			line, _ := json.Marshal(e)
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		must(t, os.MkdirAll(filepath.Dir(path), 0o755))
		must(t, os.WriteFile(path, got, 0o644))
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./replay -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (go test ./replay -update rewrites it)\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func TestGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			results, err, events := run(t, tc, buildCapture(t, tc))
			checkGolden(t, tc.name+".jsonl", render(results, err, events))
		})
	}
}

// TestVerdicts pins the verdicts the golden files hold, so that -update cannot quietly accept a
// wrong one.
func TestVerdicts(t *testing.T) {
	type want struct {
		verdicts []string // "pass", "reject:rule@offset", "incomplete:reason"
		err      string   // substring of the error, "" for none
	}
	probe := "reject:key_too_long@1"
	wants := map[string]want{
		"clean_g0":                             {verdicts: []string{"pass"}},
		"clean_g3":                             {verdicts: []string{"pass"}},
		"clean_g0_fixed_generation":            {verdicts: []string{"pass"}},
		"probe_106294":                         {verdicts: []string{probe}},
		"probe_106294_monitor":                 {verdicts: []string{probe}},
		"reordered_retransmitted":              {verdicts: []string{"pass", "reject:key_too_long@" + fmt.Sprint(len(traffic(t, protocol.G0))+1)}},
		"midstream":                            {verdicts: []string{"incomplete:midstream"}},
		"gap":                                  {verdicts: []string{"incomplete:gap"}},
		"snaplen":                              {verdicts: []string{"incomplete:snaplen"}},
		"vlan":                                 {verdicts: []string{"pass", probe}},
		"sll":                                  {verdicts: []string{"pass", probe}},
		"sll2":                                 {verdicts: []string{"pass", probe}},
		"ipv6":                                 {verdicts: []string{"pass", probe}},
		"null_loopback":                        {verdicts: []string{"pass", probe, "pass", probe}},
		"raw_ip":                               {verdicts: []string{"pass", probe, "pass", probe}},
		"pcapng_sll2":                          {verdicts: []string{"pass", probe}},
		"gzip_pcap":                            {verdicts: []string{"pass", probe}},
		"gzip_pcapng":                          {verdicts: []string{"pass", probe}},
		"drip_timeout":                         {verdicts: []string{"reject:message_timeout@0"}},
		"drip_in_time":                         {verdicts: []string{"pass"}},
		"partial_capture_ends_before_deadline": {verdicts: []string{"pass", "pass"}},
		"partial_capture_goes_past_deadline":   {verdicts: []string{"reject:message_timeout@0", "pass"}},
		"partial_closed_before_deadline":       {verdicts: []string{"reject:truncated_message@0", "pass"}},
		"truncated_client_fin":                 {verdicts: []string{"reject:truncated_message@0"}},
		"truncated_store_rst":                  {verdicts: []string{"reject:truncated_message@0", "pass"}},
		"silent":                               {verdicts: []string{"pass", "pass"}},
		"first_message_timeout":                {verdicts: []string{"reject:first_message_timeout@0", "pass"}},
		"first_message_spared_g0":              {verdicts: []string{"pass", "pass"}},
		"ports":                                {verdicts: []string{"pass"}},
		"port_reuse":                           {verdicts: []string{probe, "pass"}},
		"store_direction_ignored":              {verdicts: []string{"pass"}},
		"gap_flushed_while_capture_goes_on":    {verdicts: []string{"pass", "pass", "incomplete:gap", "pass", "pass"}},
		"idle_close_then_resume":               {verdicts: []string{"pass", "pass", "incomplete:midstream"}},
		"max_streams":                          {verdicts: []string{"pass", probe, probe, "incomplete:midstream"}},
		"truncated_file":                       {verdicts: []string{"pass", "pass"}, err: "truncated_file.cap: packet 24 at byte offset"},
		"garbage_file":                         {err: "garbage_file.cap: file header: not a pcap or pcapng capture"},
		"corrupt_record":                       {verdicts: []string{"half_open"}, err: "corrupt_record.cap: packet 3 at byte offset"},
		"banned_scan": {verdicts: []string{probe, probe, probe, probe, probe, "refused:banned", "refused:banned",
			"refused:banned", "refused:banned"}},
	}
	for _, tc := range goldenCases {
		w, ok := wants[tc.name]
		if !ok {
			t.Errorf("%s: no expected verdicts", tc.name)
			continue
		}
		results, err, _ := run(t, tc, buildCapture(t, tc))
		var got []string
		for _, r := range results {
			s := string(r.Verdict)
			switch {
			case r.Violation != nil:
				s += fmt.Sprintf(":%s@%d", r.Violation.Rule, r.Violation.Offset)
			case r.Reason != "":
				s += ":" + r.Reason
			}
			got = append(got, s)
		}
		if !slices.Equal(got, w.verdicts) {
			t.Errorf("%s: verdicts %q, want %q", tc.name, got, w.verdicts)
		}
		switch {
		case w.err == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tc.name, err)
		case w.err != "" && (err == nil || !strings.Contains(err.Error(), w.err)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, w.err)
		case w.err != "":
			if ce := (*CaptureError)(nil); !errors.As(err, &ce) {
				t.Errorf("%s: error %T is not a *CaptureError", tc.name, err)
			}
		}
	}
}

// TestReorderedSameAsInOrder checks that shuffled, duplicated and re-cut segments decode to
// exactly what the in-order stream does.
func TestReorderedSameAsInOrder(t *testing.T) {
	payloads := map[string][]byte{
		"g3":    traffic(t, protocol.G3),
		"g0":    traffic(t, protocol.G0),
		"probe": append(traffic(t, protocol.G0), probe106294...),
		"big":   append(traffic(t, protocol.G0), bigSet(t)...),
	}
	for name, p := range payloads {
		for seed := range uint64(8) {
			inOrder := goldenCase{name: "in_order", build: func(t testing.TB, w *gencap.Writer) {
				c := w.Conn(client(0), server, 77, 88)
				must(t, c.Open(ms(0)))
				must(t, c.Send(ms(1), p, 500))
				must(t, c.Close(ms(2)))
			}}
			shuffled := goldenCase{name: "shuffled", build: func(t testing.TB, w *gencap.Writer) {
				reordered(t, w, client(0), ms(0), p, seed)
			}}
			a, errA, _ := run(t, inOrder, buildCapture(t, inOrder))
			b, errB, _ := run(t, shuffled, buildCapture(t, shuffled))
			if errA != nil || errB != nil || len(a) != 1 || len(b) != 1 {
				t.Fatalf("%s seed %d: %v %v %d %d", name, seed, errA, errB, len(a), len(b))
			}
			a[0].File, b[0].File = "", ""
			a[0].End, b[0].End = time.Time{}, time.Time{}
			ja, _ := json.Marshal(a[0])
			jb, _ := json.Marshal(b[0])
			if !bytes.Equal(ja, jb) {
				t.Errorf("%s seed %d:\nin order %s\nshuffled %s", name, seed, ja, jb)
			}
		}
	}
}

func TestTableOutput(t *testing.T) {
	tc := goldenCase{name: "table", build: func(t testing.TB, w *gencap.Writer) {
		cleanAndProbe(false)(t, w)
		cleanAndProbe(true)(t, w)
		c := w.Conn(client(5), server, 1000, 5000)
		c.CSeq++
		must(t, c.Send(ms(50), traffic(t, protocol.G3), 1448))
		for i := range 6 { // banned at the 5th, the 6th refused, its first bytes judged
			session(t, w, from(scanner, i), server, sec(1+i), probe106294)
		}
	}}
	results, err, _ := run(t, tc, buildCapture(t, tc))
	must(t, err)
	var b bytes.Buffer
	tw := NewTableWriter(&b)
	for _, r := range results {
		must(t, tw.Write(r))
	}
	checkGolden(t, "table.txt", b.Bytes())
}

// TestRealCaptures replays the real torch traffic under testdata/pcap: every stream must pass, its
// flow passed (or empty: torch <= 2.0's silent second connection).
// Each file is named after the torch release that made it; its store port is the one the
// clients sent SYNs to (the captures record a relay on a free port).
func TestRealCaptures(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("testdata", "pcap", "*.pcapng"))
	if len(files) == 0 {
		t.Skip("no real captures in testdata/pcap yet (interop/capture-all.sh records them)")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			port := synPort(t, f)
			release, _, _ := strings.Cut(filepath.Base(f), "-")
			cfg := config.Default()
			cfg.Generation = release
			var got []StreamResult
			_, err := Replay(context.Background(), cfg, []string{f}, Options{Ports: []uint16{port},
				OnStream: func(r StreamResult) error { got = append(got, r); return nil }})
			must(t, err)
			var msgs uint64
			for _, r := range got {
				if r.Verdict != VerdictPass || !slices.Contains([]audit.Verdict{audit.VerdictPassed, audit.VerdictEmpty,
					audit.VerdictOpen}, r.FlowVerdict) {
					b, _ := json.Marshal(r)
					t.Errorf("not pass: %s", b)
				}
				for _, n := range r.Messages {
					msgs += n
				}
			}
			if len(got) == 0 || msgs == 0 {
				t.Errorf("%d streams, %d messages: the capture holds no store traffic on port %d", len(got), msgs, port)
			}
		})
	}
}

// synPort finds the port the capture's connections were opened to.
func synPort(t *testing.T, file string) uint16 {
	f, err := os.Open(file)
	must(t, err)
	defer f.Close()
	src, err := openSource(f)
	must(t, err)
	pd := newPacketDecoder()
	for {
		data, _, lt, err := src.next()
		if err != nil {
			t.Fatalf("%s: no SYN found: %v", file, err)
		}
		if pd.decode(data, lt) && pd.tcp.SYN && !pd.tcp.ACK {
			return pd.dst.Port()
		}
	}
}

func TestAuditFileAndOptions(t *testing.T) {
	cfg := config.Default()
	cfg.Replay.Ports = nil
	if _, err := New(cfg, Options{}); err == nil {
		t.Error("New without any port: want an error")
	}
	if _, err := New(config.Default(), Options{AuditFile: filepath.Join(t.TempDir(), "no", "such", "dir")}); err == nil {
		t.Error("New with an unwritable audit file: want an error")
	}
	bad := config.Default()
	bad.Generation = "G9"
	if _, err := New(bad, Options{}); err == nil {
		t.Error("New with generation G9: want an error")
	}
}

func TestReplayFiles(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for _, tc := range goldenCases[:4] {
		p := filepath.Join(dir, tc.name+".pcap.gz.not-really") // the name says nothing: magic decides
		must(t, os.WriteFile(p, buildCapture(t, tc), 0o644))
		files = append(files, p)
	}
	sum, err := Replay(context.Background(), config.Default(), files, Options{})
	must(t, err)
	if sum.Files != 4 || sum.Streams != 4 || sum.Reject != 1 || sum.Pass != 3 {
		t.Errorf("summary %+v", sum)
	}
	_, err = Replay(context.Background(), config.Default(), []string{filepath.Join(dir, "missing.pcap")}, Options{})
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// BenchmarkReplay replays a generated capture of torch-like G3 traffic held in memory.
func BenchmarkReplay(b *testing.B) {
	var buf bytes.Buffer
	w, err := gencap.NewWriter(&buf, gencap.Pcap, gencap.Ethernet)
	must(b, err)
	must(b, gencap.Traffic(w, gencap.TrafficOptions{Clients: 64, Ops: 40, Rounds: 4, Gen: protocol.G3, Seed: 1}))
	data := buf.Bytes()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r, err := New(config.Default(), Options{})
		must(b, err)
		must(b, r.ReadCapture(context.Background(), "bench", bytes.NewReader(data)))
		if s := r.Summary(); s.Pass != s.Streams || s.Streams != 4*64 {
			b.Fatalf("summary %+v", s)
		}
	}
	b.ReportMetric(float64(w.Packets)*float64(b.N)/b.Elapsed().Seconds(), "packets/s")
}
