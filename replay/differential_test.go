package replay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/guard"
	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/proxy"
	"github.com/storeguard/storeguard/replay"
	"github.com/storeguard/storeguard/replay/internal/gencap"
)

// The differential test: the same client traffic goes through serve forwarding on event loops,
// through serve forwarding on goroutines, and, as a capture, through replay. Per connection, both
// serves must give the store the same bytes, exactly the whole valid messages before the first
// violation, and write the same audit event; replay must judge the stream as serve did (pass, or
// reject by the same rule at the same offset), and its flow record must account for the stream
// as serve's does (verdict, reason, who closed it, bytes forwarded, messages by op).

// diffCases are the configurations the traffic goes through: a pair of serves each, and replay.
var diffCases = []struct {
	generation string
	backend    config.Backend
}{
	{"1.13", config.BackendAuto}, // G0
	{"2.1", config.BackendAuto},  // G1
	{"2.6", config.BackendAuto},  // G3
	{"G4", config.BackendLegacy}, // queue ops are not in the backend
	{"G6", config.BackendLibUV},
}

// diffConfig is case i's configuration, with limits small enough for random lengths to cross.
func diffConfig(i int) config.Config {
	c := config.Default()
	c.Generation, c.Backend = diffCases[i].generation, diffCases[i].backend
	c.Limits.MaxKeyBytes, c.Limits.MaxValueBytes, c.Limits.MaxKeys, c.Limits.MaxMessageBytes = 1<<10, 1<<14, 64, 1<<16
	// No bans, rate caps, dial pacing or store quota: the serves live through every fuzz input, and
	// one source breaks the rules all the time (a ban would outlast the input) and writes keys it
	// never deletes (a serve's account outlives the input, a replay's does not).
	// TestServeAndReplayAgreeOnBans has bans; policy's tests the quota.
	c.Ban.Violations, c.Caps.PerSourceRate = 0, 0
	c.Caps.StoreDialRate, c.Caps.PerSourceStoreDialRate = config.AutoRate{}, 0
	c.Quota.Mode = "off"
	// Nor the value-split rule: its memory of keys appended and written whole outlives the input in
	// a serve, not in a replay, and a serve asks the store for an APPEND's key (one connection more).
	// policy's tests judge it with and without a store.
	c.Policy.ValueSplit = "off"
	return c
}

