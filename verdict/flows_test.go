package verdict

import (
	"net/netip"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
)

func TestFlowsFilter(t *testing.T) {
	src := netip.MustParseAddrPort("10.0.0.1:5000")
	for _, tc := range []struct {
		flows   config.Flows
		verdict audit.Verdict
		written bool
	}{
		{config.FlowsAll, audit.VerdictPassed, true},
		{config.FlowsAll, audit.VerdictOpen, true},
		{config.FlowsSuspicious, audit.VerdictPassed, false},
		{config.FlowsSuspicious, audit.VerdictOpen, false},
		{config.FlowsSuspicious, audit.VerdictEmpty, true},
		{config.FlowsSuspicious, audit.VerdictRefused, true},
		{config.FlowsOff, audit.VerdictBlocked, false},
	} {
		var got []audit.Event
		fl := NewFlows(func(e audit.Event) { got = append(got, e) }, 0)
		cfg := config.Config{Flows: tc.flows}
		fl.Write(&audit.Flow{Src: src, Verdict: tc.verdict}, &cfg, NewSources(nil, nil))
		if written := len(got) == 1; written != tc.written {
			t.Errorf("flows %s, verdict %s: written %v", tc.flows, tc.verdict, written)
		}
	}
}

// The detector counts ended flows only, not a job's empty ones, and starts anew when scan.*
// changes.
func TestFlowsScan(t *testing.T) {
	src := netip.MustParseAddrPort("10.0.0.1:5000")
	fl := NewFlows(func(audit.Event) {}, 0)
	sources := NewSources(nil, nil)
	cfg := config.Config{Flows: config.FlowsOff, Scan: config.Scan{Threshold: 3, Window: time.Minute}}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	write := func(v audit.Verdict) bool {
		at = at.Add(time.Second)
		_, ok := fl.Write(&audit.Flow{Src: src, Start: at, End: at, Verdict: v}, &cfg, sources)
		return ok
	}
	for range 5 {
		if write(audit.VerdictOpen) {
			t.Fatal("an open flow counted")
		}
	}
	sources.Talk(src.Addr())
	for range 5 {
		if write(audit.VerdictEmpty) {
			t.Fatal("a job's empty flows made a scan")
		}
	}
	sources.Untalk(src.Addr())
	cfg.Scan.Threshold = 2 // a new detector: what the old one knew of the job goes with it
	if write(audit.VerdictEmpty) || !write(audit.VerdictEmpty) {
		t.Error("no notice at the new threshold")
	}
}
