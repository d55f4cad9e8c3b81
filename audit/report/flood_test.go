package report

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
)

// TestRefusalFloodCostsBoundedLines: a million refusals from 200 banned sources in one minute,
// each written as serve writes one (a denied event with the probe a banned source's first bytes
// name, and the refused connection's flow record), through the writer with serve's embedded
// sampling defaults, leave an audit log under 10 MB, and the report counts every refusal exactly,
// with each source's first and last seen.
func TestRefusalFloodCostsBoundedLines(t *testing.T) {
	const sources, span = 200, time.Minute
	refusals := 1_000_000
	if raceDetector {
		refusals = 100_000
	}
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	w, err := audit.Open(path, audit.Options{MaxBytes: 100 << 20, MaxBackups: 5, SeparateFlows: true,
		FlowsMaxBytes: 100 << 20, FlowsMaxBackups: 2, SampleFirst: 100, SampleEvery: 1000, SampleWindow: 10 * time.Minute,
		Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	dst := netip.MustParseAddrPort("10.0.0.1:29500")
	src := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(100 + i/250), byte(1 + i%250)}), uint16(30000+i))
	}
	step := span / time.Duration(refusals)
	start := now
	lastFlush := now
	for i := range refusals {
		s := src(i % sources)
		e := audit.AdmissionEvent(s, dst, audit.ActionDenied, "banned")
		e.Timestamp, e.FirstBytes, e.Probe = now, []byte("\x03\x00\x00\x0b\x06\xe0\x00\x00"), "rdp_x224"
		f := audit.Flow{Src: s, Dst: dst, Start: now, End: now, Verdict: audit.VerdictRefused, Reason: "banned",
			ClosedBy: audit.ClosedByGuard, Mode: audit.ModeEnforce}
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
		if err := w.Write(f.Event()); err != nil {
			t.Fatal(err)
		}
		now = now.Add(step)
		if now.Sub(lastFlush) >= time.Second { // serve flushes its writer every second
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			lastFlush = now
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	files, err := audit.RotatedFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	flows, _ := audit.RotatedFiles(audit.FlowsPath(path))
	var size int64
	z := NewSummarizer(Filter{})
	for _, f := range append(files, flows...) {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		size += st.Size()
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		for e, err := range audit.Events(r) {
			if err != nil {
				t.Fatal(err)
			}
			z.Add(e)
		}
		r.Close()
	}
	if size >= 10<<20 {
		t.Errorf("%d refusals from %d sources in %v wrote %d bytes, want under 10 MB", refusals, sources, span, size)
	}
	sum := z.Summary()
	var banned *ReasonStats
	for i := range sum.Denials {
		if sum.Denials[i].Key == "banned" {
			banned = &sum.Denials[i]
		}
	}
	if banned == nil || banned.Refusals() != uint64(refusals) || banned.Sources != sources {
		t.Fatalf("the report's banned refusals %+v, want %d from %d sources", banned, refusals, sources)
	}
	for _, s := range sum.Sources {
		if s.FirstSeen.Sub(start) > time.Second || now.Sub(s.LastSeen) > time.Second {
			t.Errorf("source %v first seen %v, last seen %v; its refusals ran from %v to %v", s.IP, s.FirstSeen, s.LastSeen,
				start, now)
		}
	}
	t.Logf("%d refusals from %d sources in %v: %d bytes of audit log", refusals, sources, span, size)
}