// FuzzServeModesAndReplayAgree checks the agreement above on diffStreams random client
// connections: seed draws them, which picks the configuration. Its seeds, three per
// configuration, run with every go test.
func FuzzServeModesAndReplayAgree(f *testing.F) {
	pairs := make([][2]*serve, len(diffCases))
	for i := range diffCases {
		pairs[i] = [2]*serve{startServe(f, diffConfig(i), "loops", 2), startServe(f, diffConfig(i), "goroutines", -1)}
	}
	for i := range diffCases {
		for _, seed := range []uint64{1, 2, 3} {
			f.Add(seed, uint8(i))
		}
	}
	f.Fuzz(func(t *testing.T, seed uint64, which uint8) {
		i := int(which) % len(diffCases)
		cfg := diffConfig(i)
		dec, err := cfg.Decoder()
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		streams := make([]clientStream, diffStreams)
		for j := range streams {
			streams[j] = randomStream(rng, dec.Gen.Gen, cfg.Limits)
		}
		var outcomes [2][]outcome
		var serveFlows [2]bool // that serve writes flow records
		for m, s := range pairs[i] {
			mark := s.audit.count()
			for _, st := range streams {
				outcomes[m] = append(outcomes[m], s.send(t, st, len(validPrefix(t, cfg, dec, st.data)) > 0))
			}
			serveFlows[m] = s.collect(t, mark, outcomes[m])
		}
		flows := serveFlows[0] && serveFlows[1]
		judged, replayFlows, _ := replayOf(t, cfg, streams, rng)
		for j, st := range streams {
			loops, goroutines := outcomes[0][j], outcomes[1][j]
			where := fmt.Sprintf("%s, seed %d, connection %d (%s, %d bytes in writes %v)\n%x\n", cfg.Generation, seed, j,
				st.what, len(st.data), st.writeLens(), st.data[:min(len(st.data), 1024)])
			want := validPrefix(t, cfg, dec, st.data)
			for m, o := range []outcome{loops, goroutines} {
				if !bytes.Equal(o.stored, want) {
					t.Fatalf("%s%s: the store received %x\nwant the valid messages %x", where, pairs[i][m].mode, o.stored, want)
				}
				if len(o.events) > 1 {
					t.Fatalf("%s%s: %d audit events %+v", where, pairs[i][m].mode, len(o.events), o.events)
				}
				checkSeen(t, where+pairs[i][m].mode, o.events, st.data, len(want))
			}
			normalize(loops.events)
			normalize(goroutines.events)
			if !reflect.DeepEqual(loops.events, goroutines.events) {
				t.Fatalf("%saudit events differ:\nloops      %s\ngoroutines %s", where, jsonOf(loops.events), jsonOf(goroutines.events))
			}
			s, r := verdictOfEvents(loops.events), verdictOfReplay(judged[j])
			if v := judged[j].Violation; !flows && s == "pass" && v != nil && v.Rule == protocol.RuleTruncatedMessage {
				r = s // a serve without flow records does not record truncated_message either
			}
			if s != r {
				t.Fatalf("%sserve: %s\nreplay: %s", where, s, r)
			}
			checkReplayFlow(t, where, replayFlows[j], judged[j], st.data, len(want))
			if flows {
				for m := range pairs[i] {
					compareFlows(t, where+pairs[i][m].mode, outcomes[m][j].flow, replayFlows[j])
				}
			}
		}
		if !flows {
			t.Skip("serve writes no flow records yet")
		}
	})
}

// checkReplayFlow checks replay's flow record of one stream against the stream: the verdict its
// result implies, the client's bytes (all of them unless the guard closed the stream at a
// violation), the valid prefix's bytes forwarded, and messages by op as its result counts them.
func checkReplayFlow(t *testing.T, where string, f *audit.Event, r replay.StreamResult, data []byte, valid int) {
	t.Helper()
	if f == nil {
		t.Fatalf("%sreplay wrote no flow record", where)
	}
	want := audit.VerdictPassed
	switch {
	case r.Violation != nil && r.Violation.Rule == protocol.RuleTruncatedMessage:
		want = audit.VerdictTruncated
	case r.Violation != nil:
		want = audit.VerdictBlocked
	case len(data) == 0:
		want = audit.VerdictEmpty
	}
	if f.Verdict != want || r.FlowVerdict != want {
		t.Fatalf("%sreplay's flow verdict %q (result %q), want %q", where, f.Verdict, r.FlowVerdict, want)
	}
	seen := uint64(len(data))
	if want == audit.VerdictBlocked {
		seen = r.Bytes // up to the segment the violation was found in
	}
	if f.SourceBytes == nil || *f.SourceBytes != seen || f.StoreBytes == nil || *f.StoreBytes != uint64(valid) {
		t.Fatalf("%sreplay's flow: source.bytes %s, store_bytes %s, want %d and %d", where, val(f.SourceBytes),
			val(f.StoreBytes), seen, valid)
	}
	var n uint64
	for _, c := range r.Messages {
		n += c
	}
	if f.Messages == nil || *f.Messages != n || len(f.Ops) != len(r.Messages) {
		t.Fatalf("%sreplay's flow: messages %s, ops %v, want %d, %v", where, val(f.Messages), f.Ops, n, r.Messages)
	}
}

