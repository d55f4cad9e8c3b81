package progress

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// fakeClock is a clock the test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newTest(total int64) (*Printer, *bytes.Buffer, *fakeClock) {
	var out bytes.Buffer
	clock := &fakeClock{time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)}
	p := New(&out, total).SetTerminal(true)
	p.now, p.last = clock.now, clock.now()
	return p, &out, clock
}

// updates splits what a Printer wrote into its updates.
func updates(out *bytes.Buffer) []string {
	var u []string
	for _, part := range strings.Split(out.String(), "\r") {
		if part != "" {
			u = append(u, strings.TrimSuffix(part, "\x1b[K"))
		}
	}
	return u
}

// TestPrinter drives a Printer on a fake terminal: an update at most every Interval, the
// figures of the read, and the line cleared at the end.
func TestPrinter(t *testing.T) {
	p, out, clock := newTest(270_000_000)
	p.Start("reading audit.log.3.gz", 270_000_000)
	p.Add(1 << 20) // before Interval: a short read shows nothing
	if out.Len() != 0 {
		t.Fatalf("an update before %v: %q", Interval, out.String())
	}
	clock.t = clock.t.Add(Interval)
	p.Items(1_234_567, "events")
	p.Add(123_000_000 - 1<<20)
	clock.t = clock.t.Add(Interval / 2)
	p.Add(1000) // too soon after the last update
	clock.t = clock.t.Add(Interval / 2)
	p.Add(int64(270_000_000 - 123_001_000))
	want := []string{
		"reading audit.log.3.gz: 45% (123 MB of 270 MB), 1.2M events",
		"reading audit.log.3.gz: 100% (270 MB of 270 MB), 1.2M events",
	}
	if got := updates(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("updates\n%q\nwant\n%q", got, want)
	}

	out.Reset()
	p.Start("reading audit.log", 0) // a size not known
	clock.t = clock.t.Add(Interval)
	if _, err := io.Copy(io.Discard, p.Reader(strings.NewReader(strings.Repeat("x", 2500)))); err != nil {
		t.Fatal(err)
	}
	if got := updates(out); len(got) != 1 || got[0] != "reading audit.log: 2.5 kB, 1.2M events" {
		t.Errorf("update of a read of unknown size: %q", got)
	}
	out.Reset()
	p.Done()
	if out.String() != "\r\x1b[K" {
		t.Errorf("Done wrote %q, want the line cleared", out.String())
	}
	out.Reset()
	p.Done()
	if out.Len() != 0 {
		t.Errorf("a second Done wrote %q", out.String())
	}
}

// TestPrinterNotATerminal: a pipe, a file or a buffer gets nothing.
func TestPrinterNotATerminal(t *testing.T) {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for name, out := range map[string]io.Writer{"buffer": &bytes.Buffer{}, "/dev/null": devnull, "pipe": w} {
		if New(out, 10).on {
			t.Errorf("%s taken for a terminal", name)
		}
	}
	var buf bytes.Buffer
	p := New(&buf, 100)
	p.last = time.Time{}
	p.Add(50)
	p.Done()
	if buf.Len() != 0 {
		t.Errorf("wrote %q to a buffer", buf.String())
	}
}

func TestUnits(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 999: "999 B", 1000: "1.0 kB", 12_345: "12 kB", 1_500_000: "1.5 MB", 270_000_000: "270 MB", 3e12: "3.0 TB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
	for n, want := range map[int64]string{950: "950", 12_300: "12.3k", 1_234_567: "1.2M", 2e9: "2.0G"} {
		if got := Count(n); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestPrinterOnATerminal: a pseudo-terminal is one (the positive control of the ioctl).
func TestPrinterOnATerminal(t *testing.T) {
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal to test with: %v", err)
	}
	defer ptmx.Close()
	if !New(ptmx, 10).on {
		t.Error("a pseudo-terminal not taken for a terminal")
	}
}
