package report

import (
	"net/netip"
	"time"
)

// TimelineColumns is the most buckets a Timeline has: the bucket is the shortest step of
// timeSteps that fits the span into as many.
const TimelineColumns = 60

// Timeline is activity over time in equal buckets (UTC, aligned to multiples of the bucket since
// the Unix epoch): written events by @timestamp, and connections (flow records) by event.start.
type Timeline struct {
	Start         time.Time        `json:"start,omitzero"` // of the first bucket
	End           time.Time        `json:"end,omitzero"`   // of the last bucket
	BucketSeconds int64            `json:"bucket_seconds"` // 0 when there is nothing to show
	Events        []uint64         `json:"events"`         // every source's, per bucket
	Connections   []uint64         `json:"connections"`
	Sources       []SourceTimeline `json:"sources"` // the listed sources (at most MaxTimelineSources), in their order
}

// SourceTimeline is one source's row of a Timeline.
type SourceTimeline struct {
	IP          netip.Addr `json:"ip"`
	Identity    string     `json:"identity,omitempty"`
	Events      []uint64   `json:"events"`
	Connections []uint64   `json:"connections"`
}

const (
	seriesEvents = iota
	seriesConnections
)

// timeSteps are the bucket sizes, in seconds; each divides the next, so that counts kept at one
// step add up exactly into any later one.
var timeSteps = []int64{1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400}

// maxFineBuckets bounds the buckets kept while reading: the step grows as the span does.
const maxFineBuckets = 4096

// timeline keeps counts per bucket of timeSteps[step], for all sources and for each.
type timeline struct {
	step     int
	min, max int64 // Unix seconds of the earliest and latest point; min > max while empty
	all      map[int64]*[2]uint64
	rows     map[sourceKey]map[int64]*[2]uint64
}

func newTimeline() timeline {
	return timeline{min: 1, max: 0, all: make(map[int64]*[2]uint64), rows: make(map[sourceKey]map[int64]*[2]uint64)}
}

// add counts d (1, or minusOne to take one back) in series at t.
func (tl *timeline) add(ip sourceKey, t time.Time, series int, d uint64) {
	sec := t.Unix()
	if tl.min > tl.max {
		tl.min, tl.max = sec, sec
	}
	tl.min, tl.max = min(tl.min, sec), max(tl.max, sec)
	for (tl.max-tl.min)/timeSteps[tl.step] > maxFineBuckets && tl.step < len(timeSteps)-1 {
		tl.coarsen()
	}
	k := floorDiv(sec, timeSteps[tl.step])
	bump(tl.all, k, series, d)
	row := tl.rows[ip]
	if row == nil {
		row = make(map[int64]*[2]uint64)
		tl.rows[ip] = row
	}
	bump(row, k, series, d)
}

func bump(m map[int64]*[2]uint64, k int64, series int, d uint64) {
	c := m[k]
	if c == nil {
		c = new([2]uint64)
		m[k] = c
	}
	c[series] += d
}

// coarsen moves every count to the next step.
func (tl *timeline) coarsen() {
	from, to := timeSteps[tl.step], timeSteps[tl.step+1]
	tl.step++
	tl.all = rebucket(tl.all, from, to)
	for ip, row := range tl.rows {
		tl.rows[ip] = rebucket(row, from, to)
	}
}

func rebucket(m map[int64]*[2]uint64, from, to int64) map[int64]*[2]uint64 {
	out := make(map[int64]*[2]uint64, len(m))
	for k, c := range m {
		nk := floorDiv(k*from, to)
		for series, n := range c {
			bump(out, nk, series, n)
		}
	}
	return out
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// summary lays the counts out in at most TimelineColumns buckets, for all sources and for listed.
func (tl *timeline) summary(listed []SourceStats) Timeline {
	out := Timeline{Events: []uint64{}, Connections: []uint64{}, Sources: []SourceTimeline{}}
	if tl.min > tl.max {
		return out
	}
	step := tl.step
	for step < len(timeSteps)-1 && floorDiv(tl.max, timeSteps[step])-floorDiv(tl.min, timeSteps[step])+1 > TimelineColumns {
		step++
	}
	size := timeSteps[step]
	first := floorDiv(tl.min, size)
	n := floorDiv(tl.max, size) - first + 1
	out.Start, out.End, out.BucketSeconds = time.Unix(first*size, 0).UTC(), time.Unix((first+n)*size, 0).UTC(), size
	lay := func(m map[int64]*[2]uint64) (events, conns []uint64) {
		events, conns = make([]uint64, n), make([]uint64, n)
		fine := timeSteps[tl.step]
		for k, c := range m {
			i := floorDiv(k*fine, size) - first
			events[i] += c[seriesEvents]
			conns[i] += c[seriesConnections]
		}
		return events, conns
	}
	out.Events, out.Connections = lay(tl.all)
	for _, st := range listed {
		ev, cn := lay(tl.rows[st.key()])
		out.Sources = append(out.Sources, SourceTimeline{IP: st.IP, Identity: st.Identity, Events: ev, Connections: cn})
	}
	return out
}