// compareFlows compares serve's flow record of a connection with replay's of the same stream, but
// for what differs by design: times, ports, ids, what the store sent back (replay's capture has no
// store), and the bytes read from a client the guard closed at a violation (serve's reads are cut
// as the kernel delivered them, replay's as the capture's segments).
func compareFlows(t *testing.T, where string, served, replayed *audit.Event) {
	t.Helper()
	if served == nil {
		t.Fatalf("%s: serve wrote no flow record for the connection", where)
	}
	type account struct {
		Verdict    audit.Verdict
		Reason     string
		ClosedBy   string
		ToStore    string
		Messages   string
		Ops        map[string]uint64
		FromClient string
	}
	of := func(e *audit.Event) account {
		a := account{Verdict: e.Verdict, Reason: e.Reason, ClosedBy: e.ClosedBy, ToStore: val(e.StoreBytes),
			Messages: val(e.Messages), Ops: e.Ops, FromClient: val(e.SourceBytes)}
		if e.Verdict == audit.VerdictBlocked {
			a.FromClient = ""
		}
		return a
	}
	if s, r := of(served), of(replayed); !reflect.DeepEqual(s, r) {
		t.Fatalf("%s: flow records differ:\nserve  %+v\nreplay %+v", where, s, r)
	}
}

func val(p *uint64) string {
	if p == nil {
		return "absent"
	}
	return fmt.Sprint(*p)
}

// diffStreams is how many client connections one fuzz input makes.
const diffStreams = 10

// clientStream is one client connection: its bytes, and where one write ends and the next begins.
type clientStream struct {
	data []byte
	cuts []int // ascending, within (0, len(data))
	what string
}

func (s clientStream) writes() [][]byte {
	var w [][]byte
	from := 0
	for _, c := range append(s.cuts, len(s.data)) {
		w = append(w, s.data[from:c])
		from = c
	}
	return w
}

func (s clientStream) writeLens() []int {
	var n []int
	for _, w := range s.writes() {
		n = append(n, len(w))
	}
	return n
}

// randomStream is a client connection to a guard of generation g: most often g's own handshake
// and requests, sometimes another generation's; then often something hostile (a length or count
// over the limits, an opcode g lacks, a message cut short by the end of the stream, garbage), with
// more requests behind it or not. Requests the decoder takes but the configuration refuses
// (WATCH_KEY, a queue op to a legacy store, a message over max-message-bytes) come up by chance.
func randomStream(rng *rand.Rand, g protocol.Generation, lim config.Limits) clientStream {
	cg := g
	if rng.IntN(5) == 0 {
		cg = protocol.Generation(rng.IntN(int(protocol.LatestGeneration) + 1))
	}
	var s clientStream
	s.what = cg.String()
	if rng.IntN(10) > 0 {
		s.data = protocol.AppendHandshake(nil, cg, rng.Uint32())
	} else {
		s.what += " without handshake"
	}
	requests := func() {
		for range rng.IntN(5) {
			s.data = appendRequest(s.data, rng, cg, lim)
		}
	}
	requests()
	hostile := []struct {
		what   string
		append func([]byte) []byte
	}{
		{"key length over the limit", func(b []byte) []byte {
			return binary.LittleEndian.AppendUint64(append(b, wire(cg, protocol.OpGet)), over(rng, lim.MaxKeyBytes))
		}},
		{"value length over the limit", func(b []byte) []byte {
			b = protocol.AppendBytes(append(b, wire(cg, protocol.OpSet)), []byte("/k"))
			return binary.LittleEndian.AppendUint64(b, over(rng, int64(lim.MaxValueBytes)))
		}},
		{"key count over the limit", func(b []byte) []byte {
			return binary.LittleEndian.AppendUint64(append(b, wire(cg, protocol.OpCheck)), over(rng, lim.MaxKeys))
		}},
		{"unknown opcode", func(b []byte) []byte {
			return append(b, byte(numOpcodes(cg)+rng.IntN(256-numOpcodes(cg))))
		}},
		{"a second handshake (or one of G2 to G0 and G1)", func(b []byte) []byte {
			return protocol.AppendHandshake(b, max(cg, protocol.G2), 0)
		}},
		{"garbage", func(b []byte) []byte {
			for range 1 + rng.IntN(40) {
				b = append(b, byte(rng.Uint32()))
			}
			return b
		}},
		{"partial message, then the end", nil},
	}
	if rng.IntN(3) > 0 {
		h := hostile[rng.IntN(len(hostile))]
		s.what += ", " + h.what
		if h.append == nil {
			m := appendRequest(nil, rng, cg, lim)
			s.data = append(s.data, m[:rng.IntN(len(m))]...)
			return s.cut(rng)
		}
		s.data = h.append(s.data)
		requests()
	}
	return s.cut(rng)
}

