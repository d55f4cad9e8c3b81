package proxy

import (
	"context"
	"sync"
)

// budget is the global allowance of bytes held in partial client messages (caps.buffer-budget-bytes).
// A connection that needs more waits until others release some: when the budget is spent,
// reading slows down, and memory never follows the wire.
type budget struct {
	mu    sync.Mutex
	cond  *sync.Cond
	limit int64
	used  int64
}

func newBudget(limit int64) *budget {
	b := &budget{limit: limit}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// acquire takes n bytes, waiting while the budget is spent, until ctx ends. A request larger
// than the whole budget waits for an empty budget and then proceeds alone, so that a limit
// smaller than one message cannot deadlock.
func (b *budget) acquire(ctx context.Context, n int64) error {
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
	for b.used+n > b.limit && b.used > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		b.cond.Wait()
	}
	b.used += n
	return nil
}

// tryAcquire takes n bytes if acquire would not wait.
func (b *budget) tryAcquire(n int64) bool {
	if n <= 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit && b.used > 0 {
		return false
	}
	b.used += n
	return true
}

func (b *budget) release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *budget) setLimit(limit int64) {
	b.mu.Lock()
	b.limit = limit
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
