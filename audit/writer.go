package audit

import (
	"bytes"
	"compress/gzip"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxSources bounds the per-source sampling table.
const DefaultMaxSources = 65536

// DefaultSummaryEvery is how often a suppressing source's interim sampled_summary is written.
const DefaultSummaryEvery = time.Minute

// DefaultRefusalsFirst is Options.RefusalsFirst's default.
const DefaultRefusalsFirst = 10

// maxKindsPerWindow bounds the kinds (sampleKind) a window remembers, as 4-byte hashes: a
// source's window holds at most 256 B of them, whatever a scan varies.
const maxKindsPerWindow = 64

// ErrClosed is returned by Write after Close.
var ErrClosed = errors.New("audit: writer closed")

// Options configure a Writer. The zero value writes every event to one
// file that never rotates.
type Options struct {
	MaxBytes   int64 // rotate before a line would take the file past this; 0 = never
	MaxBackups int   // rotated files kept as path.1 … path.N; 0 = none kept
	Compress   bool  // gzip rotated files to path.N.gz

	// SeparateFlows makes Open write the flow records of connections that passed or are still
	// open (passedFlow: a job's own accounting, never sampled) to a file set of their own,
	// FlowsPath(path), rotated at FlowsMaxBytes with FlowsMaxBackups kept (as MaxBytes and
	// MaxBackups), created at its first record. Every valid connection writes one, from any
	// number of sources, so in one set they would rotate the security events out (500 one-message
	// connections erased a probe's blocked event from 256 KiB and 1 backup); apart, no number of
	// them can. New ignores it: its writer gets every event.
	SeparateFlows   bool
	FlowsMaxBytes   int64
	FlowsMaxBackups int

	// Per source IP, the first SampleFirst events of a SampleWindow are
	// written, then one in SampleEvery (0: none). SampleWindow 0 disables
	// sampling. Never sampled away: the first event of each action and reason (each
	// verdict, for flows) of a source in a window, so the first blocked message of every kind
	// is always there in full; banned events and scan notices (rare by design); flows that
	// passed or are open (a job's own accounting).
	SampleFirst  int
	SampleEvery  int
	SampleWindow time.Duration
	// RefusalsFirst: of a source's refusals (denied events and refused connections' flow records:
	// a banned or denied source, a handshake that failed), the first RefusalsFirst of a window are
	// written, besides the first of each kind; the rest only counted, in the sampled_summary
	// written each SummaryEvery (exact counts, first and last seen), never one in SampleEvery: a
	// refusal flood costs a bounded number of lines per source a minute, whatever its rate.
	// 0 = DefaultRefusalsFirst.
	RefusalsFirst int
	MaxSources    int // sampling table cap; 0 = DefaultMaxSources
	// SummaryEvery: while a source's window suppresses events, a sampled_summary of what it
	// suppressed so far is written at most this often (by Flush), not only at the window's end.
	// 0 = DefaultSummaryEvery.
	SummaryEvery time.Duration

	// Observer fills observer.* and host.* of every event (Classify); nil leaves them out.
	Observer *Observer

	// Clock drives timestamps and sampling windows; replay passes capture
	// time. Nil means time.Now.
	Clock func() time.Time
}

// Stats are exact counts since the Writer was created.
type Stats struct {
	Written        uint64 // lines written, sampled_summary events included
	Suppressed     uint64 // events sampled away
	Errors         uint64 // failed writes, rotations or closes
	Evicted        uint64 // sampling windows cut short because the table was full
	Rotations      uint64 // of path's file set
	FlowsRotations uint64 // of FlowsPath(path)'s (Options.SeparateFlows)
}

// Writer writes events as JSON Lines. It is safe for concurrent use.
type Writer struct {
	opts   Options
	events *fileSet // nil when writing to an io.Writer (New): no rotation then
	flows  *fileSet // passed and open flow records (Options.SeparateFlows); nil: in events

	mu      sync.Mutex
	out     io.Writer // New's writer
	closed  bool
	buf     bytes.Buffer
	enc     *json.Encoder // into buf
	stats   Stats
	sources map[netip.Addr]*window
	byStart *list.List // of *window, oldest start first
}

// window is one source's current sampling window.
type window struct {
	src        netip.Addr
	start      time.Time
	seen       uint64
	refusals   uint64    // of seen, refusals (refusal)
	suppressed uint64    // since the last sampled_summary
	first      time.Time // the first and last event suppressed since the last sampled_summary
	last       time.Time
	by         map[string]uint64 // suppressed by kind, since the last sampled_summary
	kinds      []uint32          // hashes of the kinds seen (sampleKind), at most maxKindsPerWindow
	summarized time.Time         // the last sampled_summary, or start
	elem       *list.Element
}

// fileSet is a file and its rotated backups: path, path.1 … path.N (.gz when compressed).
type fileSet struct {
	path       string
	maxBytes   int64 // 0 = never rotate
	maxBackups int
	compress   bool
	file       *os.File // nil before the first line of a set opened lazily, or after a failed rotation
	size       int64
	rotations  atomic.Uint64 // read by metrics without the Writer's lock, which a stalled disk may hold
}

// FlowsPath is the file set that passed and open flow records go to (Options.SeparateFlows)
// next to the audit log at path: path.flows, path.flows.1 … (a name RotatedFiles(path) does not
// take for one of path's own backups).
func FlowsPath(path string) string { return path + ".flows" }

// Open appends to the file at path, creating it if needed.
func Open(path string, opts Options) (*Writer, error) {
	f, size, err := openAppend(path)
	if err != nil {
		return nil, err
	}
	w := newWriter(nil, opts)
	w.events = &fileSet{path: path, maxBytes: opts.MaxBytes, maxBackups: opts.MaxBackups, compress: opts.Compress,
		file: f, size: size}
	if opts.SeparateFlows {
		w.flows = &fileSet{path: FlowsPath(path), maxBytes: opts.FlowsMaxBytes, maxBackups: opts.FlowsMaxBackups,
			compress: opts.Compress}
	}
	return w, nil
}

// New writes to out, which the caller owns; it never rotates.
func New(out io.Writer, opts Options) *Writer {
	return newWriter(out, opts)
}

func newWriter(out io.Writer, opts Options) *Writer {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.MaxSources <= 0 {
		opts.MaxSources = DefaultMaxSources
	}
	if opts.SummaryEvery <= 0 {
		opts.SummaryEvery = DefaultSummaryEvery
	}
	if opts.RefusalsFirst <= 0 {
		opts.RefusalsFirst = DefaultRefusalsFirst
	}
	w := &Writer{
		opts:    opts,
		out:     out,
		sources: make(map[netip.Addr]*window),
		byStart: list.New(),
	}
	w.enc = json.NewEncoder(&w.buf)
	w.enc.SetEscapeHTML(false)
	return w
}

func openAppend(path string) (*os.File, int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// Write records e unless sampling suppresses it. It fills Timestamp, ID,
// and clips FirstBytes. A returned error has also been counted in Stats.
func (w *Writer) Write(e Event) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	now := w.opts.Clock()
	if e.Timestamp.IsZero() {
		e.Timestamp = now
	}
	e.SourceIP, e.DestIP = e.SourceIP.Unmap(), e.DestIP.Unmap()
	if len(e.FirstBytes) > MaxFirstBytes {
		e.FirstBytes = e.FirstBytes[:MaxFirstBytes]
	}
	Classify(&e, w.opts.Observer)

	err := w.expire(now, false)
	write, admitErr := w.admit(e, now)
	err = errors.Join(err, admitErr)
	if write {
		err = errors.Join(err, w.writeLocked(e))
	}
	return err
}

// admit applies per-source sampling. The error is from writing the
// summaries of windows it ends on the way.
func (w *Writer) admit(e Event, now time.Time) (bool, error) {
	if w.opts.SampleWindow <= 0 || neverSampled(&e) {
		return true, nil
	}
	var err error
	win := w.sources[e.SourceIP]
	if win != nil && w.ended(win, now) {
		err = w.endWindow(win)
		win = nil
	}
	if win == nil {
		if len(w.sources) >= w.opts.MaxSources {
			w.stats.Evicted++
			err = errors.Join(err, w.endWindow(w.byStart.Front().Value.(*window)))
		}
		win = &window{src: e.SourceIP, start: now, summarized: now}
		win.elem = w.byStart.PushBack(win)
		w.sources[e.SourceIP] = win
	}
	win.seen++
	isRefusal := refusal(&e)
	if isRefusal {
		win.refusals++
	}
	kind := sampleKind(&e)
	if h := kindHash(kind); !slices.Contains(win.kinds, h) && len(win.kinds) < maxKindsPerWindow {
		win.kinds = append(win.kinds, h)
		return true, err
	}
	first, every := uint64(w.opts.SampleFirst), uint64(w.opts.SampleEvery)
	if isRefusal {
		if win.refusals <= uint64(w.opts.RefusalsFirst) && win.seen <= first {
			return true, err
		}
	} else if win.seen <= first || every > 0 && (win.seen-first)%every == 0 {
		return true, err
	}
	if win.suppressed == 0 {
		win.first = now
	}
	win.last = now
	win.suppressed++
	if win.by == nil {
		win.by = make(map[string]uint64)
	}
	if _, ok := win.by[kind]; !ok && len(win.by) >= maxKindsPerWindow {
		kind = "other" // the counts stay exact, the kinds bounded
	}
	win.by[kind]++
	w.stats.Suppressed++
	return false, err
}

// refusal reports whether e is a refusal (Options.RefusalsFirst): a denied event, or the flow
// record of a connection refused.
func refusal(e *Event) bool {
	return e.Action == ActionDenied || e.Action == ActionFlow && e.Verdict == VerdictRefused
}

// neverSampled: events sampling always lets through (Options).
func neverSampled(e *Event) bool {
	switch e.Action {
	case ActionBanned, ActionScan, ActionSampledSummary, ActionDroppedSummary, ActionHandover:
		return true
	}
	return passedFlow(e)
}

// passedFlow reports whether e is the flow record of a connection that passed, or of one still
// open (an interim record): a job's own accounting rather than evidence of an attack.
func passedFlow(e *Event) bool {
	return e.Action == ActionFlow && (e.Verdict == VerdictPassed || e.Verdict == VerdictOpen)
}

// sampleKind is what an event is of, for sampling and sampled_summary's storeguard.suppressed_by:
// "blocked/key_too_long", "flow/empty", and the probe named, if any ("blocked/key_too_long/rdp_x224"),
// so that every probe of a service scan is written once. Probe names are a fixed set (probename).
func sampleKind(e *Event) string {
	k := string(e.Action) + "/" + e.Reason
	if e.Action == ActionFlow {
		k = string(e.Action) + "/" + string(e.Verdict)
	}
	if e.Probe != "" {
		k += "/" + e.Probe
	}
	return k
}

// kindHash is the 32-bit FNV-1a hash of a kind: two kinds that collide share their first event.
func kindHash(kind string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(kind); i++ {
		h = (h ^ uint32(kind[i])) * 16777619
	}
	return h
}

func (w *Writer) ended(win *window, now time.Time) bool {
	return !now.Before(win.start.Add(w.opts.SampleWindow))
}

// expire ends windows from the oldest on: those past their end, or all of
// them when all is set.
func (w *Writer) expire(now time.Time, all bool) error {
	var err error
	for e := w.byStart.Front(); e != nil; e = w.byStart.Front() {
		win := e.Value.(*window)
		if !all && !w.ended(win, now) {
			break
		}
		err = errors.Join(err, w.endWindow(win))
	}
	return err
}

// summarizeDue writes the interim sampled_summary of every window that suppressed events and
// last had one SummaryEvery ago or more.
func (w *Writer) summarizeDue(now time.Time) error {
	var err error
	for e := w.byStart.Front(); e != nil; e = e.Next() {
		if win := e.Value.(*window); win.suppressed > 0 && now.Sub(win.summarized) >= w.opts.SummaryEvery {
			err = errors.Join(err, w.summarize(win, now))
		}
	}
	return err
}

// endWindow forgets win and writes its sampled_summary if it suppressed anything.
func (w *Writer) endWindow(win *window) error {
	w.byStart.Remove(win.elem)
	delete(w.sources, win.src)
	if win.suppressed == 0 {
		return nil
	}
	return w.summarize(win, w.opts.Clock())
}

// summarize writes what win suppressed since its last sampled_summary, and starts counting anew.
func (w *Writer) summarize(win *window, now time.Time) error {
	e := Event{
		Timestamp:    now,
		Action:       ActionSampledSummary,
		SourceIP:     win.src,
		Suppressed:   win.suppressed,
		SuppressedBy: win.by,
		Start:        win.first,
		End:          win.last,
	}
	win.suppressed, win.by, win.summarized = 0, nil, now
	Classify(&e, w.opts.Observer)
	return w.writeLocked(e)
}

func (w *Writer) writeLocked(e Event) error {
	if e.ID == "" {
		e.ID = newEventID()
	}
	w.buf.Reset()
	if err := w.enc.Encode(e); err != nil { // Encode appends the newline
		w.stats.Errors++
		return fmt.Errorf("audit: encode event: %w", err)
	}
	out, set := w.out, w.setFor(&e)
	var rotErr error
	if set != nil {
		rotErr = set.rotateIfNeeded(int64(w.buf.Len()))
		if rotErr != nil {
			w.stats.Errors++
			if set.file == nil {
				return rotErr
			}
			// The rotation failed but a file is open: keep the line rather than lose it.
		}
		out = set.file
	}
	n, err := out.Write(w.buf.Bytes())
	if set != nil {
		set.size += int64(n)
	}
	if err != nil {
		w.stats.Errors++
		return errors.Join(rotErr, fmt.Errorf("audit: write: %w", err))
	}
	w.stats.Written++
	return rotErr
}

// setFor is the file set e goes to; nil when writing to New's writer.
func (w *Writer) setFor(e *Event) *fileSet {
	if w.flows != nil && passedFlow(e) {
		return w.flows
	}
	return w.events
}

// rotateIfNeeded opens the file if it is not (a lazy set's first line, or after a failed
// rotation), and rotates it if a line of next bytes would take it past maxBytes.
func (s *fileSet) rotateIfNeeded(next int64) error {
	if s.file == nil {
		f, size, err := openAppend(s.path)
		if err != nil {
			return fmt.Errorf("audit: open: %w", err)
		}
		s.file, s.size = f, size
	}
	if s.maxBytes <= 0 || s.size == 0 || s.size+next <= s.maxBytes {
		return nil
	}
	err := s.file.Close()
	s.file = nil
	err = errors.Join(err, shiftBackups(s.path, s.maxBackups, s.compress))
	f, size, openErr := openAppend(s.path)
	if openErr != nil {
		return fmt.Errorf("audit: rotate: %w", errors.Join(err, openErr))
	}
	s.file, s.size = f, size
	s.rotations.Add(1)
	if err != nil {
		return fmt.Errorf("audit: rotate: %w", err)
	}
	return nil
}

// close closes the file, if open.
func (s *fileSet) close() error {
	if s == nil || s.file == nil {
		return nil
	}
	err := s.file.Close()
	s.file = nil
	return err
}

// shiftBackups renames path.i[.gz] to path.i+1[.gz], drops the oldest and
// moves path to path.1, gzipping it if asked.
func shiftBackups(path string, keep int, compress bool) error {
	if keep <= 0 {
		return os.Remove(path)
	}
	var errs []error
	for _, ext := range []string{"", ".gz"} {
		errs = append(errs, removeIfExists(backupName(path, keep)+ext))
		for i := keep - 1; i >= 1; i-- {
			errs = append(errs, renameIfExists(backupName(path, i)+ext, backupName(path, i+1)+ext))
		}
	}
	first := backupName(path, 1)
	if err := os.Rename(path, first); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if compress {
		errs = append(errs, gzipFile(first))
	}
	return errors.Join(errs...)
}

func backupName(path string, i int) string { return fmt.Sprintf("%s.%d", path, i) }

func removeIfExists(name string) error {
	if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func renameIfExists(from, to string) error {
	if err := os.Rename(from, to); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// gzipFile replaces name by name.gz. It writes a temporary file first so a
// crash never leaves a truncated .gz next to a removed original.
func gzipFile(name string) (err error) {
	src, err := os.Open(name)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := name + ".gz.tmp"
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			dst.Close()
			os.Remove(tmp)
		}
	}()
	zw := gzip.NewWriter(dst)
	if _, err = io.Copy(zw, src); err != nil {
		return err
	}
	if err = zw.Close(); err != nil {
		return err
	}
	if err = dst.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, name+".gz"); err != nil {
		return err
	}
	return os.Remove(name)
}