// cut splits s into up to 6 writes at random points.
func (s clientStream) cut(rng *rand.Rand) clientStream {
	if len(s.data) < 2 {
		return s
	}
	for range rng.IntN(6) {
		s.cuts = append(s.cuts, 1+rng.IntN(len(s.data)-1))
	}
	slices.Sort(s.cuts)
	s.cuts = slices.Compact(s.cuts)
	return s
}

// appendRequest appends a valid request of generation g: any of its ops but VALIDATE, keys and
// values mostly short, now and then at the limit or long enough to span several reads.
func appendRequest(b []byte, rng *rand.Rand, g protocol.Generation, lim config.Limits) []byte {
	var ops []protocol.Op
	for _, op := range protocol.Ops() {
		if _, ok := protocol.WireOf(g, op); ok && op != protocol.OpValidate {
			ops = append(ops, op)
		}
	}
	bytesOf := func(n int) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		return p
	}
	key := func() []byte {
		if rng.IntN(20) == 0 {
			return bytesOf(int(lim.MaxKeyBytes))
		}
		return bytesOf(1 + rng.IntN(24))
	}
	value := func() []byte {
		if rng.IntN(8) == 0 {
			return bytesOf(rng.IntN(int(lim.MaxValueBytes) + 1))
		}
		return bytesOf(rng.IntN(40))
	}
	r := protocol.Request{Op: ops[rng.IntN(len(ops))], Key: key(), Value: value(), Desired: value(), Int: rng.Int64(),
		U32: rng.Uint32()}
	if rng.IntN(16) == 0 { // a well-formed attack, for the policy stage
		h := hostileValues[rng.IntN(len(hostileValues))]
		r = protocol.Request{Op: protocol.OpSet, Key: h[0], Value: h[1]}
	}
	for range rng.IntN(4) {
		r.Keys, r.Values = append(r.Keys, key()), append(r.Values, value())
	}
	b, err := protocol.Append(b, g, r)
	if err != nil {
		panic(err) // an op of g with as many values as keys
	}
	return b
}

// validPrefix is what a guard may forward of data: every complete message before the first that
// breaks a decoder's or a policy's rule (protocol.ValidPrefix, with the policy stage).
func validPrefix(t *testing.T, cfg config.Config, dec protocol.Config, data []byte) []byte {
	rules, err := cfg.Rules()
	if err != nil {
		t.Fatal(err)
	}
	var g guard.Stream
	g.Reset(dec, &guard.Policy{Configured: dec.Gen, Rules: rules}, time.Time{})
	d := g.Feed(data, time.Time{})
	return data[:d.Forward]
}

// hostileValues are well-formed attacks that appendRequest mixes in: a pickle of os.system on a
// key of its own, and base64 of it as torchrun's rendezvous state.
var hostileValues = func() [][2][]byte {
	evil, _ := hex.DecodeString("80049527000000000000008c05706f736978948c0673797374656d9493948c0c746f756368202f746d702f7894859452942e")
	return [][2][]byte{{[]byte("/vllm/obj"), evil}, {[]byte("/torch.rendezvous.j"), []byte(base64.StdEncoding.EncodeToString(evil))}}
}()

func wire(g protocol.Generation, op protocol.Op) byte {
	w, _ := protocol.WireOf(g, op)
	return w
}

// numOpcodes is the number of opcodes of g: the wire bytes from it on are no opcode.
func numOpcodes(g protocol.Generation) int {
	n := 0
	for protocol.OpOf(g, byte(n)) != protocol.OpInvalid {
		n++
	}
	return n
}

