// Package report reads audit logs offline (storeguard audit) and says what happened: a Summary
// of who, when, with what, and whether anything hostile reached the store, written as a table,
// JSON, CSV or an HTML page. Serve and replay never import it.
package report

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

// What the table shows of each section, so that it fits one screen (about 50 lines of 100
// columns); JSON and CSV have everything.
const (
	tableTimelineRows = 3 // sources, under the row of all
	tableRules        = 4
	tableProbes       = 4
	tableScans        = 2
	tableJobIPs       = 4
	tableRuleDetail   = 46 // runes of a policy rule's detail: the widest declared size
	tableIdentity     = 40 // runes of an identity in the sources and timeline
)

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

// writeTable is the one-screen report: what reached the store first (the messages that broke a
// policy rule, by key, then each hostile source), then who, when and with what.
func (s Summary) writeTable(w io.Writer) error {
	ew := &errWriter{w: w}
	c := clockFor(s.FirstSeen, s.LastSeen)
	s.writeHeader(ew, c)

	fmt.Fprintf(ew, "\nDID ANYTHING GET THROUGH?\n")
	s.writePolicy(ew)
	for _, f := range s.Reached.Findings {
		writeWrapped(ew, "  "+findingMark(f), f.Text)
	}

	s.writeSources(ew, c)
	s.writeTimeline(ew, c)
	s.writeRules(ew)
	s.writeProbes(ew, c)
	s.writeRefusals(ew)
	s.writeScans(ew, c)
	if len(s.MalformedAt) > 0 { // JSON lists the first MaxMalformedListed
		line := fmt.Sprintf("MALFORMED LINES: %s, the first %s", group(uint64(s.Malformed)), printable(s.MalformedAt[0].Error()))
		fmt.Fprintf(ew, "\n%s\n", clip(line, screenWidth))
	}
	return ew.err
}

func (s Summary) writeHeader(w io.Writer, c clock) {
	fmt.Fprintf(w, "storeguard audit: %s", plural(uint64(s.Files), "file"))
	if !s.FirstSeen.IsZero() {
		to := c.format(s.LastSeen)
		if !c.sameDay {
			to = s.LastSeen.Format(time.DateTime)
		}
		fmt.Fprintf(w, ", %s to %s UTC (%s)", s.FirstSeen.Format(time.DateTime), to, spanText(s.LastSeen.Sub(s.FirstSeen)))
	}
	fmt.Fprintln(w)
	var b strings.Builder
	fmt.Fprintf(&b, "events %s", estimated(s.Estimated, s.Suppressed))
	if s.Suppressed > 0 {
		fmt.Fprintf(&b, " (%s written)", group(s.Events))
	}
	fmt.Fprintf(&b, "; connections %s", estimated(s.ConnectionsEstimated, s.ConnectionsSuppressed))
	if s.ConnectionsSuppressed > 0 {
		fmt.Fprintf(&b, " (%s written)", group(s.Connections))
	}
	fmt.Fprintf(&b, "; sources %s: %s hostile, %s job", group(uint64(s.TotalSources)), group(uint64(s.HostileSources)),
		group(uint64(s.JobSources)))
	if other := s.TotalSources - s.HostileSources - s.JobSources; other > 0 {
		fmt.Fprintf(&b, ", %s other", group(uint64(other)))
	}
	writeWrapped(w, "", b.String())
	fmt.Fprintf(w, "storeguard upgrades and restarts %s; events lost by a stalled sink %s; malformed lines %s\n",
		group(s.Handovers), group(s.Dropped), group(uint64(s.Malformed)))
}

func findingMark(f Finding) string {
	switch {
	case f.Headline:
		return ""
	case f.Verdict == ReachedWouldBlock:
		return "!! "
	case f.Verdict == ReachedForwarded:
		return "! "
	}
	return "- "
}

// estimated marks a count that includes what sampling suppressed.
func estimated(n, suppressed uint64) string {
	if suppressed > 0 {
		return "~" + group(n)
	}
	return group(n)
}

