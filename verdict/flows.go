package verdict

import (
	"sync"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
)

// Flows is where flow records go: to the audit log as flows selects them, and, once a flow ended,
// to the scan detector (scan.*). It is safe for concurrent use.
type Flows struct {
	write      func(audit.Event)
	maxSources int // the detector's (audit.ScanOptions.MaxSources)

	mu   sync.Mutex // guards scan and opts
	scan *audit.ScanDetector
	opts config.Scan // what scan was made with
}

// NewFlows writes flow records with write; the scan detector counts at most maxSources sources at
// once (0: audit's default).
func NewFlows(write func(audit.Event), maxSources int) *Flows {
	return &Flows{write: write, maxSources: maxSources}
}

// Write writes f as cfg.Flows selects it and feeds an ended one (not open) to the scan detector,
// made anew whenever cfg.Scan changes; sources says whether f's source serves a job. It returns
// the detector's notice, for the caller to write.
func (fl *Flows) Write(f *audit.Flow, cfg *config.Config, sources *Sources) (notice audit.Event, ok bool) {
	switch {
	case cfg.Flows == config.FlowsOff:
	case cfg.Flows == config.FlowsSuspicious && (f.Verdict == audit.VerdictPassed || f.Verdict == audit.VerdictOpen):
	default:
		fl.write(f.Event())
	}
	if f.Verdict == audit.VerdictOpen {
		return audit.Event{}, false // not over: the detector counts what ended
	}
	// A job's source: torch <= 2.0's silent second connection is no probe; the detector
	// remembers jobs whose connections closed.
	job := sources.Serving(f.Src.Addr())
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.scan == nil || fl.opts != cfg.Scan {
		fl.opts = cfg.Scan
		fl.scan = audit.NewScanDetector(audit.ScanOptions{Threshold: cfg.Scan.Threshold, Window: cfg.Scan.Window,
			MaxSources: fl.maxSources})
	}
	return fl.scan.Observe(f, job)
}