// over is a declared length or count above limit: just above, or far above (the #106294 probe's
// key length, 2^63, the largest u64).
func over(rng *rand.Rand, limit int64) uint64 {
	return []uint64{uint64(limit) + 1, uint64(limit) + 1 + rng.Uint64N(1<<20), 0xE0060B0000, 1 << 63, math.MaxUint64}[rng.IntN(5)]
}

// serve is a proxy under test in front of a recorder, with its audit log.
type serve struct {
	mode  string
	addr  string
	store *storesim.Store
	audit *lines
}

func startServe(tb testing.TB, cfg config.Config, mode string, eventLoops int) *serve {
	store, err := storesim.StartRecorder("127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(store.Close)
	dc, err := cfg.Decoder()
	if err != nil {
		tb.Fatal(err)
	}
	store.Answer(dc.Gen) // serve lets a client have limits.max-pending-replies requests awaiting replies
	cfg.Listen, cfg.Upstream, cfg.MetricsListen, cfg.EventLoops = "127.0.0.1:0", store.Addr(), "", eventLoops
	s := &serve{mode: mode, store: store, audit: &lines{}}
	srv, err := proxy.New(config.MustParse(cfg), proxy.Options{Audit: audit.New(s.audit, audit.Options{})})
	if err != nil {
		tb.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		tb.Fatal(err)
	}
	s.addr = srv.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			tb.Errorf("%s: Serve did not return after cancel", mode)
		}
	})
	return s
}

// outcome is what a serve did with one client connection.
type outcome struct {
	port   uint16        // the client's port
	stored []byte        // what the store received on its connection for it
	events []audit.Event // the violation events it caused (blocked, would_block)
	flow   *audit.Event  // its flow record, if serve writes them
}

// send sends st, write by write, ends the client's side, waits for the guard to close the
// connection and returns what the store received for it (collect adds the audit events). The guard
// connects to the store for a client's first valid message, on either path: a stream with one
// (valid) must have had exactly one store connection, a stream without none. That connection was
// established before the guard closed the client, so the store's Settle finds it.
func (s *serve) send(t *testing.T, st clientStream, valid bool) outcome {
	t.Helper()
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	port := uint16(c.LocalAddr().(*net.TCPAddr).Port)
	for i, w := range st.writes() {
		if i > 0 {
			time.Sleep(time.Millisecond) // most writes become reads of their own
		}
		c.Write(w) // fails once the guard has closed the connection: no matter
	}
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, c); isTimeout(err) {
		t.Fatalf("%s: the guard kept the connection open after the client's end", s.mode)
	}
	from, to, err := s.store.Settle(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	if valid {
		want = 1
	}
	if to-from != want {
		t.Fatalf("%s: %d store connections for a client, want %d", s.mode, to-from, want)
	}
	o := outcome{port: port}
	if valid {
		if o.stored, err = s.store.Wait(from, 10*time.Second); err != nil {
			t.Fatalf("%s: %v", s.mode, err)
		}
	}
	s.store.Forget()
	return o
}

