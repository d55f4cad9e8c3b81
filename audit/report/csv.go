package report

import (
	"encoding/csv"
	"encoding/hex"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/storeguard/storeguard/audit"
)

// csvHeader: one long table, so that every section fits the same columns; a row leaves empty what
// its section does not have. The first seven columns are those of earlier releases; columns are
// added at the end.
var csvHeader = []string{"section", "key", "events", "suppressed", "estimated", "first_seen", "last_seen",
	"connections", "store_bytes", "role", "reached", "field", "declared", "limit", "probe", "first_bytes", "detail",
	"rule", "action", "sources", "ips"}

type csvRow struct {
	section, key                  string
	events, suppressed, estimated string
	first, last                   time.Time
	connections, storeBytes       string
	role, reached                 string
	field, declared, limit        string
	probe                         string
	firstBytes                    []byte
	detail                        string
	rule, action, sources, ips    string // policy rows
}

// record is the row's cells, every one through cellText: most carry what a log said.
func (r csvRow) record() []string {
	cells := []string{r.section, r.key, r.events, r.suppressed, r.estimated, formatTime(r.first, ""), formatTime(r.last, ""),
		r.connections, r.storeBytes, r.role, r.reached, r.field, r.declared, r.limit, r.probe, hex.EncodeToString(r.firstBytes), r.detail,
		r.rule, r.action, r.sources, r.ips}
	for i, c := range cells {
		cells[i] = cellText(c)
	}
	return cells
}

// cellText is a string as a CSV cell: printable ASCII, and not a formula. A spreadsheet runs a
// cell that starts with = + - or @ (OWASP's CSV injection): such a cell starts with ' instead,
// which the spreadsheet shows and does not run. Tab and CR, which lead to the same, are escaped.
func cellText(s string) string {
	s = printable(s)
	if s != "" && strings.ContainsRune("=+-@", rune(s[0])) {
		return "'" + s
	}
	return s
}

// policyReached is the reached column of policy rows: would_block when any of their messages
// reached the store, nothing when every one was blocked.
func policyReached(wouldBlock uint64) string {
	if wouldBlock > 0 {
		return ReachedWouldBlock
	}
	return ReachedNothing
}

func u(n uint64) string { return strconv.FormatUint(n, 10) }

func big(n *audit.BigUint) string {
	if n == nil {
		return ""
	}
	return u(uint64(*n))
}

func ipStrings(ips []netip.Addr) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = formatIP(ip)
	}
	return out
}

func ipKey(ip netip.Addr) string {
	if !ip.IsValid() {
		return ""
	}
	return formatIP(ip)
}

