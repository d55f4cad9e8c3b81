package audit

import (
	"container/list"
	"net/netip"
	"slices"
	"time"

	"github.com/storeguard/storeguard/probename"
)

// Scan notices: a source whose connections send nothing or only invalid bytes (flows empty,
// truncated, blocked, would_block, refused, or, in replay, half_open: a SYN scan) is scanning,
// the way Zeek's scan policy counts failed connections. One notice (ActionScan) as soon as a
// source crosses the threshold within a window, then none until the window ends; serve and
// replay feed it every flow record.

// ScanOptions configure a ScanDetector. Threshold 0 turns detection off.
type ScanOptions struct {
	Threshold  int           // suspicious connections of one source within Window that make a scan
	Window     time.Duration // counted from the source's first suspicious connection
	MaxSources int           // sources tracked at once; the oldest window is dropped beyond it
}

// Bounds of what one notice lists.
const (
	maxScanPorts  = 16
	maxScanProbes = 16
)

// ScanDetector counts suspicious flows per source. It is not safe for concurrent use.
type ScanDetector struct {
	opts    ScanOptions
	sources map[netip.Addr]*scanWindow
	byStart *list.List // of *scanWindow, oldest first
	jobs    map[netip.Addr]time.Time
}

type scanWindow struct {
	src      netip.Addr
	start    time.Time
	count    uint64
	noticed  bool
	ports    []uint16
	probes   []string
	verdicts map[string]uint64
	elem     *list.Element
}

func NewScanDetector(o ScanOptions) *ScanDetector {
	if o.MaxSources <= 0 {
		o.MaxSources = DefaultMaxSources
	}
	return &ScanDetector{opts: o, sources: make(map[netip.Addr]*scanWindow), byStart: list.New(),
		jobs: make(map[netip.Addr]time.Time)}
}

// Suspicious reports whether a flow with verdict v counts towards a scan.
func Suspicious(v Verdict) bool {
	switch v {
	case VerdictEmpty, VerdictTruncated, VerdictBlocked, VerdictWouldBlock, VerdictRefused, VerdictHalfOpen:
		return true
	}
	return false
}

// Observe counts f, which ended at f.End, and returns the notice when it makes its source cross
// the threshold. job: the source serves a job (it had a connection that completed a valid
// message). A job's empty connections do not count (torch ≤ 2.0 opens a silent one per client),
// nor do its refused ones (a cap reached by a big job); a flow that carried valid messages marks
// its source a job's for a window too.
func (d *ScanDetector) Observe(f *Flow, job bool) (Event, bool) {
	if d.opts.Threshold <= 0 {
		return Event{}, false
	}
	src := f.Src.Addr().Unmap()
	now := f.End
	d.expire(now)
	if f.Messages > 0 {
		job = true
		if _, ok := d.jobs[src]; !ok && len(d.jobs) >= d.opts.MaxSources {
			clear(d.jobs) // forgetting a job source makes its silent connections count again: no more
		}
		d.jobs[src] = now
	} else if t, ok := d.jobs[src]; ok {
		if now.Sub(t) < d.opts.Window {
			job = true
		} else {
			delete(d.jobs, src)
		}
	}
	if !Suspicious(f.Verdict) || job && (f.Verdict == VerdictEmpty || f.Verdict == VerdictRefused) {
		return Event{}, false
	}
	w := d.sources[src]
	if w == nil {
		if len(d.sources) >= d.opts.MaxSources {
			d.drop(d.byStart.Front().Value.(*scanWindow))
		}
		w = &scanWindow{src: src, start: now, verdicts: make(map[string]uint64)}
		w.elem = d.byStart.PushBack(w)
		d.sources[src] = w
	}
	w.count++
	w.verdicts[string(f.Verdict)]++
	if p := f.Dst.Port(); !slices.Contains(w.ports, p) && len(w.ports) < maxScanPorts {
		w.ports = append(w.ports, p)
	}
	if len(f.First) > 0 {
		if p := probename.Name(f.First[:min(len(f.First), MaxFirstBytes)]); p != "" && !slices.Contains(w.probes, p) &&
			len(w.probes) < maxScanProbes {
			w.probes = append(w.probes, p)
		}
	}
	if w.noticed || w.count < uint64(d.opts.Threshold) {
		return Event{}, false
	}
	w.noticed = true
	e := Event{
		Timestamp: now, Action: ActionScan, Reason: "scan", Mode: f.Mode,
		SourceIP: src, DestIP: f.Dst.Addr(), DestPort: f.Dst.Port(),
		Start:           w.start,
		ScanConnections: new(w.count),
		ScanPorts:       slices.Clone(w.ports),
		ScanProbes:      slices.Clone(w.probes),
		ScanVerdicts:    make(map[string]uint64, len(w.verdicts)),
	}
	for k, v := range w.verdicts {
		e.ScanVerdicts[k] = v
	}
	slices.Sort(e.ScanPorts)
	slices.Sort(e.ScanProbes)
	return e, true
}

// expire drops the windows that ended by now.
func (d *ScanDetector) expire(now time.Time) {
	for e := d.byStart.Front(); e != nil; e = d.byStart.Front() {
		w := e.Value.(*scanWindow)
		if now.Sub(w.start) < d.opts.Window {
			return
		}
		d.drop(w)
	}
}

func (d *ScanDetector) drop(w *scanWindow) {
	d.byStart.Remove(w.elem)
	delete(d.sources, w.src)
}
