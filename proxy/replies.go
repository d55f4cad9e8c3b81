package proxy

import (
	"errors"
	"os"
	"sync"
	"time"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/protocol"
)

// The store-to-client half of a connection. Replies are not checked, but they are followed
// (protocol.Replies) so that a client's requests awaiting replies stay at limits.max-pending-replies
// (guard.Stream stalls its next message), and they are always read from the store: what the client
// does not take yet waits here, in the buffer budget, for at most timeouts.reply-read without
// progress. A store therefore never blocks on a client that does not read; a legacy store, which
// writes on the one thread that serves everyone, would otherwise stop serving the whole job.

// capStall is how long a client may take nothing once its held replies fill caps.reply-buffer-bytes
// (or the budget): the guard stops reading that connection's replies meanwhile, which a store
// feels as a client that does not read.
const capStall = 500 * time.Millisecond

// stallResync is how long a client's next message waits at max-pending-replies with no reply at
// all before the guard stops counting: a reply it could not follow (a store that answers
// otherwise than docs/protocol.md says) must never hold a job's requests for good.
const stallResync = 10 * time.Second

// replies is the reply half's state; its mutex also guards the queue the writer drains.
type replies struct {
	mu    sync.Mutex
	track protocol.Replies
	// fromStore, replied: the bytes the store sent and the replies it completed (flow records).
	fromStore, replied uint64
	// answered: a reply came (1-buffered), for a reader stalled at max-pending-replies.
	answered chan struct{}
	// The goroutine transport's replies the client has not taken yet, oldest first: pooled read
	// buffers and how far into the first one the client got.
	queue   []chunk
	queued  int
	held    int64 // budget taken for queue: readSize for each chunk queued behind another
	writing bool  // a writer goroutine drains queue
	moved   chan struct{}
	failed  bool // the writer gave up: the client took nothing for timeouts.reply-read, or errored
	// pace is the store slot while its dial is in flight (admission/pacing.go): told when the
	// connection first asks what the store answers at once (asked) and when the store's first
	// bytes come, then nil.
	pace  *admission.Slot
	asked bool
}

type chunk struct {
	buf      *[]byte
	from, to int
	budgeted bool // it holds readSize of the budget (every chunk queued behind another)
}

func (r *replies) init() {
	r.answered = make(chan struct{}, 1)
	r.moved = make(chan struct{}, 1)
}

// Expect implements guard.Awaiting.
func (r *replies) Expect(m *protocol.Message) {
	r.mu.Lock()
	r.track.Expect(m)
	if !r.asked && protocol.AnswersAtOnce(m.Op, m.Count) {
		r.asked = true
		if r.pace != nil {
			r.pace.Asked()
		}
	}
	r.mu.Unlock()
}

// paceWith has sl, the connection's new store slot, told how fast the store answers it (its
// requests may have been judged before the store was dialled: then it asked as of now).
func (r *replies) paceWith(sl *admission.Slot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pace = sl
	if r.asked {
		sl.Asked()
	}
}

// Pending implements guard.Awaiting.
func (r *replies) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.track.Pending()
}

