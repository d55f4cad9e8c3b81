package bench

import (
	"math/bits"
	"sync"
	"time"
)

// Histogram counts durations in log-linear buckets: exact below 128 ns, then 64 buckets per power
// of two (at most 1.6 % relative error). Its memory is fixed whatever the number of samples.
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    uint64
	max    uint64
}

const (
	histSubBits = 6
	histSub     = 1 << histSubBits
	histMaxBits = 42 // ~73 minutes in ns; longer samples are clamped
	histBuckets = 2*histSub + (histMaxBits-histSubBits-1)*histSub
)

func histIndex(v uint64) int {
	if v < 2*histSub {
		return int(v)
	}
	s := bits.Len64(v) - histSubBits - 1 // v>>s is in [histSub, 2*histSub)
	if s > histMaxBits-histSubBits-1 {
		return histBuckets - 1
	}
	return 2*histSub + (s-1)*histSub + int(v>>s) - histSub
}

// histValue is the midpoint of bucket i.
func histValue(i int) uint64 {
	if i < 2*histSub {
		return uint64(i)
	}
	s := (i-2*histSub)/histSub + 1
	m := uint64((i-2*histSub)%histSub + histSub)
	return m<<s + (uint64(1)<<s)/2
}

// Record adds one sample.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[histIndex(v)]++
	h.n++
	h.sum += v
	h.max = max(h.max, v)
}

// Merge adds o's samples to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// Count is the number of samples.
func (h *Histogram) Count() uint64 { return h.n }

// Quantile returns the q-quantile (0 < q <= 1), or 0 without samples.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return time.Duration(min(histValue(i), h.max))
		}
	}
	return time.Duration(h.max)
}

// Mean is the average sample, or 0.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / h.n)
}

// Max is the largest sample.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// shardedHist spreads concurrent recorders over a few locked histograms, so that memory does not
// grow with the number of connections.
type shardedHist struct {
	shards [64]struct {
		mu sync.Mutex
		h  Histogram
		_  [64]byte
	}
}

func (s *shardedHist) record(worker int, d time.Duration) {
	sh := &s.shards[worker%len(s.shards)]
	sh.mu.Lock()
	sh.h.Record(d)
	sh.mu.Unlock()
}

func (s *shardedHist) merged() *Histogram {
	var h Histogram
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		h.Merge(&sh.h)
		sh.mu.Unlock()
	}
	return &h
}