// collect gives each connection of sent its audit events from the log's lines from mark on, by
// the client's port: its violation events (blocked, would_block) and its flow record, and reports
// whether serve writes flow records. A connection's record, and a truncated_message event before
// it, are written once the connection has ended on both sides, which may be after the client saw
// its end: collect waits for every record, once it has seen one.
func (s *serve) collect(t *testing.T, mark int, sent []outcome) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		events := s.audit.events(t, mark)
		flows := map[uint16]*audit.Event{}
		for i := range events {
			if e := &events[i]; e.Action == audit.ActionFlow && e.Verdict != audit.VerdictOpen {
				flows[e.SourcePort] = e
			}
		}
		missing := 0
		for _, o := range sent {
			if flows[o.port] == nil {
				missing++
			}
		}
		switch {
		case missing > 0 && len(flows) > 0 && time.Now().Before(deadline):
			time.Sleep(5 * time.Millisecond)
			continue
		case missing > 0 && len(flows) > 0:
			t.Fatalf("%s: %d of %d connections have no flow record after 10 s", s.mode, missing, len(sent))
		}
		// By now a serve that writes flow records has written the first connections'.
		for j := range sent {
			o := &sent[j]
			o.flow = flows[o.port]
			for _, e := range events {
				if (e.Action == audit.ActionBlocked || e.Action == audit.ActionWouldBlock) && e.SourcePort == o.port {
					o.events = append(o.events, e)
				}
			}
		}
		return len(flows) > 0
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// checkSeen checks the fields of an audit event that depend on how the client's bytes were cut
// into reads, and clears them for the comparison: storeguard.first_bytes, the offending message's
// bytes from its start up to the end of the read it was found in, and storeguard.bytes_seen, the
// bytes read so far. The offending message begins at start, right after the valid ones.
func checkSeen(t *testing.T, where string, events []audit.Event, data []byte, start int) {
	t.Helper()
	for _, e := range events {
		if e.Offset == nil || e.BytesSeen == nil {
			t.Fatalf("%s: event without offset or bytes_seen: %+v", where, e)
		}
		off, seen, first := int(*e.Offset), int(*e.BytesSeen), []byte(e.FirstBytes)
		if seen <= off || seen > len(data) {
			t.Errorf("%s: bytes_seen %d, want more than the offset %d and at most the %d sent", where, seen, off, len(data))
		}
		if !bytes.HasPrefix(data[start:], first) || len(first) < min(audit.MaxFirstBytes, off-start+1) {
			t.Errorf("%s: first_bytes %x, want the offending message's from offset %d up to %d at least: %x", where,
				first, start, off, data[start:min(len(data), start+audit.MaxFirstBytes)])
		}
	}
}

// normalize clears what differs between two serves, or between runs, by design: the time, the
// event's id, the connection's number and ports (and the flow hash made of them), and the fields
// checkSeen has checked.
func normalize(events []audit.Event) {
	for i := range events {
		e := &events[i]
		e.Timestamp, e.ID, e.ConnID, e.SourcePort, e.DestPort, e.CommunityID = time.Time{}, "", 0, 0, 0, ""
		e.FirstBytes, e.BytesSeen = nil, nil
	}
}

// verdictOfEvents is serve's verdict on a connection: pass when it wrote no event.
func verdictOfEvents(events []audit.Event) string {
	if len(events) == 0 {
		return "pass"
	}
	e := events[0]
	val := func(p *uint64) uint64 {
		if p == nil {
			return 0
		}
		return *p
	}
	big := func(p *audit.BigUint) uint64 {
		if p == nil {
			return 0
		}
		return uint64(*p)
	}
	return verdict(string(e.Action), e.Reason, val(e.Offset), val(e.MessageIndex), e.Op, e.Field, big(e.Declared),
		big(e.Limit), e.Generation)
}

func verdictOfReplay(r replay.StreamResult) string {
	switch {
	case r.Verdict == replay.VerdictPass:
		return "pass"
	case r.Verdict != replay.VerdictReject || r.Violation == nil:
		return fmt.Sprintf("%s (%s)", r.Verdict, r.Reason)
	}
	v := r.Violation
	declared := v.Declared
	if v.Field == "" {
		declared = 0 // the bytes of a timed out or cut short message, which the event leaves out
	}
	return verdict("blocked", string(v.Rule), v.Offset, v.MessageIndex, v.Op, v.Field, declared, v.Limit, r.Generation)
}

