package audit

import (
	"net/netip"
	"testing"
	"time"
)

func scanFlow(src string, v Verdict, at time.Time, first []byte) *Flow {
	return &Flow{Src: netip.AddrPortFrom(netip.MustParseAddr(src), 40000), Dst: netip.MustParseAddrPort("10.0.0.1:29500"),
		Verdict: v, End: at, First: first}
}

// TestScanDetector: one notice as the threshold is crossed, none more in the window, a new one in
// the next; a job's silent connections and passed flows never count.
func TestScanDetector(t *testing.T) {
	d := NewScanDetector(ScanOptions{Threshold: 3, Window: time.Minute})
	rdp := []byte{3, 0, 0, 0x0b, 6, 0xe0, 0, 0, 0, 0, 0}
	var notices []Event
	observe := func(f *Flow, job bool) {
		if e, ok := d.Observe(f, job); ok {
			notices = append(notices, e)
		}
	}
	observe(scanFlow("192.0.2.1", VerdictEmpty, t0, nil), false)
	observe(scanFlow("192.0.2.1", VerdictPassed, t0.Add(time.Second), nil), false)
	observe(scanFlow("192.0.2.1", VerdictBlocked, t0.Add(2*time.Second), rdp), false)
	if len(notices) != 0 {
		t.Fatalf("notice after 2 suspicious flows: %+v", notices)
	}
	observe(scanFlow("192.0.2.1", VerdictRefused, t0.Add(3*time.Second), nil), false)
	if len(notices) != 1 {
		t.Fatalf("%d notices at the threshold", len(notices))
	}
	n := notices[0]
	if *n.ScanConnections != 3 || n.ScanVerdicts["empty"] != 1 || n.ScanVerdicts["blocked"] != 1 ||
		n.ScanVerdicts["refused"] != 1 || len(n.ScanProbes) != 1 || n.ScanProbes[0] != "rdp_x224" ||
		!n.Start.Equal(t0) || !n.Timestamp.Equal(t0.Add(3*time.Second)) || n.ScanPorts[0] != 29500 {
		t.Fatalf("notice %+v", n)
	}
	for i := range 10 {
		observe(scanFlow("192.0.2.1", VerdictEmpty, t0.Add(time.Duration(4+i)*time.Second), nil), false)
	}
	if len(notices) != 1 {
		t.Fatalf("%d notices within one window", len(notices))
	}
	for i := range 3 {
		observe(scanFlow("192.0.2.1", VerdictEmpty, t0.Add(time.Minute+time.Duration(i)*time.Second), nil), false)
	}
	if len(notices) != 2 {
		t.Fatalf("%d notices after the next window's threshold", len(notices))
	}

	// A job's source: its empty connections do not count, hostile bytes do.
	for i := range 5 {
		observe(scanFlow("192.0.2.2", VerdictEmpty, t0.Add(time.Duration(i)*time.Second), nil), true)
	}
	if len(notices) != 2 {
		t.Fatalf("notice for a job's silent connections")
	}
	// A flow with messages marks its source a job's for the window, whatever the caller knew.
	f := scanFlow("192.0.2.3", VerdictPassed, t0, nil)
	f.Messages = 4
	observe(f, false)
	for i := range 5 {
		observe(scanFlow("192.0.2.3", VerdictEmpty, t0.Add(time.Duration(1+i)*time.Second), nil), false)
	}
	if len(notices) != 2 {
		t.Fatalf("notice for the silent connections of a source that just served a job")
	}
}

// TestScanDetectorBounded: the table never holds more than MaxSources windows.
func TestScanDetectorBounded(t *testing.T) {
	d := NewScanDetector(ScanOptions{Threshold: 2, Window: time.Hour, MaxSources: 4})
	for i := range 100 {
		src := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}).String()
		d.Observe(scanFlow(src, VerdictEmpty, t0.Add(time.Duration(i)*time.Millisecond), nil), false)
	}
	if len(d.sources) > 4 || d.byStart.Len() > 4 {
		t.Fatalf("%d sources tracked, %d in order, want at most 4", len(d.sources), d.byStart.Len())
	}
	for i := range 100 {
		f := scanFlow(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).String(), VerdictPassed, t0, nil)
		f.Messages = 1
		d.Observe(f, false)
	}
	if len(d.jobs) > 4 {
		t.Fatalf("%d job sources remembered, want at most 4", len(d.jobs))
	}
}
