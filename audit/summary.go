package audit

import (
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"
)

// MaxMalformedListed caps the malformed lines a Summary lists; the count
// stays exact.
const MaxMalformedListed = 100

// Filter selects events. Zero fields select everything.
type Filter struct {
	Since  time.Time    // inclusive
	Until  time.Time    // exclusive
	Source netip.Prefix // source.ip within
	Rule   string       // event.reason; sampled_summary events carry no rule, so a Rule filter drops them
}

func (f Filter) match(e Event) bool {
	switch {
	case !f.Since.IsZero() && e.Timestamp.Before(f.Since):
		return false
	case !f.Until.IsZero() && !e.Timestamp.Before(f.Until):
		return false
	case f.Source.IsValid() && !f.Source.Contains(e.SourceIP):
		return false
	case f.Rule != "" && e.Reason != f.Rule:
		return false
	}
	return true
}

// Summary describes the events a Filter selected. Events counts the lines
// written; Suppressed adds what sampled_summary events say was sampled away;
// Estimated is their sum. Dropped is what dropped_summary events say a stalled
// sink lost (of every source: not in Estimated). Seen times come from written
// events only.
type Summary struct {
	Files        int           `json:"files"`
	Events       uint64        `json:"events"`
	Suppressed   uint64        `json:"suppressed"`
	Estimated    uint64        `json:"estimated"`
	Dropped      uint64        `json:"dropped"`
	Handovers    uint64        `json:"handovers"` // handover events: storeguard's own upgrades and restarts, not traffic
	FirstSeen    time.Time     `json:"first_seen,omitzero"`
	LastSeen     time.Time     `json:"last_seen,omitzero"`
	ByAction     []Count       `json:"by_action"`
	ByRule       []Count       `json:"by_rule"`
	PerHour      []HourCount   `json:"per_hour"`
	TotalSources int           `json:"total_sources"`
	Sources      []SourceStats `json:"sources"` // most estimated events first; see Top
	Malformed    int           `json:"malformed"`
	MalformedAt  []LineError   `json:"malformed_at,omitempty"` // the first MaxMalformedListed
}

// Count is the number of written events with one key.
type Count struct {
	Key    string `json:"key"`
	Events uint64 `json:"events"`
}

// HourCount is the number of written events in the hour (UTC) from Hour.
type HourCount struct {
	Hour   time.Time `json:"hour"`
	Events uint64    `json:"events"`
}

// SourceStats are one source's counts: Exact written, Suppressed by sampling.
type SourceStats struct {
	IP         netip.Addr `json:"ip"`
	Exact      uint64     `json:"exact"`
	Suppressed uint64     `json:"suppressed"`
	Estimated  uint64     `json:"estimated"`
	FirstSeen  time.Time  `json:"first_seen,omitzero"`
	LastSeen   time.Time  `json:"last_seen,omitzero"`
}

// Summarizer accumulates a Summary from events and logs.
type Summarizer struct {
	filter   Filter
	sum      Summary
	byAction map[string]uint64
	byRule   map[string]uint64
	perHour  map[time.Time]uint64
	sources  map[netip.Addr]*SourceStats
}

func NewSummarizer(f Filter) *Summarizer {
	return &Summarizer{
		filter:   f,
		byAction: make(map[string]uint64),
		byRule:   make(map[string]uint64),
		perHour:  make(map[time.Time]uint64),
		sources:  make(map[netip.Addr]*SourceStats),
	}
}

// Summarize reads the audit logs at paths, in order. Malformed lines and
// unreadable tails are counted in the Summary; only a file that cannot be
// opened is an error.
func Summarize(paths []string, f Filter) (Summary, error) {
	z := NewSummarizer(f)
	for _, p := range paths {
		if err := z.ReadFile(p); err != nil {
			return Summary{}, err
		}
	}
	return z.Summary(), nil
}

// ReadFile adds the events of the log at path.
func (z *Summarizer) ReadFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	z.Read(path, f)
	return nil
}

