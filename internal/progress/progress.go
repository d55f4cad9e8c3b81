// Package progress shows how far a long read has come, on one line of a terminal: "reading
// audit.log.3.gz: 45% (123 MB of 270 MB), 1.2M events". It writes nothing to anything but a
// terminal, so that a pipe or a log file never gets the carriage returns.
package progress

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"
)

// Interval is the least time between two updates of the line.
const Interval = 200 * time.Millisecond

// Printer rewrites one line of w with the progress of a read. It is safe for concurrent use.
type Printer struct {
	mu      sync.Mutex
	w       io.Writer
	on      bool
	now     func() time.Time
	label   string
	total   int64 // bytes; 0 when not known
	done    int64
	items   int64
	noun    string
	last    time.Time // of the last update, or of the start: a read shorter than Interval shows nothing
	printed bool      // the line holds an update to clear
}

// New returns a Printer of a read of total bytes to w, on only when w is a terminal.
func New(w io.Writer, total int64) *Printer {
	p := &Printer{w: w, on: isTerminalWriter(w), now: time.Now, total: total, label: "reading", noun: "events"}
	p.last = p.now()
	return p
}

// SetTerminal overrides what New found out about w: tests, and a flag that forces progress on or off.
func (p *Printer) SetTerminal(on bool) *Printer {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on = on
	return p
}

// Start begins a new part of the read (a file): label is shown first ("reading audit.log.2.gz"),
// total is its size in bytes (0: not known). The bytes done start again from 0; the items go on.
func (p *Printer) Start(label string, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.label, p.total, p.done = label, total, 0
}

// Add counts n more bytes read, and updates the line if Interval has passed since the last update.
func (p *Printer) Add(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	p.maybePrint()
}

// Items sets how many items (events, packets: noun) the read has yielded so far.
func (p *Printer) Items(n int64, noun string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.items, p.noun = n, noun
}

// StartFile begins the part of the read that is f (label as for Start; its size when f is a
// regular file) and returns f counted.
func (p *Printer) StartFile(label string, f *os.File) io.Reader {
	var size int64
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
		size = fi.Size()
	}
	p.Start(label, size)
	return p.Reader(f)
}

// Reader counts the bytes read from r.
func (p *Printer) Reader(r io.Reader) io.Reader { return &reader{r, p} }

type reader struct {
	r io.Reader
	p *Printer
}

func (r *reader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.Add(int64(n))
	return n, err
}

// Done clears the line, so that what is printed next starts on a clean one.
func (p *Printer) Done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.printed {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.printed = false
	}
}

func (p *Printer) maybePrint() {
	if !p.on {
		return
	}
	now := p.now()
	if now.Sub(p.last) < Interval {
		return
	}
	p.last = now
	p.printed = true
	fmt.Fprintf(p.w, "\r%s\x1b[K", p.line())
}

// line is the text of an update.
func (p *Printer) line() string {
	s := p.label + ": "
	if p.total > 0 {
		pct := min(p.done*100/p.total, 100)
		s += fmt.Sprintf("%d%% (%s of %s)", pct, Bytes(p.done), Bytes(p.total))
	} else {
		s += Bytes(p.done)
	}
	if p.items > 0 {
		s += ", " + Count(p.items) + " " + p.noun
	}
	return s
}

// Bytes is a size to a reader, in decimal units: 950 B, 12 kB, 1.5 MB, 270 MB.
func Bytes(n int64) string {
	const units = "kMGTPE"
	if n < 1000 {
		return strconv.FormatInt(n, 10) + " B"
	}
	f, i := float64(n)/1000, 0
	for f >= 1000 && i < len(units)-1 {
		f /= 1000
		i++
	}
	if f < 10 {
		return fmt.Sprintf("%.1f %cB", f, units[i])
	}
	return fmt.Sprintf("%.0f %cB", f, units[i])
}

// Count is a count to a reader: 950, 12.3k, 1.2M.
func Count(n int64) string {
	switch {
	case n < 1000:
		return strconv.FormatInt(n, 10)
	case n < 1000_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	case n < 1000_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	}
	return fmt.Sprintf("%.1fG", float64(n)/1e9)
}
