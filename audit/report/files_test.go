package report

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
)

// TestSeparateFlows: passed and interim flow records go to audit.FlowsPath, every other event stays in
// the audit log, and storeguard audit (ExpandFiles, then Summarize) reads both: a connection whose
// interim record is in the one and whose blocked record is in the other counts once, as blocked.
func TestSeparateFlows(t *testing.T) {
	t0 := at("12:00")
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	w, err := audit.Open(path, audit.Options{SeparateFlows: true, Clock: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(audit.FlowsPath(path)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the flows' file exists before a flow passed (%v)", err)
	}
	job, scanner := netip.AddrPortFrom(ip("192.0.2.7"), 40001), netip.AddrPortFrom(ip("198.51.100.9"), 40002)
	store := netip.MustParseAddrPort("10.0.0.1:29500")
	long := audit.Flow{ConnID: 2, Src: scanner, Dst: store, Start: t0, Verdict: audit.VerdictOpen, FromClient: 30, ToStore: 30, Messages: 1}
	for _, e := range []audit.Event{
		(&audit.Flow{ConnID: 1, Src: job, Dst: store, Start: t0, End: t0, Verdict: audit.VerdictPassed, Messages: 3}).Event(),
		long.Event(),
		{Action: audit.ActionBlocked, Reason: "unknown_opcode", SourceIP: scanner.Addr(), SourcePort: scanner.Port(), ConnID: 2},
		(&audit.Flow{ConnID: 2, Src: scanner, Dst: store, Start: t0, End: t0.Add(time.Hour), Verdict: audit.VerdictBlocked,
			Reason: "unknown_opcode", FromClient: 40, ToStore: 30, Messages: 1}).Event(),
		(&audit.Flow{ConnID: 3, Src: scanner, Dst: store, Start: t0, End: t0, Verdict: audit.VerdictEmpty}).Event(),
		{Action: audit.ActionScan, SourceIP: scanner.Addr()},
	} {
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	kinds := func(path string) []string { // each event's action/verdict
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var out []string
		for e, err := range audit.Events(f) {
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			out = append(out, string(e.Action)+"/"+string(e.Verdict))
		}
		return out
	}
	if got, want := kinds(path), []string{"blocked/", "flow/blocked", "flow/empty", "scan_detected/"}; !slices.Equal(got, want) {
		t.Errorf("audit log %q, want %q", got, want)
	}
	if got, want := kinds(audit.FlowsPath(path)), []string{"flow/passed", "flow/open"}; !slices.Equal(got, want) {
		t.Errorf("flows %q, want %q", got, want)
	}

	files, err := ExpandFiles([]string{path}, true, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(files, []string{audit.FlowsPath(path), path}) {
		t.Fatalf("files %q, want the flows first, then the audit log", files)
	}
	s, err := Summarize(files, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []ConnCount{{"blocked", 1, 0, 1}, {"empty", 1, 0, 1}, {"passed", 1, 0, 1}}
	if s.Connections != 3 || !slices.Equal(s.ByVerdict, want) || s.JobSources != 1 || s.HostileSources != 1 {
		t.Errorf("connections %d by verdict %v, %d job and %d hostile sources; want 3 %v, 1 and 1",
			s.Connections, s.ByVerdict, s.JobSources, s.HostileSources, want)
	}
	if files, _ := ExpandFiles([]string{path}, true, false); !slices.Equal(files, []string{path}) {
		t.Errorf("without flows: %q", files)
	}
}
