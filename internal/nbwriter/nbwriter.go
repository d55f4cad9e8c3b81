// Package nbwriter is an io.Writer that never makes its caller wait: lines go to the real writer
// from a goroutine of its own, through a bounded queue. A log sink that stops reading (a stderr
// pipe nobody drains, a stuck journald stream) then costs log lines, counted, instead of stopping
// the proxy that logs.
package nbwriter

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Writer queues whole writes (one log line each, as slog writes them) for out.
type Writer struct {
	out     io.Writer
	ch      chan []byte
	dropped atomic.Uint64
	unsaid  atomic.Uint64
	onDrop  func(n uint64)
	done    chan struct{}
	once    sync.Once
}

// New starts a writer queueing up to capacity writes for out. onDrop, if set, is called from the
// writing goroutine before the first write after drops, with how many were dropped: to say so in
// the sink, in its own format.
func New(out io.Writer, capacity int, onDrop func(n uint64)) *Writer {
	w := &Writer{out: out, ch: make(chan []byte, max(capacity, 1)), onDrop: onDrop, done: make(chan struct{})}
	go w.drain()
	return w
}

// Write queues a copy of p, or drops it when the queue is full. It never fails: a log line lost
// is counted, not returned to a caller that could do nothing about it.
func (w *Writer) Write(p []byte) (int, error) {
	select {
	case w.ch <- append([]byte(nil), p...):
	default:
		w.dropped.Add(1)
		w.unsaid.Add(1)
	}
	return len(p), nil
}

// Dropped is how many writes were dropped.
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

func (w *Writer) drain() {
	defer close(w.done)
	for p := range w.ch {
		if n := w.unsaid.Swap(0); n > 0 && w.onDrop != nil {
			w.onDrop(n)
		}
		w.out.Write(p)
	}
}

// Close writes what is queued, waiting up to wait for a stalled sink.
func (w *Writer) Close(wait time.Duration) error {
	w.once.Do(func() { close(w.ch) })
	select {
	case <-w.done:
		return nil
	case <-time.After(wait):
		return errors.New("nbwriter: the sink took nothing for " + wait.String() + "; queued lines are lost")
	}
}
