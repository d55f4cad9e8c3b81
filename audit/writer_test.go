package audit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *fakeClock { return &fakeClock{now: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// readAll decodes every event in the files, failing on any malformed line.
func readAll(t *testing.T, paths ...string) []Event {
	t.Helper()
	var out []Event
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		for e, err := range Events(f) {
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			out = append(out, e)
		}
		f.Close()
	}
	return out
}

func decodeAll(t *testing.T, b []byte) []Event {
	t.Helper()
	var out []Event
	for e, err := range Events(bytes.NewReader(b)) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

func TestWriteFillsFields(t *testing.T) {
	var buf bytes.Buffer
	clock := newClock()
	w := New(&buf, Options{Clock: clock.Now})
	long := bytes.Repeat([]byte{0xff}, 100)
	if err := w.Write(Event{Action: ActionBlocked, SourceIP: ip("::ffff:10.0.0.9"), FirstBytes: long}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := decodeAll(t, buf.Bytes())
	if len(got) != 1 {
		t.Fatalf("got %d events, want 1", len(got))
	}
	e := got[0]
	if !e.Timestamp.Equal(t0) || len(e.ID) != 32 || e.SourceIP != ip("10.0.0.9") || len(e.FirstBytes) != MaxFirstBytes {
		t.Errorf("got timestamp %v, id %q, source %v, %d first bytes", e.Timestamp, e.ID, e.SourceIP, len(e.FirstBytes))
	}
	if err := w.Write(Event{Action: ActionBlocked}); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close = %v, want ErrClosed", err)
	}
}

func TestRotation(t *testing.T) {
	const lines = 200
	tests := []struct {
		name     string
		maxBytes int64
		backups  int
		compress bool
		files    int // exact number of files, or 0 for "more than one, all lines kept"
	}{
		{name: "no rotation", maxBytes: 0, backups: 3, files: 1},
		{name: "keeps every line", maxBytes: 2000, backups: 1000},
		{name: "keeps every line gzipped", maxBytes: 2000, backups: 1000, compress: true},
		{name: "drops oldest", maxBytes: 2000, backups: 3, files: 4},
		{name: "drops oldest gzipped", maxBytes: 2000, backups: 2, compress: true, files: 3},
		{name: "no backups", maxBytes: 2000, backups: 0, files: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.log")
			w, err := Open(path, Options{MaxBytes: tt.maxBytes, MaxBackups: tt.backups, Compress: tt.compress})
			if err != nil {
				t.Fatal(err)
			}
			for i := range lines {
				if err := w.Write(Event{Action: ActionBlocked, Reason: "key_too_long", ConnID: uint64(i + 1)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}

			files, err := RotatedFiles(path)
			if err != nil {
				t.Fatal(err)
			}
			if tt.files > 0 && len(files) != tt.files {
				t.Fatalf("files %v, want %d", files, tt.files)
			}
			if tt.files == 0 && len(files) < 2 {
				t.Fatalf("files %v, want a rotation", files)
			}
			if st := w.Stats(); tt.maxBytes > 0 && st.Rotations < uint64(len(files)-1) || st.Errors != 0 || st.Written != lines {
				t.Errorf("stats %+v with %d files", st, len(files))
			}
			for _, f := range files {
				raw, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				isGzip := bytes.HasPrefix(raw, gzipMagic)
				if isGzip != (tt.compress && f != path) || filepath.Ext(f) == ".gz" != isGzip {
					t.Errorf("%s: gzip %v", f, isGzip)
				}
				if !isGzip && tt.maxBytes > 0 && int64(len(raw)) > tt.maxBytes {
					t.Errorf("%s: %d bytes, over max %d", f, len(raw), tt.maxBytes)
				}
			}
			if leftovers, _ := filepath.Glob(path + "*.tmp"); len(leftovers) > 0 {
				t.Errorf("temporary files left: %v", leftovers)
			}

			// Oldest first, the kept lines are the newest ones, in order, none missing.
			got := readAll(t, files...)
			if tt.files == 0 && len(got) != lines {
				t.Fatalf("read %d lines, want all %d", len(got), lines)
			}
			if len(got) == 0 {
				t.Fatal("no lines kept")
			}
			first := lines - len(got) + 1
			for i, e := range got {
				if e.ConnID != uint64(first+i) {
					t.Fatalf("line %d has conn %d, want %d", i, e.ConnID, first+i)
				}
			}
		})
	}
}

func TestRotationAppendsToExistingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	for i := range 2 {
		w, err := Open(path, Options{MaxBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(Event{Action: ActionDenied, ConnID: uint64(i + 1)}); err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
	if got := readAll(t, path); len(got) != 2 || got[0].ConnID != 1 || got[1].ConnID != 2 {
		t.Errorf("got %+v, want conns 1 then 2", got)
	}
}

func TestRotationFailureKeepsLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	// A non-empty directory where path.1 should go makes the rename fail.
	if err := os.MkdirAll(filepath.Join(path+".1", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := Open(path, Options{MaxBytes: 10, MaxBackups: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Event{Action: ActionBlocked, ConnID: 1}); err != nil {
		t.Fatal(err) // the first line goes into an empty file: no rotation yet
	}
	if err := w.Write(Event{Action: ActionBlocked, ConnID: 2}); err == nil {
		t.Error("Write succeeded although rotation failed")
	}
	w.Close()
	if st := w.Stats(); st.Errors != 1 || st.Written != 2 {
		t.Errorf("stats %+v, want 1 error and 2 written", st)
	}
	if got := readAll(t, path); len(got) != 2 {
		t.Errorf("file holds %d lines, want both", len(got))
	}
}

type failingWriter struct{ after int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.after <= 0 {
		return 0, errors.New("disk full")
	}
	f.after--
	return len(p), nil
}

func TestWriteErrorCounted(t *testing.T) {
	w := New(&failingWriter{after: 1}, Options{})
	if err := w.Write(Event{Action: ActionBlocked}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := w.Write(Event{Action: ActionBlocked}); err == nil {
			t.Fatal("Write returned nil on a failing writer")
		}
	}
	if st := w.Stats(); st.Written != 1 || st.Errors != 3 {
		t.Errorf("stats %+v, want 1 written, 3 errors", st)
	}
	if _, err := Open(t.TempDir(), Options{}); err == nil {
		t.Error("Open on a directory succeeded")
	}
}

func TestSampling(t *testing.T) {
	tests := []struct {
		name        string
		opts        Options
		action      Action
		n           int
		wantWritten []uint64 // conn ids written, in order
	}{
		{"first only", Options{SampleFirst: 3, SampleWindow: time.Minute}, ActionBlocked, 10, []uint64{1, 2, 3}},
		{"first then one in four", Options{SampleFirst: 3, SampleEvery: 4, SampleWindow: time.Minute}, ActionWouldBlock, 20,
			[]uint64{1, 2, 3, 7, 11, 15, 19}},
		// The first event of each kind (action and reason) of a source in a window is always written.
		{"none first, one in five", Options{SampleEvery: 5, SampleWindow: time.Minute}, ActionBlocked, 12, []uint64{1, 5, 10}},
		// Refusals: the first RefusalsFirst, then none (counted in the summary), whatever SampleEvery says.
		{"refusals: the first few", Options{SampleFirst: 100, SampleEvery: 5, RefusalsFirst: 3, SampleWindow: time.Minute},
			ActionDenied, 20, []uint64{1, 2, 3}},
		{"refusals: the default few", Options{SampleFirst: 100, SampleEvery: 1, SampleWindow: time.Minute}, ActionDenied, 30,
			[]uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{"refusals within sample-first", Options{SampleFirst: 2, RefusalsFirst: 5, SampleWindow: time.Minute}, ActionDenied, 9,
			[]uint64{1, 2}},
		{"every one", Options{SampleFirst: 2, SampleEvery: 1, SampleWindow: time.Minute}, ActionBlocked, 5, []uint64{1, 2, 3, 4, 5}},
		{"sampling off", Options{SampleFirst: 1}, ActionBlocked, 4, []uint64{1, 2, 3, 4}},
		{"bans never sampled", Options{SampleFirst: 1, SampleWindow: time.Minute}, ActionBanned, 3, []uint64{1, 2, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tt.opts.Clock = newClock().Now
			w := New(&buf, tt.opts)
			for i := range tt.n {
				if err := w.Write(Event{Action: tt.action, SourceIP: ip("192.0.2.7"), ConnID: uint64(i + 1)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			suppressed := uint64(tt.n - len(tt.wantWritten))
			var conns []uint64
			var summaries []Event
			for _, e := range decodeAll(t, buf.Bytes()) {
				if e.Action == ActionSampledSummary {
					summaries = append(summaries, e)
				} else {
					conns = append(conns, e.ConnID)
				}
			}
			if !slices.Equal(conns, tt.wantWritten) {
				t.Errorf("written conns %v, want %v", conns, tt.wantWritten)
			}
			wantSummaries := 0
			if suppressed > 0 {
				wantSummaries = 1
			}
			if len(summaries) != wantSummaries {
				t.Fatalf("%d summaries, want %d", len(summaries), wantSummaries)
			}
			if wantSummaries == 1 && (summaries[0].Suppressed != suppressed || summaries[0].SourceIP != ip("192.0.2.7")) {
				t.Errorf("summary %+v, want %d suppressed for 192.0.2.7", summaries[0], suppressed)
			}
			st := w.Stats()
			if st.Suppressed != suppressed || st.Written != uint64(len(tt.wantWritten)+wantSummaries) {
				t.Errorf("stats %+v, want %d suppressed, %d written", st, suppressed, len(tt.wantWritten)+wantSummaries)
			}
		})
	}
}

func TestSamplingWindowEnd(t *testing.T) {
	var buf bytes.Buffer
	clock := newClock()
	w := New(&buf, Options{SampleFirst: 2, SampleWindow: time.Minute, Clock: clock.Now})
	a, b, c := ip("198.51.100.1"), ip("198.51.100.2"), ip("2001:db8::3")
	write := func(src netip.Addr, n int) {
		for range n {
			if err := w.Write(Event{Action: ActionBlocked, SourceIP: src}); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(a, 5) // 2 written, 3 suppressed
	write(b, 4) // 2 written, 2 suppressed
	clock.Advance(59 * time.Second)
	write(a, 1) // still in the window: suppressed
	clock.Advance(time.Second)
	write(a, 1) // both windows over: two summaries, then a fresh window
	write(c, 3) // 2 written, 1 suppressed
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if err := w.Flush(); err != nil { // c's window ended quietly
		t.Fatal(err)
	}
	write(a, 3) // fresh window again: 2 written, 1 suppressed, summarized by Close
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	type line struct {
		action     Action
		src        netip.Addr
		suppressed uint64
	}
	var got []line
	for _, e := range decodeAll(t, buf.Bytes()) {
		got = append(got, line{e.Action, e.SourceIP, e.Suppressed})
	}
	blocked := func(src netip.Addr) line { return line{ActionBlocked, src, 0} }
	summary := func(src netip.Addr, n uint64) line { return line{ActionSampledSummary, src, n} }
	want := []line{
		blocked(a), blocked(a), blocked(b), blocked(b),
		summary(a, 4), summary(b, 2), blocked(a),
		blocked(c), blocked(c),
		summary(c, 1), // a's second window suppressed nothing: no summary for it
		blocked(a), blocked(a), summary(a, 1),
	}
	if !slices.Equal(got, want) {
		t.Errorf("lines\n got %v\nwant %v", got, want)
	}
	if st := w.Stats(); st.Suppressed != 4+2+1+1 {
		t.Errorf("suppressed %d, want 8", st.Suppressed)
	}
}

type lineCounter struct{ lines int }

func (c *lineCounter) Write(p []byte) (int, error) {
	c.lines += bytes.Count(p, []byte("\n"))
	return len(p), nil
}

func sourceN(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

func TestSamplingTableBounded(t *testing.T) {
	const sources = 100_000
	var out lineCounter
	w := New(&out, Options{SampleFirst: 1, SampleWindow: time.Hour, Clock: newClock().Now})
	for i := range sources {
		if err := w.Write(Event{Action: ActionBlocked, SourceIP: sourceN(i)}); err != nil {
			t.Fatal(err)
		}
	}
	w.mu.Lock()
	tracked, listed := len(w.sources), w.byStart.Len()
	w.mu.Unlock()
	if tracked != DefaultMaxSources || listed != DefaultMaxSources {
		t.Errorf("tracking %d sources (%d listed), want the cap %d", tracked, listed, DefaultMaxSources)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := Stats{Written: sources, Evicted: sources - DefaultMaxSources}
	if st := w.Stats(); st != want || out.lines != sources {
		t.Errorf("stats %+v, %d lines, want %+v", st, out.lines, want)
	}
}

// An evicted window still gets its summary: suppressed counts stay exact.
func TestSamplingEvictionSummarizes(t *testing.T) {
	const sources, maxSources = 5000, 1000
	var buf bytes.Buffer
	w := New(&buf, Options{SampleFirst: 1, SampleWindow: time.Hour, MaxSources: maxSources, Clock: newClock().Now})
	for i := range sources {
		for range 3 { // 1 written, 2 suppressed
			if err := w.Write(Event{Action: ActionBlocked, SourceIP: sourceN(i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := Stats{Written: 2 * sources, Suppressed: 2 * sources, Evicted: sources - maxSources}
	if st := w.Stats(); st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	perSource := make(map[netip.Addr]uint64)
	for _, e := range decodeAll(t, buf.Bytes()) {
		perSource[e.SourceIP] += e.Suppressed
	}
	for i := range sources {
		if n := perSource[sourceN(i)]; n != 2 {
			t.Fatalf("source %v: summaries say %d suppressed, want 2", sourceN(i), n)
		}
	}
}

func TestWriterConcurrent(t *testing.T) {
	const goroutines, perG = 16, 500
	path := filepath.Join(t.TempDir(), "audit.log")
	clock := newClock()
	w, err := Open(path, Options{
		MaxBytes: 64 << 10, MaxBackups: 1000,
		SampleFirst: 5, SampleEvery: 10, SampleWindow: time.Second, Clock: clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perG {
				src := netip.AddrFrom4([4]byte{203, 0, 113, byte(i % 10)})
				if err := w.Write(Event{Action: ActionBlocked, SourceIP: src, ConnID: uint64(g*perG + i + 1)}); err != nil {
					t.Error(err)
					return
				}
				if i%100 == 0 {
					clock.Advance(300 * time.Millisecond)
					w.Flush()
					w.Stats()
				}
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	files, err := RotatedFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	events := readAll(t, files...)
	st := w.Stats()
	var exact, summarized uint64
	ids := make(map[string]bool)
	for _, e := range events {
		if ids[e.ID] {
			t.Fatalf("duplicate event id %s", e.ID)
		}
		ids[e.ID] = true
		if e.Action == ActionSampledSummary {
			summarized += e.Suppressed
		} else {
			exact++
		}
	}
	if len(files) < 2 || st.Errors != 0 || uint64(len(events)) != st.Written {
		t.Errorf("%d files, %d lines, stats %+v", len(files), len(events), st)
	}
	if summarized != st.Suppressed || exact+st.Suppressed != goroutines*perG {
		t.Errorf("exact %d + suppressed %d (summarized %d), want %d in all", exact, st.Suppressed, summarized, goroutines*perG)
	}
}

func ExampleWriter() {
	var buf bytes.Buffer
	w := New(&buf, Options{Clock: func() time.Time { return t0 }})
	w.Write(Event{ID: "1", Action: ActionBlocked, Reason: "value_too_long", Declared: new(BigUint(0))})
	w.Close()
	io.Copy(os.Stdout, &buf)
	fmt.Println(w.Stats().Written)
	// Output:
	// {"@timestamp":"2025-03-01T12:00:00Z","ecs.version":"9.4.0","event.id":"1","event.action":"blocked","event.reason":"value_too_long","event.kind":"alert","event.category":["network","intrusion_detection"],"event.type":["connection","denied"],"event.outcome":"success","event.severity":5,"event.module":"storeguard","event.dataset":"storeguard.audit","rule.name":"value_too_long","rule.category":"protocol","rule.ruleset":"storeguard","storeguard.declared":"0"}
	// 1
}

// TestSamplingKeepsFirstOfEachKind: a flood of one rule does not hide the first event of another,
// flows that passed are never sampled, and what is sampled away is summarised by kind within a
// minute, not only at the window's end.
func TestSamplingKeepsFirstOfEachKind(t *testing.T) {
	var buf bytes.Buffer
	clk := newClock()
	w := New(&buf, Options{SampleFirst: 2, SampleWindow: 10 * time.Minute, Clock: clk.Now})
	src := ip("192.0.2.9")
	for range 30 {
		w.Write(Event{Action: ActionBlocked, Reason: "unknown_opcode", SourceIP: src})
	}
	w.Write(Event{Action: ActionBlocked, Reason: "key_too_long", SourceIP: src, ConnID: 99})
	for range 5 {
		w.Write(Event{Action: ActionFlow, Verdict: VerdictPassed, SourceIP: src})
		w.Write(Event{Action: ActionFlow, Verdict: VerdictEmpty, SourceIP: src})
	}
	clk.Advance(time.Minute)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	var keyTooLong, passed int
	var summary *Event
	for _, e := range decodeAll(t, buf.Bytes()) {
		switch {
		case e.Reason == "key_too_long":
			keyTooLong++
		case e.Action == ActionFlow && e.Verdict == VerdictPassed:
			passed++
		case e.Action == ActionSampledSummary:
			summary = &e
		}
	}
	if keyTooLong != 1 || passed != 5 {
		t.Errorf("key_too_long written %d times, passed flows %d; want 1 and 5", keyTooLong, passed)
	}
	// Written: 2 unknown_opcode (the first and the second of the window), key_too_long (first of
	// its kind), 5 passed flows, the first empty flow. Suppressed: 28 unknown_opcode, 4 empty flows.
	if summary == nil || summary.Suppressed != 32 || summary.SuppressedBy["blocked/unknown_opcode"] != 28 ||
		summary.SuppressedBy["flow/empty"] != 4 || !summary.Start.Equal(t0) {
		t.Fatalf("interim summary %+v", summary)
	}
	w.Write(Event{Action: ActionBlocked, Reason: "unknown_opcode", SourceIP: src})
	w.Close()
	var total uint64
	for _, e := range decodeAll(t, buf.Bytes()) {
		total += e.Suppressed
	}
	if total != 33 {
		t.Errorf("summaries say %d suppressed, want 33", total)
	}
}

// TestSecurityEventsOutlivePassedFlows: a probe's blocked event, then a million connections that
// passed, from as many other sources (an IPv6 /64 has 2^64), through the real writer at small
// rotation sizes: the passed flows rotate their own file set hundreds of times and the blocked
// event is still in the audit log. Without SeparateFlows the same writer loses it within a few
// thousand (the control), as serve did before: 500 connections at 256 KiB and 1 backup. About 7 s;
// under the race detector 100,000 connections (52 s for a million).
func TestSecurityEventsOutlivePassedFlows(t *testing.T) {
	const rotateAt, keep = 64 << 10, 1
	flood := func(t *testing.T, separate bool, n int) (Stats, []Event) {
		path := filepath.Join(t.TempDir(), "audit.log")
		w, err := Open(path, Options{MaxBytes: rotateAt, MaxBackups: keep, SeparateFlows: separate,
			FlowsMaxBytes: rotateAt, FlowsMaxBackups: keep,
			SampleFirst: 100, SampleEvery: 1000, SampleWindow: 10 * time.Minute, Clock: func() time.Time { return t0 }})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(Event{ID: "probe", Action: ActionBlocked, Reason: "key_too_long", SourceIP: ip("192.0.2.66"),
			Probe: "rdp_x224", Mode: ModeEnforce}); err != nil {
			t.Fatal(err)
		}
		src := netip.MustParseAddr("2001:db8::").As16()
		for i := range n {
			src[12], src[13], src[14], src[15] = byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
			if err := w.Write(Event{Action: ActionFlow, Verdict: VerdictPassed, SourceIP: netip.AddrFrom16(src)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		files, err := RotatedFiles(path)
		if err != nil {
			t.Fatal(err)
		}
		return w.Stats(), readAll(t, files...)
	}
	probeKept := func(events []Event) bool {
		return slices.ContainsFunc(events, func(e Event) bool { return e.ID == "probe" && e.Action == ActionBlocked })
	}

	connections := 1_000_000
	if raceDetector {
		connections = 100_000
	}
	st, events := flood(t, true, connections)
	if !probeKept(events) {
		t.Fatalf("the blocked event is gone from the audit log after %d passed flows (stats %+v)", connections, st)
	}
	if st.Written != uint64(connections)+1 || st.Errors != 0 || st.Suppressed != 0 || st.Rotations != 0 || st.FlowsRotations < 100 {
		t.Errorf("stats %+v: want every line written, none sampled away, the flows' set rotated, the audit log's not", st)
	}

	st, events = flood(t, false, 2000)
	if probeKept(events) || st.Rotations == 0 {
		t.Errorf("control: the blocked event is still there after 2000 passed flows in the same file set (stats %+v)", st)
	}
}