// Flush writes the sampled_summary of every window that has ended, and the interim one of every
// window due one (Options.SummaryEvery).
// Call it periodically (see FlushEvery) so a source that went quiet still
// gets its summary.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	now := w.opts.Clock()
	return errors.Join(w.expire(now, false), w.summarizeDue(now))
}

// FlushEvery calls Flush every d until ctx is done. Run it as a goroutine.
func (w *Writer) FlushEvery(ctx context.Context, d time.Duration) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Flush() // errors are counted in Stats
		}
	}
}

// Close writes the summaries of all open windows, cut short, and closes the
// file if Open created it.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	err := w.expire(w.opts.Clock(), true)
	w.closed = true
	for _, set := range []*fileSet{w.events, w.flows} {
		if cerr := set.close(); cerr != nil {
			w.stats.Errors++
			err = errors.Join(err, cerr)
		}
	}
	return err
}

// Lost is how many events could not be written (Stats.Errors). It waits for a write in progress.
func (w *Writer) Lost() uint64 { return w.Stats().Errors }

// Stats returns the counters.
func (w *Writer) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.stats
	st.Rotations, st.FlowsRotations = w.Rotations()
	return st
}

// Rotations is how many times the audit log's file set and the flows' (Options.SeparateFlows)
// rotated. It never waits for the writer (metrics read it while the sink may be stalled).
func (w *Writer) Rotations() (events, flows uint64) {
	if w.events != nil {
		events = w.events.rotations.Load()
	}
	if w.flows != nil {
		flows = w.flows.rotations.Load()
	}
	return events, flows
}