func (s Summary) writeSources(w io.Writer, c clock) {
	rows := [][]string{{"SOURCE", "ROLE", "SEEN", "EVENTS", "TO STORE", "CONNECTIONS"}}
	var froms []string // the addresses of the identities listed
	for _, src := range s.Sources {
		if src.Role == RoleJob {
			continue
		}
		toStore := "-"
		switch src.Reached {
		case "":
		case ReachedUnknown:
			toStore = "? no flows"
		default:
			toStore = bytesText(src.StoreBytes)
		}
		conns := group(src.Connections + src.ConnectionsSuppressed)
		if v := verdictsText(src.ByVerdict); v != "" {
			conns += ": " + v
		}
		if src.Identity != "" {
			froms = append(froms, clip(src.label(), tableIdentity)+" from "+src.addressesText())
		}
		rows = append(rows, []string{clip(src.label(), tableIdentity), src.Role, c.short(src.FirstSeen) + "-" + c.short(src.LastSeen),
			estimated(src.Estimated, src.Suppressed), toStore, conns})
	}
	if len(rows) > 1 {
		fmt.Fprintln(w)
		writeCells(w, rows)
	}
	for _, f := range froms {
		writeWrapped(w, "  ", f)
	}
	if hidden := s.TotalSources - len(s.Sources); hidden > 0 {
		fmt.Fprintf(w, "  (%d more sources: --top 0 lists all)\n", hidden)
	}
	if s.JobSources > 0 {
		all := s.all
		if all == nil {
			all = s.Sources
		}
		var jobs []string
		var passed uint64
		for _, src := range all {
			if src.Role == RoleJob {
				passed += src.ByVerdict[string(audit.VerdictPassed)]
				if len(jobs) < tableJobIPs {
					name := src.label()
					if src.Identity != "" {
						name += " (" + src.addressesText() + ")"
					}
					jobs = append(jobs, name)
				}
			}
		}
		names := strings.Join(jobs, ", ")
		if more := s.JobSources - len(jobs); more > 0 {
			names += fmt.Sprintf(" and %d more", more)
		}
		fmt.Fprintf(w, "  jobs: %s (%s passed)\n", names, plural(passed, "connection"))
	}
}

// screenWidth is the width the table is laid out for.
const screenWidth = 100

// writeCells writes rows in columns two spaces apart, indented by two, and clips the last column
// so that a line fits screenWidth.
func writeCells(w io.Writer, rows [][]string) {
	var widths []int
	for _, row := range rows {
		for i, cell := range row[:len(row)-1] {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		b.WriteString("  ")
		for i, cell := range row[:len(row)-1] {
			b.WriteString(cell)
			b.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell)+2))
		}
		b.WriteString(clip(row[len(row)-1], screenWidth-utf8.RuneCountInString(b.String())))
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// clip shortens s to n runes, the last one an ellipsis.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:max(n-1, 0)]) + "…"
}

// writeWrapped writes text after prefix, wrapped at screenWidth under its first word.
func writeWrapped(w io.Writer, prefix, text string) {
	indent := strings.Repeat(" ", utf8.RuneCountInString(prefix))
	line := prefix
	col := utf8.RuneCountInString(prefix)
	for i, word := range strings.Fields(text) {
		n := utf8.RuneCountInString(word)
		if i > 0 && col+1+n > screenWidth {
			fmt.Fprintln(w, line)
			line, col = indent+word, len(indent)+n
			continue
		}
		if i > 0 {
			line += " "
			col++
		}
		line += word
		col += n
	}
	fmt.Fprintln(w, line)
}

const sparks = " ▁▂▃▄▅▆▇█"

// sparkline draws counts in eighths of their maximum; a count above 0 is never blank.
func sparkline(counts []uint64) string {
	var top uint64
	for _, n := range counts {
		top = max(top, n)
	}
	levels := []rune(sparks)
	var b strings.Builder
	for _, n := range counts {
		lvl := 0
		if n > 0 {
			lvl = int((n*8 + top - 1) / top)
		}
		b.WriteRune(levels[lvl])
	}
	return b.String()
}

