package nbwriter

import (
	"bufio"
	"fmt"
	"io"
	"testing"
	"time"
)

// Writes into a sink nobody reads return at once; once it reads again, the queued lines come out
// in order, after a line that says how many were dropped.
func TestStalledSinkCostsLinesNotTime(t *testing.T) {
	pr, pw := io.Pipe()
	w := New(pw, 8, func(n uint64) { fmt.Fprintf(pw, "dropped %d\n", n) })
	start := time.Now()
	for i := range 1000 {
		fmt.Fprintf(w, "line %d\n", i)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("1000 writes into a stalled sink took %v", d)
	}
	dropped := w.Dropped()
	if dropped < 1000-10 || dropped > 1000-8 {
		t.Fatalf("dropped %d of 1000 with room for 8 queued and 1 in flight", dropped)
	}
	got := make(chan []string)
	go func() {
		var lines []string
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		got <- lines
	}()
	fmt.Fprintf(w, "after\n")
	if err := w.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	var written, said int
	for _, l := range <-got {
		var n int
		if _, err := fmt.Sscanf(l, "dropped %d", &n); err == nil {
			said += n
		} else {
			written++
		}
	}
	dropped = w.Dropped() // "after" too, if the queue was still full
	if written+int(dropped) != 1001 || said != int(dropped) {
		t.Fatalf("%d lines written, %d dropped, drop lines said %d: want 1001 in all, the count exact", written,
			dropped, said)
	}
}
