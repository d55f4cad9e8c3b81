package report

import (
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func at(hhmm string) time.Time {
	t, err := time.Parse(time.DateTime, "2025-03-01 "+hhmm+":00")
	if err != nil {
		panic(err)
	}
	return t
}

// writeSampleLogs writes, in dir, a rotated and partly gzipped audit.log from
// a sampling Writer, and extra.log: gzip without a .gz name, holding one
// good event and two malformed lines (2 and 4). It returns the file names
// relative to dir, oldest first.
//
// What the logs hold (sampling: first 3 per source per 10m, then none):
//
//	12:00  A 192.0.2.1     10 × blocked key_too_long    → 3 written, 7 suppressed
//	12:30  B 192.0.2.2      2 × blocked value_too_long  → 2 written; A's summary (7) at 12:30
//	13:10  C 2001:db8::5    4 × would_block unknown_opcode → 3 written, 1 suppressed
//	13:20  D 198.51.100.9   1 × denied cidr             → C's summary (1) at 13:20
//	13:30  A                1 × banned violations       → never sampled
//	13:40  E 203.0.113.5    1 × blocked message_too_large (extra.log)
func writeSampleLogs(t *testing.T, dir string) []string {
	t.Helper()
	var mu sync.Mutex // the clock of the writer's goroutines
	now := at("12:00")
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	// A line is about 540 B with the ECS bookkeeping: 3 a file, so that no backup falls off
	// MaxBackups (at 700 B, one a file, the oldest did, with A's first event).
	w, err := audit.Open(filepath.Join(dir, "audit.log"), audit.Options{
		MaxBytes: 2000, MaxBackups: 10, Compress: true,
		SampleFirst: 3, SampleWindow: 10 * time.Minute, Clock: clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	write := func(hhmm string, n int, e audit.Event) {
		for i := range n {
			mu.Lock()
			now = at(hhmm).Add(time.Duration(i) * time.Second)
			mu.Unlock()
			e.SourcePort = uint16(40000 + i)
			if err := w.Write(e); err != nil {
				t.Fatal(err)
			}
		}
	}
	a, b, c, d := ip("192.0.2.1"), ip("192.0.2.2"), ip("2001:db8::5"), ip("198.51.100.9")
	write("12:00", 10, audit.Event{Action: audit.ActionBlocked, Reason: "key_too_long", SourceIP: a, Mode: audit.ModeEnforce})
	write("12:30", 2, audit.Event{Action: audit.ActionBlocked, Reason: "value_too_long", SourceIP: b, Mode: audit.ModeEnforce})
	write("13:10", 4, audit.Event{Action: audit.ActionWouldBlock, Reason: "unknown_opcode", SourceIP: c, Mode: audit.ModeMonitor})
	write("13:20", 1, audit.Event{Action: audit.ActionDenied, Reason: "cidr", SourceIP: d})
	write("13:30", 1, audit.Event{Action: audit.ActionBanned, Reason: "violations", SourceIP: a})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.Written != 12 || st.Suppressed != 8 || st.Rotations < 2 {
		t.Fatalf("writer stats %+v", st)
	}

	extra := strings.Join([]string{
		`{"@timestamp":"2025-03-01T13:40:00Z","event.id":"e1","event.action":"blocked","event.reason":"message_too_large","source.ip":"203.0.113.5"}`,
		`{"@timestamp":"2025-03-01T13:41:00Z","event.action":`, // cut short
		``,
		`{"@timestamp":"2025-03-01T13:42:00Z","source.ip":"203.0.113.5"}`, // no action
	}, "\n")
	if err := os.WriteFile(filepath.Join(dir, "extra.log"), gzipped(t, extra), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Chdir(dir) // stable, relative names in malformed-line reports
	files, err := audit.RotatedFiles("audit.log")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 || !strings.HasSuffix(files[0], ".gz") {
		t.Fatalf("want several rotated, gzipped files, got %v", files)
	}
	return append(files, "extra.log")
}

func TestSummarize(t *testing.T) {
	files := writeSampleLogs(t, t.TempDir())
	a, b, c, d, e := ip("192.0.2.1"), ip("192.0.2.2"), ip("2001:db8::5"), ip("198.51.100.9"), ip("203.0.113.5")
	type src struct {
		ip                netip.Addr
		exact, suppressed uint64
	}
	tests := []struct {
		name               string
		filter             Filter
		events, suppressed uint64
		first, last        string
		sources            []src // in ranking order
		byRule             []Count
		byAction           []Count
		perHour            []HourCount
	}{
		{
			name: "everything", events: 11, suppressed: 8, first: "12:00", last: "13:40",
			sources:  []src{{a, 4, 7}, {c, 3, 1}, {b, 2, 0}, {d, 1, 0}, {e, 1, 0}},
			byRule:   []Count{{"key_too_long", 3}, {"unknown_opcode", 3}, {"value_too_long", 2}, {"message_too_large", 1}},
			byAction: []Count{{"blocked", 6}, {"would_block", 3}, {"banned", 1}, {"denied", 1}},
			perHour:  []HourCount{{at("12:00"), 5}, {at("13:00"), 6}},
		},
		{
			name: "since", filter: Filter{Since: at("13:00")}, events: 6, suppressed: 1, first: "13:10", last: "13:40",
			sources: []src{{c, 3, 1}, {a, 1, 0}, {d, 1, 0}, {e, 1, 0}},
		},
		{
			name: "until is exclusive", filter: Filter{Until: at("12:30")}, events: 3, suppressed: 0, first: "12:00", last: "12:00",
			sources: []src{{a, 3, 0}},
		},
		{
			name: "source cidr", filter: Filter{Source: netip.MustParsePrefix("192.0.2.0/24")}, events: 6, suppressed: 7, first: "12:00", last: "13:30",
			sources: []src{{a, 4, 7}, {b, 2, 0}},
		},
		{
			name: "ipv6 cidr", filter: Filter{Source: netip.MustParsePrefix("2001:db8::/32")}, events: 3, suppressed: 1, first: "13:10", last: "13:10",
			sources: []src{{c, 3, 1}},
		},
		{
			name: "rule keeps its kinds of summaries", filter: Filter{Rule: "key_too_long"}, events: 3, suppressed: 7, first: "12:00", last: "12:00",
			sources: []src{{a, 3, 7}},
			byRule:  []Count{{"key_too_long", 3}},
		},
		{
			name: "nothing matches", filter: Filter{Rule: "zero_count"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Summarize(files, tt.filter)
			if err != nil {
				t.Fatal(err)
			}
			if s.Files != len(files) || s.Events != tt.events || s.Suppressed != tt.suppressed || s.Estimated != tt.events+tt.suppressed {
				t.Errorf("files %d events %d suppressed %d estimated %d, want %d %d %d %d",
					s.Files, s.Events, s.Suppressed, s.Estimated, len(files), tt.events, tt.suppressed, tt.events+tt.suppressed)
			}
			// A seen time is the minute given plus at most the seconds of a burst.
			if tt.first != "" && (s.FirstSeen.Truncate(time.Minute) != at(tt.first) || s.LastSeen.Truncate(time.Minute) != at(tt.last)) {
				t.Errorf("seen %v … %v, want %s … %s", s.FirstSeen, s.LastSeen, tt.first, tt.last)
			}
			var got []src
			for _, st := range s.Sources {
				got = append(got, src{st.IP, st.Exact, st.Suppressed})
				if st.Estimated != st.Exact+st.Suppressed {
					t.Errorf("%v: estimated %d", st.IP, st.Estimated)
				}
			}
			if !slices.Equal(got, tt.sources) {
				t.Errorf("sources %v\nwant    %v", got, tt.sources)
			}
			var byRule []Count
			for _, r := range s.ByRule {
				byRule = append(byRule, Count{r.Key, r.Events})
			}
			if tt.byRule != nil && !slices.Equal(byRule, tt.byRule) {
				t.Errorf("by rule %v, want %v", byRule, tt.byRule)
			}
			if tt.byAction != nil && !slices.Equal(s.ByAction, tt.byAction) {
				t.Errorf("by action %v, want %v", s.ByAction, tt.byAction)
			}
			if tt.perHour != nil && !slices.Equal(s.PerHour, tt.perHour) {
				t.Errorf("per hour %v, want %v", s.PerHour, tt.perHour)
			}
			if s.Malformed != 2 || len(s.MalformedAt) != 2 || s.MalformedAt[0].Line != 2 || s.MalformedAt[1].Line != 4 ||
				s.MalformedAt[0].File != "extra.log" {
				t.Errorf("malformed %d at %v, want extra.log lines 2 and 4", s.Malformed, s.MalformedAt)
			}
		})
	}

	if _, err := Summarize([]string{"no-such-file"}, Filter{}); err == nil {
		t.Error("Summarize of a missing file succeeded")
	}
}

func TestSummaryTop(t *testing.T) {
	s := Summary{Sources: make([]SourceStats, 5), TotalSources: 5}
	for n, want := range map[int]int{0: 5, -1: 5, 2: 2, 5: 5, 9: 5} {
		if got := len(s.Top(n).Sources); got != want {
			t.Errorf("Top(%d) kept %d, want %d", n, got, want)
		}
	}
	if err := s.Write(&bytes.Buffer{}, "xml"); err == nil {
		t.Error("Write accepted format xml")
	}
}

// summaryOutput is what `storeguard audit FILE... --top 3 --format format`
// prints: the summary of paths and their rotated backups.
func summaryOutput(t *testing.T, format string, paths ...string) []byte {
	t.Helper()
	files, err := ExpandFiles(paths, true, true)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Summarize(files, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if format == "html" {
		err = s.Top(3).WriteHTML(&out)
	} else {
		err = s.Top(3).Write(&out, format)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestSummaryGolden summarizes the sample logs and the flow scenario (writeFlowLog), one golden
// file per format. Rewrite them with: go test ./audit/ -run Golden -update
func TestSummaryGolden(t *testing.T) {
	testdata, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	writeSampleLogs(t, t.TempDir())
	writeFlowLog(t, "flows.log")
	for _, format := range []string{"table", "json", "csv", "html"} {
		t.Run(format, func(t *testing.T) {
			got := summaryOutput(t, format, "audit.log", "extra.log", "flows.log")
			path := filepath.Join(testdata, "summary."+format+".golden")
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

// lineDiff lists the lines that differ, enough to see what changed.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n- %s\n+ %s\n", i+1, wl, gl)
		}
	}
	return b.String()
}

func TestFilters(t *testing.T) {
	files := writeSampleLogs(t, t.TempDir())
	date := func(s string) time.Time {
		d, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	tests := []struct {
		name               string
		paths              []string
		filter             Filter
		files              int
		events, suppressed uint64
	}{
		{name: "all", files: len(files), events: 11, suppressed: 8},
		{name: "duplicates read once", paths: []string{files[0], files[1]}, files: len(files), events: 11, suppressed: 8},
		{name: "one address", filter: Filter{Source: netip.MustParsePrefix("192.0.2.1/32")}, files: len(files), events: 4, suppressed: 7},
		{name: "cidr and rule", filter: Filter{Source: netip.MustParsePrefix("192.0.2.0/24"), Rule: "value_too_long"}, files: len(files), events: 2},
		{name: "since", filter: Filter{Since: date("2025-03-01T13:00:00Z")}, files: len(files), events: 6, suppressed: 1},
		{name: "until", filter: Filter{Until: date("2025-03-02T00:00:00Z")}, files: len(files), events: 11, suppressed: 8},
		{name: "since an hour ago", filter: Filter{Since: time.Now().Add(-time.Hour)}, files: len(files)}, // the log is from 2025
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			paths, err := ExpandFiles(append([]string{"audit.log", "extra.log"}, tt.paths...), true, true)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Summarize(paths, tt.filter)
			if err != nil {
				t.Fatal(err)
			}
			if s.Files != tt.files || s.Events != tt.events || s.Suppressed != tt.suppressed {
				t.Errorf("files %d events %d suppressed %d, want %d %d %d", s.Files, s.Events, s.Suppressed, tt.files, tt.events, tt.suppressed)
			}
		})
	}

	paths, err := ExpandFiles([]string{"audit.log", "extra.log", "audit.log"}, false, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(paths, []string{"audit.log", "extra.log"}) {
		t.Fatalf("without rotated backups: %v, want audit.log and extra.log once each", paths)
	}
	got, err := Summarize(paths, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Files != 2 || got.Events >= 11 {
		t.Errorf("without rotated backups: %d files, %d events; want 2 files, fewer than 11 events", got.Files, got.Events)
	}

	if paths, err := ExpandFiles([]string{"missing.log"}, true, true); err != nil || !slices.Equal(paths, []string{"missing.log"}) {
		t.Errorf("a missing file expands to %v, %v; want itself, for Summarize to report", paths, err)
	}
}

// TestSummaryCountsHandoversApart: storeguard's own upgrades are counted, and are not a source,
// an action or a rule of the traffic summarised.
func TestSummaryCountsHandoversApart(t *testing.T) {
	z := NewSummarizer(Filter{})
	n := uint64(3)
	z.Add(audit.Event{Timestamp: time.Now(), Action: audit.ActionHandover, Reason: "upgrade", Connections: &n})
	z.Add(audit.Event{Timestamp: time.Now(), Action: audit.ActionBlocked, Reason: "key_too_long", SourceIP: netip.MustParseAddr("192.0.2.7")})
	s := z.Summary()
	if s.Handovers != 1 || s.Events != 1 || s.TotalSources != 1 || len(s.ByAction) != 1 || s.ByAction[0].Key != "blocked" {
		t.Fatalf("summary %+v: want 1 hand-over apart from 1 blocked event of 1 source", s)
	}
}

// gzipped is text compressed by gzip.
func gzipped(t *testing.T, text string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := io.WriteString(zw, text); err != nil || zw.Close() != nil {
		t.Fatal("gzip", err)
	}
	return b.Bytes()
}

// TestSuppressedKindWithProbe: a sampled_summary's kind that names a probe counts towards its rule
// and verdict, not a rule or verdict of its own.
func TestSuppressedKindWithProbe(t *testing.T) {
	z := NewSummarizer(Filter{})
	z.Add(audit.Event{Timestamp: at("12:00"), Action: audit.ActionBlocked, Reason: "key_too_long", SourceIP: ip("192.0.2.7"), Probe: "rdp_x224"})
	z.Add(audit.Event{Timestamp: at("12:01"), Action: audit.ActionSampledSummary, SourceIP: ip("192.0.2.7"), Suppressed: 5,
		SuppressedBy: map[string]uint64{"blocked/key_too_long/rdp_x224": 3, "flow/blocked/rdp_x224": 2}})
	s := z.Summary()
	if len(s.ByRule) != 1 || s.ByRule[0].Key != "key_too_long" || s.ByRule[0].Estimated != 4 {
		t.Errorf("rules %+v: want key_too_long, 1 written and 3 sampled away", s.ByRule)
	}
	if len(s.ByVerdict) != 1 || s.ByVerdict[0].Key != "blocked" || s.ByVerdict[0].Suppressed != 2 {
		t.Errorf("verdicts %+v: want blocked, 2 sampled away", s.ByVerdict)
	}
}