// Read adds the events of one log; name labels its malformed lines.
func (z *Summarizer) Read(name string, r io.Reader) {
	z.sum.Files++
	for e, err := range Events(r) {
		var lerr *LineError
		if errors.As(err, &lerr) {
			z.sum.Malformed++
			if len(z.sum.MalformedAt) < MaxMalformedListed {
				lerr.File = name
				z.sum.MalformedAt = append(z.sum.MalformedAt, *lerr)
			}
			continue
		}
		z.Add(e)
	}
}

// Add counts one event if the filter selects it.
func (z *Summarizer) Add(e Event) {
	if !z.filter.match(e) {
		return
	}
	if e.Action == ActionDroppedSummary {
		z.sum.Dropped += e.Suppressed
		return
	}
	if e.Action == ActionHandover {
		z.sum.Handovers++
		return
	}
	src := z.sources[e.SourceIP]
	if src == nil {
		src = &SourceStats{IP: e.SourceIP}
		z.sources[e.SourceIP] = src
	}
	if e.Action == ActionSampledSummary {
		z.sum.Suppressed += e.Suppressed
		src.Suppressed += e.Suppressed
		return
	}
	z.sum.Events++
	src.Exact++
	z.byAction[string(e.Action)]++
	z.byRule[cmp.Or(e.Reason, "-")]++
	z.perHour[e.Timestamp.UTC().Truncate(time.Hour)]++
	widen(&z.sum.FirstSeen, &z.sum.LastSeen, e.Timestamp)
	widen(&src.FirstSeen, &src.LastSeen, e.Timestamp)
}

func widen(first, last *time.Time, t time.Time) {
	if first.IsZero() || t.Before(*first) {
		*first = t
	}
	if last.IsZero() || t.After(*last) {
		*last = t
	}
}

// Summary returns the totals so far, sorted.
func (z *Summarizer) Summary() Summary {
	s := z.sum
	s.MalformedAt = slices.Clone(s.MalformedAt)
	s.Estimated = s.Events + s.Suppressed
	s.FirstSeen, s.LastSeen = s.FirstSeen.UTC(), s.LastSeen.UTC()
	s.ByAction = sortedCounts(z.byAction)
	s.ByRule = sortedCounts(z.byRule)
	s.PerHour = make([]HourCount, 0, len(z.perHour))
	for h, n := range z.perHour {
		s.PerHour = append(s.PerHour, HourCount{h, n})
	}
	slices.SortFunc(s.PerHour, func(a, b HourCount) int { return a.Hour.Compare(b.Hour) })
	s.Sources = make([]SourceStats, 0, len(z.sources))
	for _, src := range z.sources {
		st := *src
		st.Estimated = st.Exact + st.Suppressed
		st.FirstSeen, st.LastSeen = st.FirstSeen.UTC(), st.LastSeen.UTC()
		s.Sources = append(s.Sources, st)
	}
	slices.SortFunc(s.Sources, func(a, b SourceStats) int {
		return cmp.Or(cmp.Compare(b.Estimated, a.Estimated), cmp.Compare(b.Exact, a.Exact), a.IP.Compare(b.IP))
	})
	s.TotalSources = len(s.Sources)
	return s
}

func sortedCounts(m map[string]uint64) []Count {
	out := make([]Count, 0, len(m))
	for k, n := range m {
		out = append(out, Count{k, n})
	}
	slices.SortFunc(out, func(a, b Count) int {
		return cmp.Or(cmp.Compare(b.Events, a.Events), cmp.Compare(a.Key, b.Key))
	})
	return out
}

// Top keeps the n sources with the most estimated events; n <= 0 keeps all.
func (s Summary) Top(n int) Summary {
	if n > 0 && len(s.Sources) > n {
		s.Sources = s.Sources[:n:n]
	}
	return s
}

// Write renders s as "table" (or ""), "json" or "csv".
func (s Summary) Write(w io.Writer, format string) error {
	switch format {
	case "table", "":
		return s.writeTable(w)
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	case "csv":
		return s.writeCSV(w)
	}
	return fmt.Errorf("audit: unknown format %q (want table, json or csv)", format)
}

