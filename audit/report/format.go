package report

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/storeguard/storeguard/audit"
)

// group writes n with thousands separators: 962,174,058,496.
func group(n uint64) string {
	s := strconv.FormatUint(n, 10)
	if len(s) <= 3 {
		return s
	}
	var b strings.Builder
	pre := len(s) % 3
	if pre > 0 {
		b.WriteString(s[:pre])
	}
	for i := pre; i < len(s); i += 3 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s[i : i+3])
	}
	return b.String()
}

// bytesText is an exact byte count: figures in a security report are not rounded.
func bytesText(n uint64) string { return group(n) + " B" }

// plural is "1 connection", "27 connections".
func plural(n uint64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return group(n) + " " + noun + "s"
}

// countsText lists m's keys, most first: "set 2, get 1".
func countsText(m map[string]uint64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + " " + group(m[k])
	}
	return strings.Join(parts, ", ")
}

// byteField: fields whose declared value is a length in bytes.
func byteField(field, rule string) bool {
	switch field {
	case "key", "value", "expected", "desired":
		return true
	}
	return rule == "message_too_large"
}

// declaredText is "key declared 962,174,058,496 B > 8,192", or "" without a declared value.
func (r *RuleStats) declaredText() string {
	if r.Declared == nil {
		return ""
	}
	field := cmp.Or(r.Field, "field")
	s := field + " declared " + group(uint64(*r.Declared))
	if byteField(r.Field, r.Key) {
		s += " B"
	}
	if r.Limit != nil {
		s += " > " + group(uint64(*r.Limit))
	}
	return s
}

func formatTime(t time.Time, zero string) string {
	if t.IsZero() {
		return zero
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// clock formats times of a report: the time of day when the report spans one UTC day, with the
// date otherwise.
type clock struct{ sameDay bool }

func clockFor(first, last time.Time) clock {
	y1, m1, d1 := first.UTC().Date()
	y2, m2, d2 := last.UTC().Date()
	return clock{y1 == y2 && m1 == m2 && d1 == d2}
}

func (c clock) format(t time.Time) string {
	switch {
	case t.IsZero():
		return "-"
	case c.sameDay:
		return t.UTC().Format(time.TimeOnly)
	}
	return t.UTC().Format("2006-01-02 15:04")
}

// short is format, shorter across days: 03-01 12:00.
func (c clock) short(t time.Time) string {
	if t.IsZero() || c.sameDay {
		return c.format(t)
	}
	return t.UTC().Format("01-02 15:04")
}

func formatIP(ip netip.Addr) string {
	if !ip.IsValid() {
		return "-"
	}
	return printable(ip.String()) // a zone is any string a log holds
}

// printable escapes every byte of s outside printable ASCII as \xNN, so that a string from a log
// (a key, a pickle's global, an address's zone) can put no escape sequence on a terminal, no
// control character in a cell, and no byte a browser or a spreadsheet reads otherwise.
func printable(s string) string {
	i := 0
	for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f {
		i++
	}
	if i == len(s) {
		return s
	}
	const digits = "0123456789abcdef"
	b := make([]byte, 0, len(s)+8)
	b = append(b, s[:i]...)
	for ; i < len(s); i++ {
		if c := s[i]; c >= 0x20 && c < 0x7f {
			b = append(b, c)
		} else {
			b = append(b, '\\', 'x', digits[c>>4], digits[c&0xf])
		}
	}
	return string(b)
}

// spanText is a duration to a reader: 1h40m, 3d4h, 12s.
func spanText(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		days := d / (24 * time.Hour)
		return strconv.Itoa(int(days)) + "d" + strconv.Itoa(int((d-days*24*time.Hour)/time.Hour)) + "h"
	case d >= time.Hour:
		return strings.TrimSuffix(d.Truncate(time.Minute).String(), "0s")
	case d >= time.Minute:
		return strings.TrimSuffix(d.Truncate(time.Second).String(), "0s")
	}
	return d.Truncate(time.Millisecond).String()
}

// stepText names a bucket size: 5s, 10m, 3h, 1d, 7d.
func stepText(sec int64) string {
	switch {
	case sec >= 86400 && sec%86400 == 0:
		return strconv.FormatInt(sec/86400, 10) + "d"
	case sec >= 3600 && sec%3600 == 0:
		return strconv.FormatInt(sec/3600, 10) + "h"
	case sec >= 60 && sec%60 == 0:
		return strconv.FormatInt(sec/60, 10) + "m"
	}
	return strconv.FormatInt(sec, 10) + "s"
}

// verdictOrder is the order verdicts are listed in, most telling first.
var verdictOrder = []audit.Verdict{audit.VerdictWouldBlock, audit.VerdictBlocked, audit.VerdictTruncated, audit.VerdictEmpty, audit.VerdictRefused, audit.VerdictOpen, audit.VerdictPassed}

// verdictsText lists a source's connections by verdict: "20 empty, 7 blocked".
func verdictsText(m map[string]uint64) string {
	var parts []string
	for _, kc := range verdictCounts(m) {
		parts = append(parts, group(kc.N)+" "+kc.Key)
	}
	return strings.Join(parts, ", ")
}

// key is the source's key in the summarizer's tables.
func (st *SourceStats) key() sourceKey {
	if st.Identity != "" {
		return sourceKey{id: st.Identity}
	}
	return sourceKey{ip: st.IP}
}

// label names a source to a reader: its identity, or its address.
func (st *SourceStats) label() string {
	if st.Identity != "" {
		return printable(st.Identity)
	}
	return formatIP(st.IP)
}

// addressesText lists an identity's addresses: "10.0.0.1, 10.0.0.2 and 3 more".
func (st *SourceStats) addressesText() string {
	s := ipsText(st.IPs)
	if more := st.IPCount - len(st.IPs); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}
