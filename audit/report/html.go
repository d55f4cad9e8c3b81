package report

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/storeguard/storeguard/audit"
)

//go:embed report.html.tmpl
var reportTemplate string

var reportHTML = template.Must(template.New("report").Funcs(template.FuncMap{
	"fig":       figureKey,
	"num":       func(n uint64) string { return group(n) },
	"int":       func(n int) string { return group(uint64(n)) },
	"bytes":     bytesText,
	"time":      htmlTime,
	"hex":       hexText,
	"ip":        formatIP,
	"big":       bigText,
	"verdicts":  verdictsText,
	"join":      strings.Join,
	"ports":     portsText,
	"mark":      findingMark,
	"step":      stepText,
	"counts":    verdictCounts,
	"lineError": func(e audit.LineError) string { return printable(e.Error()) },
	"printable": printable,
	"ips":       ipsText,
	"src":       sourceFigureKey,
	"minus":     func(a, b int) int { return a - b },
}).Parse(reportTemplate))

// sourceFigureKey is a source's KEY in data-figure: its identity, or its address.
func sourceFigureKey(st SourceStats) any {
	if st.Identity != "" {
		return st.Identity
	}
	return st.IP
}

// WriteHTML renders s as one self-contained page: inline CSS, charts drawn here as inline SVG, no
// script and no external resource, so that it shows the same offline, in a mail or in a ticket.
//
// Every figure of the page that comes from s is in an element with a data-figure attribute that
// names where it is in the JSON of s (Write "json"), as "COLLECTION:KEY:FIELD":
//
//	total:FIELD                      a top-level field: total:events, total:first_seen
//	reached:FIELD                    reached_store's: reached:store_bytes
//	finding:I:FIELD                  reached_store.findings[I]: finding:0:text
//	source:IP:FIELD                  the source of sources with that ip: source:10.0.0.5:connections,
//	                                 source:10.0.0.5:by_verdict.empty (0 when absent); a source that
//	                                 is an identity by its identity (source:spiffe://td/w:ips)
//	handshake:KEY:FIELD              handshakes' entry of that reason: handshake:tls_unknown_ca:ips
//	rule:KEY:FIELD, probe:KEY:FIELD  by_rule's and probes' entry of that key; first.time, first.first_bytes
//	denial:KEY:FIELD, ban:KEY:FIELD  denials' and bans' entries
//	op:KEY:events, hostile_op:KEY:events, field:KEY:events
//	scan:I:FIELD                     scans[I]: scan:0:connections, scan:0:ports (joined by ", ")
//	policy::FIELD                    policy's: policy::would_block
//	policy:I:FIELD                   policy.entries[I]: policy:0:key, policy:0:ips (joined by ", ")
//	timeline:all:events.I            timeline.events[I] (also connections.I), and timeline:IP:events.I
//	                                 of timeline.sources' row of that ip (or identity); timeline::bucket_seconds
//
// KEY may hold colons (an IPv6 address): it is what lies between the first colon and the last.
// The element's text is the figure as shown: numbers with thousands separators, bytes with " B",
// times as "2006-01-02 15:04:05" (UTC, to the second), "-" for an absent value; a bar of a chart
// holds its count in a <title>.
func (s Summary) WriteHTML(w io.Writer) error {
	return reportHTML.Execute(w, newHTMLView(s))
}

// figureKey joins a data-figure name; an IP key is written as the address.
func figureKey(collection string, key any, field string) string {
	var k string
	switch v := key.(type) {
	case netip.Addr:
		k = formatIP(v)
	default:
		k = fmt.Sprint(v)
	}
	return collection + ":" + k + ":" + field
}

func htmlTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.DateTime)
}

func bigText(n *audit.BigUint) string {
	if n == nil {
		return "-"
	}
	return group(uint64(*n))
}

func ipsText(ips []netip.Addr) string {
	parts := make([]string, len(ips))
	for i, ip := range ips {
		parts[i] = formatIP(ip)
	}
	return strings.Join(parts, ", ")
}

func portsText(ports []uint16) string {
	parts := make([]string, len(ports))
	for i, p := range ports {
		parts[i] = fmt.Sprint(p)
	}
	return strings.Join(parts, ", ")
}

// keyCount is one entry of a map of counts.
type keyCount struct {
	Key string
	N   uint64
}

// verdictCounts lists a map of connections by verdict in verdictOrder, then the others by name.
func verdictCounts(m map[string]uint64) []keyCount {
	var out []keyCount
	for _, v := range verdictOrder {
		if n := m[string(v)]; n > 0 {
			out = append(out, keyCount{string(v), n})
		}
	}
	var unknown []string
	for k, n := range m {
		if !slices.Contains(verdictOrder, audit.Verdict(k)) && n > 0 {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	for _, k := range unknown {
		out = append(out, keyCount{k, m[k]})
	}
	return out
}

// htmlView is what the template shows of a Summary.
type htmlView struct {
	S      Summary
	All    chart
	Charts []chart
}

// chart is one row of the timeline: stacked bars, events under connections, on its own scale.
type chart struct {
	Key  string // "all" or the source's address
	Role string
	Bars []bar
}

type bar struct {
	I                   int
	X, W                float64
	EvY, EvH, CnY, CnH  float64
	Events, Connections uint64
}

// Chart geometry, in SVG user units.
const (
	chartW = 600.0
	chartH = 40.0
)

func newChart(key, role string, events, conns []uint64) chart {
	c := chart{Key: key, Role: role}
	var top uint64
	for i := range events {
		top = max(top, events[i]+conns[i])
	}
	n := float64(len(events))
	for i := range events {
		b := bar{I: i, X: chartW * float64(i) / n, W: max(chartW/n-1, 0.5), Events: events[i], Connections: conns[i]}
		if top > 0 {
			b.EvH = chartH * float64(events[i]) / float64(top)
			b.CnH = chartH * float64(conns[i]) / float64(top)
		}
		b.EvY = chartH - b.EvH
		b.CnY = b.EvY - b.CnH
		c.Bars = append(c.Bars, b)
	}
	return c
}

func newHTMLView(s Summary) htmlView {
	v := htmlView{S: s}
	tl := s.Timeline
	v.All = newChart("all", "", tl.Events, tl.Connections)
	roles := make(map[sourceKey]string, len(s.Sources))
	for _, src := range s.Sources {
		roles[src.key()] = src.Role
	}
	for _, row := range tl.Sources {
		st := SourceStats{IP: row.IP, Identity: row.Identity}
		label := formatIP(row.IP)
		if row.Identity != "" {
			label = printable(row.Identity)
		}
		v.Charts = append(v.Charts, newChart(label, roles[st.key()], row.Events, row.Connections))
	}
	return v
}
