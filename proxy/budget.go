package proxy

import (
	"context"
	"net/netip"
	"runtime/debug"
	"sync"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/config"
)

// budget is the allowance of bytes held in partial client messages: caps.buffer-budget-bytes in
// all, and at most caps.per-source-budget-bytes of it for one source, so that one host's stalled
// messages cannot take what every other host's need. A connection that needs more waits until
// others release some: when the budget is spent, reading slows down, and memory never follows the
// wire. The wait is not the client's fault: the guard does not count it against the message's
// deadline (guard.Stream.Paused). The counting is admission.Counter's; every release wakes every
// waiter, and each takes what fits then.
type budget struct {
	mu   sync.Mutex
	cond *sync.Cond
	held admission.Counter
}

func newBudget(limit, perSource int64) *budget {
	b := &budget{held: admission.NewCounter(limit, perSource)}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// fits reports whether src may take n more bytes now for a connection that holds own already. A
// message larger than the whole budget, or than a source's share, proceeds once nothing but its
// own start is held (of the source's), so that no limit smaller than one message can deadlock.
func (b *budget) fits(src netip.Addr, n, own int64) bool {
	return b.held.Exceeds(src, n, own) == admission.NoCap
}

// acquire takes n bytes for src's connection holding own, waiting while they do not fit, until
// ctx ends.
func (b *budget) acquire(ctx context.Context, src netip.Addr, n, own int64) error {
	if n <= 0 {
		return nil
	}
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		b.cond.Broadcast()
		b.mu.Unlock()
	})
	defer stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for !b.fits(src, n, own) {
		if err := ctx.Err(); err != nil {
			return err
		}
		b.cond.Wait()
	}
	b.held.Take(src, n)
	return nil
}

// tryAcquire takes n bytes for src's connection holding own if acquire would not wait.
func (b *budget) tryAcquire(src netip.Addr, n, own int64) bool {
	if n <= 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.fits(src, n, own) {
		return false
	}
	b.held.Take(src, n)
	return true
}

// adopt takes n bytes for src whatever the limits say: a message in progress handed over by an
// upgrade held them in the previous process.
func (b *budget) adopt(src netip.Addr, n int64) {
	b.mu.Lock()
	b.held.Take(src, n)
	b.mu.Unlock()
}

func (b *budget) release(src netip.Addr, n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.held.Release(src, n)
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *budget) setLimits(limit, perSource int64) {
	b.mu.Lock()
	b.held.SetLimits(limit, perSource)
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held.Used()
}

// heapOverhead is what serve's memory holds besides the budget, at most: the runtime, the event
// loops, idle connections (no buffers: they are pooled and taken only for a read) and each
// connection's one reply chunk outside the budget; docs/design.md, Memory, has the measurements.
const heapOverhead = 96 << 20

// heapLimit is serve's soft memory limit for cfg: the budget, which every byte a connection holds
// counts in, and the overhead. Go's collector then works harder near it instead of letting the
// heap grow to twice what is live (GOGC), which under a flood of large messages would be twice the
// budget.
func heapLimit(cfg config.Config) int64 { return cfg.Caps.BufferBudgetBytes + heapOverhead }

// limitHeap applies heapLimit when the server holds the heap (hold: Options.HoldHeap).
func limitHeap(hold bool, cfg config.Config) {
	if hold {
		debug.SetMemoryLimit(heapLimit(cfg))
	}
}