func (s Summary) writeCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write(csvHeader)
	put := func(r csvRow) { cw.Write(r.record()) }
	put(csvRow{section: "total", events: u(s.Events), suppressed: u(s.Suppressed), estimated: u(s.Estimated),
		first: s.FirstSeen, last: s.LastSeen, connections: u(s.Connections), storeBytes: u(s.Reached.StoreBytes),
		reached: s.Reached.Verdict})
	put(csvRow{section: "malformed", events: strconv.Itoa(s.Malformed)})
	for _, f := range s.Reached.Findings {
		put(csvRow{section: "finding", key: cmpOr(f.Identity, ipKey(f.IP)), connections: u(f.Connections), storeBytes: u(f.StoreBytes),
			reached: f.Verdict, detail: f.Text})
	}
	for _, c := range s.ByAction {
		put(csvRow{section: "action", key: c.Key, events: u(c.Events)})
	}
	for _, v := range s.ByVerdict {
		put(csvRow{section: "verdict", key: v.Key, suppressed: u(v.Suppressed), estimated: u(v.Estimated), connections: u(v.Connections)})
	}
	pt := csvRow{section: "policy_total", events: u(s.Policy.Events), suppressed: u(s.Policy.Suppressed),
		estimated: u(s.Policy.Events + s.Policy.Suppressed), reached: policyReached(s.Policy.WouldBlock + s.Policy.SuppressedWouldBlock),
		detail: "would_block " + u(s.Policy.WouldBlock) + "; sampled away would_block " + u(s.Policy.SuppressedWouldBlock) +
			"; not listed " + u(s.Policy.Other) + " (would_block " + u(s.Policy.OtherWouldBlock) + ")"}
	if s.Policy.Events+s.Policy.Suppressed == 0 {
		pt.reached = ReachedNone
	}
	put(pt)
	for _, p := range s.Policy.Entries {
		ips := make([]string, len(p.IPs))
		for i, ip := range p.IPs {
			ips[i] = formatIP(ip)
		}
		var wb uint64
		if p.Action == string(audit.ActionWouldBlock) {
			wb = p.Events
		}
		put(csvRow{section: "policy", key: p.Key, events: u(p.Events), estimated: u(p.Events), first: p.FirstSeen, last: p.LastSeen,
			reached: policyReached(wb), detail: p.Detail, rule: p.Rule, action: p.Action,
			sources: strconv.Itoa(p.Sources), ips: strings.Join(ips, " ")})
	}
	for _, r := range s.ByRule {
		put(csvRow{section: "rule", key: r.Key, events: u(r.Events), suppressed: u(r.Suppressed), estimated: u(r.Estimated),
			first: r.First.Time, field: r.Field, declared: big(r.Declared), limit: big(r.Limit), probe: r.First.Probe,
			firstBytes: r.First.FirstBytes, detail: "sources " + strconv.Itoa(r.Sources) + "; would_block " + u(r.WouldBlock)})
	}
	for _, d := range s.Denials {
		put(csvRow{section: "denial", key: d.Key, events: u(d.Events), suppressed: u(d.Suppressed),
			estimated: u(d.Events + d.Suppressed), connections: u(d.Connections), detail: "sources " + strconv.Itoa(d.Sources)})
	}
	for _, h := range s.Handshakes {
		put(csvRow{section: "handshake", key: h.Key, events: u(h.Events), suppressed: u(h.Suppressed),
			estimated: u(h.Events + h.Suppressed), connections: u(h.Connections), sources: strconv.Itoa(h.Sources),
			ips: strings.Join(ipStrings(h.IPs), " ")})
	}
	for _, b := range s.Bans {
		put(csvRow{section: "ban", key: b.Key, events: u(b.Events), detail: "sources " + strconv.Itoa(b.Sources)})
	}
	for _, p := range s.Probes {
		put(csvRow{section: "probe", key: p.Key, events: u(p.Events), connections: u(p.Connections), first: p.First.Time,
			probe: p.Key, firstBytes: p.First.FirstBytes, detail: "sources " + strconv.Itoa(p.Sources)})
	}
	for _, sec := range []struct {
		name string
		cs   []Count
	}{{"op", s.Ops}, {"hostile_op", s.HostileOps}, {"field", s.Fields}} {
		for _, c := range sec.cs {
			put(csvRow{section: sec.name, key: c.Key, events: u(c.Events)})
		}
	}
	for _, sc := range s.Scans {
		put(csvRow{section: "scan", key: ipKey(sc.IP), first: sc.Start, last: sc.Time, connections: u(sc.Connections),
			probe: strings.Join(sc.Probes, " "), detail: verdictsText(sc.Verdicts)})
	}
	for _, h := range s.PerHour {
		put(csvRow{section: "hour", key: h.Hour.Format(time.RFC3339), events: u(h.Events)})
	}
	for _, src := range s.Sources {
		r := csvRow{section: "source", key: ipKey(src.IP), events: u(src.Exact), suppressed: u(src.Suppressed),
			estimated: u(src.Estimated), first: src.FirstSeen, last: src.LastSeen,
			connections: u(src.Connections + src.ConnectionsSuppressed), storeBytes: u(src.StoreBytes),
			role: src.Role, reached: src.Reached, probe: strings.Join(src.Probes, " "), detail: verdictsText(src.ByVerdict)}
		if src.Identity != "" { // an identity's row: its addresses in ips
			r.key, r.sources, r.ips = src.Identity, strconv.Itoa(src.IPCount), strings.Join(ipStrings(src.IPs), " ")
		}
		put(r)
	}
	cw.Flush()
	return cw.Error()
}