func sum(counts ...[]uint64) uint64 {
	var n uint64
	for _, c := range counts {
		for _, v := range c {
			n += v
		}
	}
	return n
}

func addSeries(a, b []uint64) []uint64 {
	out := make([]uint64, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

func (s Summary) writeTimeline(w io.Writer, c clock) {
	tl := s.Timeline
	if tl.BucketSeconds == 0 {
		return
	}
	fmt.Fprintf(w, "\nTIMELINE (UTC, %s a column from %s to %s: events and connections written)\n",
		stepText(tl.BucketSeconds), c.format(tl.Start), c.format(tl.End))
	type row struct {
		label  string
		counts []uint64
	}
	rows := []row{{"all", addSeries(tl.Events, tl.Connections)}}
	for _, st := range tl.Sources[:min(len(tl.Sources), tableTimelineRows)] {
		label := formatIP(st.IP)
		if st.Identity != "" {
			label = clip(printable(st.Identity), tableIdentity)
		}
		rows = append(rows, row{label, addSeries(st.Events, st.Connections)})
	}
	width := 0
	for _, r := range rows {
		width = max(width, len(r.label))
	}
	for _, r := range rows {
		fmt.Fprintf(w, "  %-*s |%s| %s\n", width, r.label, sparkline(r.counts), group(sum(r.counts)))
	}
}

func hexText(b []byte) string {
	if len(b) == 0 {
		return "-"
	}
	return hex.EncodeToString(b)
}

func (s Summary) writeRules(w io.Writer) {
	if len(s.ByRule) == 0 {
		return
	}
	fmt.Fprintln(w)
	rows := [][]string{{shownOf("RULE", tableRules, len(s.ByRule)), "BLOCKED", "LARGEST DECLARED", "FIRST BYTES"}}
	for _, r := range s.ByRule[:min(len(s.ByRule), tableRules)] {
		n := estimated(r.Estimated, r.Suppressed)
		if r.WouldBlock > 0 {
			n += fmt.Sprintf(" (%s THROUGH)", group(r.WouldBlock))
		}
		declared := strings.Replace(r.declaredText(), " declared ", " ", 1)
		if protocol.IsPolicyRule(protocol.Rule(r.Key)) {
			// A valid message: what broke the rule, not a size.
			rows[0][2] = "LARGEST DECLARED / DETAIL"
			declared = clip(printable(r.First.Detail), tableRuleDetail)
		}
		rows = append(rows, []string{printable(r.Key), n, cmpOr(declared, "-"), hexText(r.First.FirstBytes)})
	}
	writeCells(w, rows)
	var with []string
	if len(s.Ops) > 0 {
		with = append(with, "ops "+countList(s.Ops))
	}
	if len(s.Fields) > 0 {
		with = append(with, "fields "+countList(s.Fields))
	}
	if len(s.HostileOps) > 0 {
		with = append(with, "complete messages of hostile connections "+countList(s.HostileOps))
	}
	if len(with) > 0 {
		writeWrapped(w, "  ", "blocked: "+strings.Join(with, "; "))
	}
}

// shownOf titles a section that shows the first shown of n: "RULE (4 of 7)".
func shownOf(title string, shown, n int) string {
	if n > shown {
		return fmt.Sprintf("%s (%d of %d)", title, shown, n)
	}
	return title
}

func cmpOr(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func countList(cs []Count) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = c.Key + " " + group(c.Events)
	}
	return strings.Join(parts, ", ")
}

func (s Summary) writeProbes(w io.Writer, c clock) {
	if len(s.Probes) == 0 {
		return
	}
	fmt.Fprintln(w)
	rows := [][]string{{shownOf("PROBE", tableProbes, len(s.Probes)), "CONNECTIONS", "BLOCKED", "SOURCES", "FIRST SEEN", "FIRST BYTES"}}
	for _, p := range s.Probes[:min(len(s.Probes), tableProbes)] {
		rows = append(rows, []string{p.Key, group(p.Connections), group(p.Events), group(uint64(p.Sources)),
			c.format(p.First.Time), hexText(p.First.FirstBytes)})
	}
	writeCells(w, rows)
	for _, p := range s.Probes[:min(len(s.Probes), tableProbes)] {
		if note, ok := probeNotes[p.Key]; ok {
			writeWrapped(w, "  ", p.Key+": "+note)
		}
	}
}

// probeNotes say what a probe does to a torch store, for the probes that did harm.
var probeNotes = map[string]string{
	"rdp_x224": "nmap's TerminalServer probe; to a torch <= 2.1 store it is an ADD of a 962 GB key, " +
		"the allocation of PyTorch #106294",
}

// writeRefusals lists admission's refusals and bans: not rules, so apart from them.
func (s Summary) writeRefusals(w io.Writer) {
	if len(s.Denials) == 0 && len(s.Bans) == 0 {
		return
	}
	fmt.Fprintln(w)
	var parts []string
	for _, d := range s.Denials {
		if !audit.IsTLSReason(d.Key) { // listed below, by address
			parts = append(parts, fmt.Sprintf("%s %s (%s)", printable(d.Key), group(d.Refusals()), plural(uint64(d.Sources), "source")))
		}
	}
	if len(parts) > 0 {
		writeWrapped(w, "", "REFUSED (admission, not rules): "+strings.Join(parts, ", "))
	}
	if len(s.Handshakes) > 0 {
		parts := make([]string, len(s.Handshakes))
		for i, h := range s.Handshakes {
			from := ipsText(h.IPs)
			if more := h.Sources - len(h.IPs); more > 0 {
				from += fmt.Sprintf(" and %d more", more)
			}
			parts[i] = fmt.Sprintf("%s %s (%s: %s)", printable(h.Key), group(h.Refusals()), addresses(h.Sources), from)
		}
		writeWrapped(w, "", "REFUSED HANDSHAKES: "+strings.Join(parts, ", "))
	}
	if len(s.Bans) > 0 {
		parts := make([]string, len(s.Bans))
		for i, b := range s.Bans {
			parts[i] = fmt.Sprintf("%s (%s)", plural(uint64(b.Sources), "source"), b.Key)
		}
		writeWrapped(w, "", "BANNED: "+strings.Join(parts, ", "))
	}
}

func (s Summary) writeScans(w io.Writer, c clock) {
	if s.TotalScans == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s\n", shownOf("SCANS DETECTED", tableScans, s.TotalScans))
	for _, sc := range s.Scans[:min(len(s.Scans), tableScans)] {
		fmt.Fprintf(w, "  %s\n", clip(scanText(sc, c), screenWidth-2))
	}
}

func scanText(sc ScanNotice, c clock) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %s", c.format(sc.Time), formatIP(sc.IP), plural(sc.Connections, "connection"))
	if len(sc.Ports) > 0 {
		ports := make([]string, len(sc.Ports))
		for i, p := range sc.Ports {
			ports[i] = fmt.Sprint(p)
		}
		fmt.Fprintf(&b, " to port %s", strings.Join(ports, ", "))
	}
	if len(sc.Verdicts) > 0 {
		fmt.Fprintf(&b, " (%s)", verdictsText(sc.Verdicts))
	}
	if len(sc.Probes) > 0 {
		fmt.Fprintf(&b, ", probes %s", strings.Join(sc.Probes, ", "))
	}
	return b.String()
}

// addresses is "1 address", "2 addresses".
func addresses(n int) string {
	if n == 1 {
		return "1 address"
	}
	return group(uint64(n)) + " addresses"
}

// errWriter keeps the first write error, so that a report is written without checking each line.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return len(p), nil
	}
	_, e.err = e.w.Write(p)
	return len(p), nil
}