func (s Summary) writeTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "files\t%d\n", s.Files)
	fmt.Fprintf(tw, "events written\t%d\n", s.Events)
	fmt.Fprintf(tw, "events suppressed\t%d\n", s.Suppressed)
	fmt.Fprintf(tw, "events estimated\t%d\n", s.Estimated)
	fmt.Fprintf(tw, "events dropped (sink stalled)\t%d\n", s.Dropped)
	fmt.Fprintf(tw, "storeguard upgrades and restarts\t%d\n", s.Handovers)
	fmt.Fprintf(tw, "first seen\t%s\n", formatTime(s.FirstSeen, "-"))
	fmt.Fprintf(tw, "last seen\t%s\n", formatTime(s.LastSeen, "-"))
	fmt.Fprintf(tw, "malformed lines\t%d\n", s.Malformed)

	fmt.Fprintf(tw, "\nACTION\tEVENTS\n")
	for _, c := range s.ByAction {
		fmt.Fprintf(tw, "%s\t%d\n", c.Key, c.Events)
	}
	fmt.Fprintf(tw, "\nRULE\tEVENTS\n")
	for _, c := range s.ByRule {
		fmt.Fprintf(tw, "%s\t%d\n", c.Key, c.Events)
	}
	fmt.Fprintf(tw, "\nSOURCE\tEXACT\tSUPPRESSED\tESTIMATED\tFIRST SEEN\tLAST SEEN\n")
	for _, src := range s.Sources {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", formatIP(src.IP), src.Exact, src.Suppressed, src.Estimated,
			formatTime(src.FirstSeen, "-"), formatTime(src.LastSeen, "-"))
	}
	if hidden := s.TotalSources - len(s.Sources); hidden > 0 {
		fmt.Fprintf(tw, "(%d more)\n", hidden)
	}
	fmt.Fprintf(tw, "\nHOUR (UTC)\tEVENTS\n")
	for _, h := range s.PerHour {
		fmt.Fprintf(tw, "%s\t%d\n", h.Hour.Format(time.RFC3339), h.Events)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(s.MalformedAt) > 0 {
		fmt.Fprintf(w, "\nMALFORMED\n")
	}
	for _, le := range s.MalformedAt {
		if _, err := fmt.Fprintln(w, le.Error()); err != nil {
			return err
		}
	}
	return nil
}

// writeCSV writes one long table so every section fits the same columns.
func (s Summary) writeCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	u := func(n uint64) string { return strconv.FormatUint(n, 10) }
	cw.Write([]string{"section", "key", "events", "suppressed", "estimated", "first_seen", "last_seen"})
	cw.Write([]string{"total", "", u(s.Events), u(s.Suppressed), u(s.Estimated), formatTime(s.FirstSeen, ""), formatTime(s.LastSeen, "")})
	cw.Write([]string{"malformed", "", strconv.Itoa(s.Malformed), "", "", "", ""})
	for _, c := range s.ByAction {
		cw.Write([]string{"action", c.Key, u(c.Events), "", "", "", ""})
	}
	for _, c := range s.ByRule {
		cw.Write([]string{"rule", c.Key, u(c.Events), "", "", "", ""})
	}
	for _, h := range s.PerHour {
		cw.Write([]string{"hour", h.Hour.Format(time.RFC3339), u(h.Events), "", "", "", ""})
	}
	for _, src := range s.Sources {
		cw.Write([]string{"source", formatIP(src.IP), u(src.Exact), u(src.Suppressed), u(src.Estimated),
			formatTime(src.FirstSeen, ""), formatTime(src.LastSeen, "")})
	}
	cw.Flush()
	return cw.Error()
}

func formatTime(t time.Time, zero string) string {
	if t.IsZero() {
		return zero
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func formatIP(ip netip.Addr) string {
	if !ip.IsValid() {
		return "-"
	}
	return ip.String()
}