// follow reads p, the store's next bytes, waking a reader stalled for a reply.
func (r *replies) follow(p []byte) {
	r.mu.Lock()
	n := r.track.Feed(p)
	r.fromStore += uint64(len(p))
	r.replied += uint64(n)
	pace := r.pace
	r.pace = nil
	r.mu.Unlock()
	if pace != nil && len(p) > 0 {
		pace.Answered()
	}
	if n > 0 {
		signal(r.answered)
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// awaitReply waits, with the client unread, until a reply lets its next message go: true to judge
// the rest then. After stallResync without any reply it stops counting the replies awaited (the
// client's requests must not wait for good on a reply the guard could not follow); false: the
// connection closed meanwhile. froze: a freeze began, and the reader is to park first.
func (c *conn) awaitReply() (ok, froze bool) {
	c.s.m.stalls.Inc()
	t := time.NewTimer(stallResync)
	defer t.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	started := c.s.cont.frz.startedCh()
	for c.g.Stalled() {
		select {
		case <-started:
			return true, true
		case <-c.rep.answered:
		case <-tick.C:
			if c.isClosed() {
				return false, false
			}
		case <-t.C:
			c.rep.mu.Lock()
			c.rep.track.Reset()
			c.rep.mu.Unlock()
			c.s.m.resyncs.Inc()
			c.s.log.Warn("no reply for "+stallResync.String()+" to a connection at limits.max-pending-replies; "+
				"no longer counting its awaited replies", "conn", c.id, "source", c.src.String())
		}
	}
	return !c.isClosed(), false
}

// toClient passes n bytes of the store's reply in *bp to the client, taking over bp: written at
// once when nothing is queued, else queued for the writer once there is room for it (roomFor). It
// reports false when the connection is to end.
func (c *conn) toClient(bp *[]byte, n int) bool {
	r := &c.rep
	r.mu.Lock()
	from, budgeted := 0, false
	switch {
	case r.failed:
		r.mu.Unlock()
		readBufs.Put(bp)
		return false
	case len(r.queue) == 0 && !r.writing:
		r.mu.Unlock()
		w, err := c.cl.tryWrite(c.gr.client, (*bp)[:n])
		c.s.m.bytesS2C.Add(float64(w))
		if err != nil || w == n {
			readBufs.Put(bp)
			return err == nil
		}
		from = w
		r.mu.Lock() // the first chunk queued holds no budget: a fixed cost per connection
	default:
		var ok bool
		if ok, budgeted = c.roomFor(); !ok { // returns with r.mu held when there is room
			readBufs.Put(bp)
			return false
		}
	}
	r.queue = append(r.queue, chunk{buf: bp, from: from, to: n, budgeted: budgeted})
	r.queued += n - from
	start := !r.writing
	r.writing = true
	r.mu.Unlock()
	if start {
		go c.writeReplies()
	}
	return true
}

// roomFor waits, c.rep.mu held, until the connection may hold another chunk of replies: under
// caps.reply-buffer-bytes and within the budget, which it then takes (budgeted). It returns with the
// mutex held, true; or without it, false, having closed a client that took nothing for capStall
// meanwhile (replies_unread), or finding the connection ending. During a freeze the writer is
// stopped: the chunk is taken as it is, beyond the cap, so that the reply reader can park.
func (c *conn) roomFor() (ok, budgeted bool) {
	r := &c.rep
	var waited time.Time
	for {
		if r.failed {
			r.mu.Unlock()
			return false, false
		}
		if int64(r.queued)+readSize <= c.st.cfg.Caps.ReplyBufferBytes &&
			c.s.buf.tryAcquire(c.src.Addr(), readSize, c.held+r.held) {
			r.held += readSize
			return true, true
		}
		if c.s.frozen() {
			return true, false
		}
		r.mu.Unlock()
		if waited.IsZero() {
			waited = c.s.now()
		}
		left := capStall - c.s.now().Sub(waited)
		if left <= 0 {
			c.repliesUnread()
			return false, false
		}
		t := time.NewTimer(left)
		select {
		case <-r.moved:
			waited = time.Time{} // the client took some: it reads, only slower than the store writes
		case <-t.C:
		}
		t.Stop()
		r.mu.Lock()
	}
}

// writeReplies drains the queue to the client with blocking writes, each allowed
// timeouts.reply-read to make progress.
func (c *conn) writeReplies() {
	defer c.s.recoverConn(c)
	r := &c.rep
	for {
		r.mu.Lock()
		if c.s.frozen() && len(r.queue) > 0 { // the queue waits as it is: thaw or the next process writes it
			r.writing = false
			r.mu.Unlock()
			signal(r.moved)
			return
		}
		if len(r.queue) == 0 {
			c.gr.client.SetWriteDeadline(time.Time{}) // for toClient's writes
			r.writing = false
			r.mu.Unlock()
			signal(r.moved)
			return
		}
		ch := r.queue[0]
		r.mu.Unlock()
		c.gr.client.SetWriteDeadline(c.s.now().Add(c.st.cfg.Timeouts.ReplyRead))
		w, err := c.gr.client.Write((*ch.buf)[ch.from:ch.to])
		c.s.m.bytesS2C.Add(float64(w))
		r.mu.Lock()
		r.queued -= w
		if ch.from+w == ch.to {
			readBufs.Put(ch.buf)
			r.queue[0] = chunk{}
			r.queue = r.queue[1:]
			if ch.budgeted {
				c.s.buf.release(c.src.Addr(), readSize)
				r.held -= readSize
			}
		} else {
			r.queue[0].from += w
		}
		frozen := err != nil && errors.Is(err, os.ErrDeadlineExceeded) && c.s.frozen()
		if err != nil && !frozen {
			r.failed = true
		}
		r.mu.Unlock()
		if frozen {
			continue // stops at the top, the rest of the chunk queued
		}
		if w > 0 {
			signal(r.moved)
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.repliesUnread()
			} else {
				c.closeBoth()
			}
			signal(r.moved)
			r.mu.Lock()
			r.writing = false
			r.mu.Unlock()
			return
		}
	}
}

// queueHeld queues b for the client, in pooled chunks, before anything else, whatever the caps:
// replies a previous process held for it already (upgrade in place).
func (c *conn) queueHeld(b []byte) {
	r := &c.rep
	r.mu.Lock()
	for len(b) > 0 {
		bp := readBufs.Get().(*[]byte)
		n := copy(*bp, b)
		b = b[n:]
		r.queue = append(r.queue, chunk{buf: bp, to: n})
		r.queued += n
	}
	start := !r.writing && len(r.queue) > 0
	r.writing = r.writing || start
	r.mu.Unlock()
	if start {
		go c.writeReplies()
	}
}

// awaitWritten waits for the writer to pass on every queued reply (the store ended its side, or
// the client's end of stream is followed by the store's last replies).
func (c *conn) awaitWritten() {
	r := &c.rep
	for {
		r.mu.Lock()
		busy := r.writing
		r.mu.Unlock()
		if !busy {
			return
		}
		<-r.moved
	}
}

// dropReplies gives back the queue's buffers and budget once the connection ended.
func (c *conn) dropReplies() {
	r := &c.rep
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ch := range r.queue {
		readBufs.Put(ch.buf)
	}
	r.queue, r.queued = nil, 0
	c.s.buf.release(c.src.Addr(), r.held)
	r.held = 0
}

// repliesUnread closes a client that takes none of the replies held for it.
func (c *conn) repliesUnread() {
	r := &c.rep
	r.mu.Lock()
	r.failed = true
	queued := r.queued
	r.mu.Unlock()
	if c.isClosed() {
		return
	}
	seen, gen := c.seen.bytes.Load(), c.seen.gen.Load()
	v := &protocol.Violation{Rule: protocol.RuleRepliesUnread, Offset: seen, Declared: uint64(queued),
		Limit: uint64(c.st.cfg.Caps.ReplyBufferBytes)}
	if gen > 0 {
		v.Generation = protocol.Generation(gen - 1)
	}
	c.s.ev.violationSeen(c, v, nil, gen > 0, seen)
	c.closeBoth()
}