func verdict(action, rule string, offset, index uint64, op, field string, declared, limit uint64, gen string) string {
	return fmt.Sprintf("%s: %s at offset %d (message %d, %s, %s %d, limit %d, %s)", action, rule, offset, index, op, field,
		declared, limit, gen)
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// diffServer is the store's address in the capture replayOf writes.
var diffServer = netip.MustParseAddrPort("10.0.0.1:29500")

// replayOf writes a capture of the streams, one connection each after the other, every write a
// burst of segments, and returns replay's result and flow record for each stream, in order, and
// all its audit events.
func replayOf(t *testing.T, cfg config.Config, streams []clientStream, rng *rand.Rand) ([]replay.StreamResult, []*audit.Event,
	[]audit.Event) {
	t.Helper()
	var buf bytes.Buffer
	w, err := gencap.NewWriter(&buf, gencap.Pcap, gencap.Ethernet)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	client := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 1, 2}), uint16(40000+i))
	}
	for i, st := range streams {
		c := w.Conn(client(i), diffServer, rng.Uint32(), rng.Uint32())
		must(t, c.Open(at))
		for _, p := range st.writes() {
			at = at.Add(time.Millisecond)
			must(t, c.Send(at, p, 1448))
		}
		at = at.Add(time.Millisecond)
		must(t, c.Close(at))
	}
	must(t, w.Flush())
	results := make([]replay.StreamResult, len(streams))
	cfg.Audit.SampleWindow = 0 // every flow record
	auditFile := filepath.Join(t.TempDir(), "audit.jsonl")
	r, err := replay.New(cfg, replay.Options{Ports: []uint16{diffServer.Port()}, AuditFile: auditFile, OnStream: func(res replay.StreamResult) error {
		i := int(res.Src.Port()) - 40000
		if i < 0 || i >= len(results) || results[i].Verdict != "" {
			return fmt.Errorf("a stream from %v: no such connection, or twice", res.Src)
		}
		results[i] = res
		return nil
	}})
	must(t, err)
	must(t, r.ReadCapture(context.Background(), "differential.pcap", &buf))
	must(t, r.Close())
	for i, res := range results {
		if res.Verdict == "" {
			t.Fatalf("replay gave no verdict on connection %d", i)
		}
	}
	flows := make([]*audit.Event, len(streams))
	var events []audit.Event
	for _, path := range []string{auditFile, audit.FlowsPath(auditFile)} { // passed flows are kept apart
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) && path != auditFile {
			continue
		}
		must(t, err)
		defer f.Close()
		for e, err := range audit.Events(f) {
			must(t, err)
			events = append(events, e)
			if i := int(e.SourcePort) - 40000; e.Action == audit.ActionFlow && i >= 0 && i < len(flows) {
				if flows[i] != nil {
					t.Fatalf("replay wrote two flow records for connection %d", i)
				}
				flows[i] = &e
			}
		}
	}
	return results, flows, events
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// lines is an audit log in memory: one JSON event per line.
type lines struct {
	mu sync.Mutex
	b  bytes.Buffer
	n  int
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n += bytes.Count(p, []byte{'\n'})
	return l.b.Write(p)
}

func (l *lines) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// events parses the events from line from on.
func (l *lines) events(t *testing.T, from int) []audit.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []audit.Event
	sc := bufio.NewScanner(bytes.NewReader(l.b.Bytes()))
	for i := 0; sc.Scan(); i++ {
		if i < from {
			continue
		}
		var e audit.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		out = append(out, e)
	}
	return out
}

