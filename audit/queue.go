package audit

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrQueueFull is returned by Queue.Write for an event it dropped: the sink has not kept up.
var ErrQueueFull = errors.New("audit: queue full, event dropped")

// Queue hands events to a Writer on a goroutine of its own, so that whoever records an event never
// waits for the sink: a stderr pipe nobody reads (a stuck container log shim, a blocked journald
// stream) or a slow or full disk. At most its capacity of events wait; more are dropped, counted
// (Dropped), and reported by one dropped_summary event once the sink takes events again.
type Queue struct {
	w       *Writer
	ch      chan Event
	dropped atomic.Uint64 // since the Queue was made
	failed  atomic.Uint64 // events the writer could not write
	unsaid  atomic.Uint64 // dropped, not yet reported by a dropped_summary
	done    chan struct{}
	once    sync.Once
}

// NewQueue starts a queue of up to capacity events in front of w; Close stops it and closes w.
func NewQueue(w *Writer, capacity int) *Queue {
	q := &Queue{w: w, ch: make(chan Event, max(capacity, 1)), done: make(chan struct{})}
	go q.drain()
	return q
}

// Write queues e, or drops it when the queue is full. It never waits.
func (q *Queue) Write(e Event) error {
	if e.Timestamp.IsZero() {
		e.Timestamp = q.w.opts.Clock() // when it happened, not when the sink took it
	}
	select {
	case q.ch <- e:
		return nil
	default:
		q.dropped.Add(1)
		q.unsaid.Add(1)
		return ErrQueueFull
	}
}

// Dropped is how many events the queue dropped.
func (q *Queue) Dropped() uint64 { return q.dropped.Load() }

// Lost is how many events were dropped or could not be written. It never waits for the writer
// (metrics read it while the sink may be stalled).
func (q *Queue) Lost() uint64 { return q.dropped.Load() + q.failed.Load() }

// Writer is the writer behind the queue (its Stats, Flush).
func (q *Queue) Writer() *Writer { return q.w }

func (q *Queue) drain() {
	defer close(q.done)
	for e := range q.ch {
		if n := q.unsaid.Swap(0); n > 0 {
			q.w.Write(Event{Action: ActionDroppedSummary, Suppressed: n}) // errors are counted in Stats
		}
		if q.w.Write(e) != nil {
			q.failed.Add(1)
		}
	}
}

// Close writes what is queued, waiting up to wait for a stalled sink, then closes the writer; a
// sink still stalled by then keeps the queued events, which are lost, and Close says so.
func (q *Queue) Close(wait time.Duration) error {
	q.once.Do(func() { close(q.ch) })
	select {
	case <-q.done:
		if n := q.unsaid.Swap(0); n > 0 {
			q.w.Write(Event{Action: ActionDroppedSummary, Suppressed: n})
		}
		return q.w.Close()
	case <-time.After(wait):
		return errors.New("audit: the sink took no events for " + wait.String() + "; events still queued are lost")
	}
}