// TestServeAndReplayAgreeOnBans: a source breaks the rules 5 times, is banned, and comes back with
// the TerminalServer probe, more than a peek of garbage, a valid SET and nothing. Through either
// serve (a fresh one each: a ban outlasts the test) and, as a capture, through replay: the same
// connections blocked by the same rule, the ban at the same connection, the same ones refused
// (denied events, reason banned) with the same flow records, first bytes and judgement. serve's
// clients are on loopback, so ban.exempt is emptied for both.
func TestServeAndReplayAgreeOnBans(t *testing.T) {
	cfg := config.Default()
	cfg.Generation, cfg.Ban.Exempt = "1.13", nil
	set, err := protocol.Append(nil, protocol.G0, protocol.Request{Op: protocol.OpSet, Key: []byte("rank0/addr"),
		Value: []byte("10.0.0.2:41000")})
	must(t, err)
	probe := []byte{0x03, 0x00, 0x00, 0x0b, 0x06, 0xe0, 0x00, 0x00, 0x00, 0x00, 0x00}
	var streams []clientStream
	for range 5 {
		streams = append(streams, clientStream{data: probe, what: "TerminalServer"})
	}
	streams = append(streams, clientStream{data: probe, what: "TerminalServer, banned"},
		clientStream{data: bytes.Repeat([]byte{0xff}, 100), cuts: []int{30}, what: "garbage, banned"},
		clientStream{data: set, what: "a SET, banned"}, clientStream{what: "nothing, banned"})

	judged, replayFlows, replayEvents := replayOf(t, cfg, streams, rand.New(rand.NewPCG(1, 2)))
	admissionOf := func(events []audit.Event, index func(uint16) int) map[int]string {
		m := map[int]string{}
		for _, e := range events {
			if i := index(e.SourcePort); (e.Action == audit.ActionBanned || e.Action == audit.ActionDenied) && i >= 0 {
				m[i] += fmt.Sprintf("%s %s;", e.Action, e.Reason)
			}
		}
		return m
	}
	replayed := admissionOf(replayEvents, func(p uint16) int { return int(p) - 40000 })
	want := map[int]string{4: "banned key_too_long;", 5: "denied banned;", 6: "denied banned;", 7: "denied banned;",
		8: "denied banned;"}
	if !reflect.DeepEqual(replayed, want) {
		t.Errorf("replay's banned and denied events by connection %v, want %v", replayed, want)
	}

	for _, m := range []struct {
		mode  string
		loops int
	}{{"loops", 2}, {"goroutines", -1}} {
		t.Run(m.mode, func(t *testing.T) {
			s := startServe(t, cfg, m.mode, m.loops)
			mark := s.audit.count()
			var sent []outcome
			for _, st := range streams {
				sent = append(sent, s.send(t, st, false)) // none reaches the store: invalid, or refused
			}
			if !s.collect(t, mark, sent) {
				t.Fatal("serve wrote no flow records")
			}
			ports := map[uint16]int{}
			for j, o := range sent {
				ports[o.port] = j
			}
			served := admissionOf(s.audit.events(t, mark), func(p uint16) int {
				if j, ok := ports[p]; ok {
					return j
				}
				return -1
			})
			if !reflect.DeepEqual(served, replayed) {
				t.Errorf("banned and denied events by connection: serve %v, replay %v", served, replayed)
			}
			for j, st := range streams {
				where := fmt.Sprintf("%s, connection %d (%s)", m.mode, j, st.what)
				normalize(sent[j].events)
				if sv, rv := verdictOfEvents(sent[j].events), verdictOfReplay(judged[j]); j < 5 && sv != rv {
					t.Errorf("%s: serve %s, replay %s", where, sv, rv)
				}
				if j >= 5 && (len(sent[j].events) > 0 || judged[j].Verdict != replay.VerdictRefused) {
					t.Errorf("%s: serve's events %+v, replay's verdict %s: want refused by both", where, sent[j].events,
						judged[j].Verdict)
				}
				compareFlows(t, where, sent[j].flow, replayFlows[j])
				sf, rf := sent[j].flow, replayFlows[j]
				type judgement struct {
					First                string
					Probe, Op, Field     string
					Declared, FromClient string
				}
				of := func(e *audit.Event) judgement {
					var d string
					if e.Declared != nil {
						d = fmt.Sprint(uint64(*e.Declared))
					}
					return judgement{First: fmt.Sprintf("%x", []byte(e.FirstBytes)), Probe: e.Probe, Op: e.Op, Field: e.Field,
						Declared: d, FromClient: val(e.SourceBytes)}
				}
				if peeked := []string{"11", "64", fmt.Sprint(len(set)), "0"}; j >= 5 &&
					(sf.Verdict != audit.VerdictRefused || val(sf.SourceBytes) != peeked[j-5]) {
					t.Errorf("%s: serve's flow %s with source.bytes %s, want refused, %s", where, sf.Verdict,
						val(sf.SourceBytes), peeked[j-5])
				}
				if j >= 5 && of(sf) != of(rf) {
					t.Errorf("%s: refused flows differ:\nserve  %+v\nreplay %+v", where, of(sf), of(rf))
				}
			}
		})
	}
}
