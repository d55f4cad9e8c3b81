package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// mixPattern is the op sequence OpMix cycles through: 70 % GET, 20 % SET, 10 % ADD.
var mixPattern = [10]Op{OpGet, OpGet, OpSet, OpGet, OpGet, OpAdd, OpGet, OpGet, OpSet, OpGet}

// request encodes iteration i of op for cl into cl.out and returns it with the replies to read.
// ADD goes to counter keys of its own: the real store parses the value it adds to as a decimal
// integer and drops the connection when it is not one.
func (r *runner) request(cl *client, op Op, i int, keys [][]byte, value []byte, shapes []replyShape) ([]byte, []replyShape) {
	k := keys[i%len(keys)]
	out := cl.out[:0]
	shapes = shapes[:0]
	batch := func() [][]byte {
		b := make([][]byte, 0, r.cfg.Batch)
		for j := range r.cfg.Batch {
			b = append(b, keys[(i+j)%len(keys)])
		}
		return b
	}
	switch op {
	case OpMix:
		return r.request(cl, mixPattern[i%len(mixPattern)], i/len(mixPattern), keys, value, shapes)
	case OpGet:
		out = cl.encode(out, protocol.Request{Op: protocol.OpGet, Key: k})
		shapes = append(shapes, replyBytes)
	case OpSet:
		out = cl.encode(out, protocol.Request{Op: protocol.OpSet, Key: k, Value: value})
		out = cl.encode(out, protocol.Request{Op: protocol.OpGetNumKeys})
		shapes = append(shapes, replyInt)
	case OpAdd:
		ck := append(append(cl.keyBuf[:0], k...), "/n"...)
		cl.keyBuf = ck
		out = cl.encode(out, protocol.Request{Op: protocol.OpAdd, Key: ck, Int: 1})
		shapes = append(shapes, replyInt)
	case OpCheck:
		out = cl.encode(out, protocol.Request{Op: protocol.OpCheck, Keys: batch()})
		shapes = append(shapes, replyByte)
	case OpMultiGet:
		out = cl.encode(out, protocol.Request{Op: protocol.OpMultiGet, Keys: batch()})
		shapes = append(shapes, replyShape{strings: r.cfg.Batch})
	case OpMultiSet:
		ks := batch()
		vs := make([][]byte, len(ks))
		for j := range vs {
			vs[j] = value
		}
		out = cl.encode(out, protocol.Request{Op: protocol.OpMultiSet, Keys: ks, Values: vs})
		out = cl.encode(out, protocol.Request{Op: protocol.OpGetNumKeys})
		shapes = append(shapes, replyInt)
	}
	cl.out = out
	return out, shapes
}

// needsKeys reports whether op reads keys that must exist first (a legacy store's GET of a
// missing key is an error, and torch clients always WAIT before GET).
func needsKeys(op Op) bool {
	return op == OpGet || op == OpMultiGet || op == OpMix || op == OpCheck || op == OpConnect
}

// prefill sets every key from one connection, pipelined, and waits until the store has them.
func (r *runner) prefill(ctx context.Context, keys [][]byte, value []byte) error {
	c, _, err := r.d.dial(ctx, 0)
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	cl := newClient(c, r.cfg.Gen)
	defer cl.close()
	c.SetDeadline(time.Now().Add(r.cfg.Timeout))
	if err := cl.handshake(1); err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	cl.c.SetDeadline(time.Now().Add(r.cfg.Timeout))
	const chunk = 256
	for i := 0; i < len(keys); i += chunk {
		var out []byte
		for _, k := range keys[i:min(i+chunk, len(keys))] {
			out = cl.encode(out, protocol.Request{Op: protocol.OpSet, Key: k, Value: value})
		}
		out = cl.encode(out, protocol.Request{Op: protocol.OpGetNumKeys})
		if err := cl.do(out, replyInt); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
	}
	return nil
}

// closedLoop runs the single-request ops: every connection sends, waits for the reply, repeats.
func (r *runner) closedLoop(ctx context.Context, res *Result) error {
	keys := make([][]byte, r.cfg.Keys)
	for i := range keys {
		keys[i] = r.key(i)
	}
	value := bytes.Repeat([]byte{'v'}, r.cfg.ValueSize)
	if needsKeys(r.cfg.Op) {
		if err := r.prefill(ctx, keys, value); err != nil {
			return err
		}
	}
	cls, took := r.connectAll(ctx, r.cfg.Conns)
	defer closeAll(cls)
	res.Connect = r.connectSummary(took)
	if res.Connect.OK == 0 {
		return errors.New("no connection could be opened")
	}
	if r.cfg.OnReady != nil {
		r.cfg.OnReady(res.Connect.OK)
	}

	var (
		hist      shardedHist
		ops       atomic.Uint64
		recording atomic.Bool
		stop      atomic.Bool
		wg        sync.WaitGroup
	)
	for w, cl := range cls {
		wg.Go(func() {
			var shapes []replyShape
			var renew time.Time
			i := w * len(keys) / len(cls) // spread the connections over the keys
			for !stop.Load() && ctx.Err() == nil {
				if cl == nil {
					var err error
					if cl, err = r.connect(ctx, w); err != nil {
						time.Sleep(50 * time.Millisecond)
						continue
					}
					cls[w] = cl
					renew = time.Time{}
				}
				var req []byte
				req, shapes = r.request(cl, r.cfg.Op, i, keys, value, shapes)
				i++
				t0 := time.Now()
				if t0.After(renew) { // re-arming the deadline on every request would cost timer work
					cl.c.SetDeadline(t0.Add(r.cfg.Timeout))
					renew = t0.Add(r.cfg.Timeout / 4)
				}
				err := cl.do(req, shapes...)
				d := time.Since(t0)
				if err != nil {
					if !stop.Load() {
						r.errs.add(err)
					}
					cl.close()
					cl, cls[w] = nil, nil
					continue
				}
				if recording.Load() {
					hist.record(w, d)
					ops.Add(1)
				}
			}
		})
	}
	r.measure(ctx, res, &recording)
	stop.Store(true)
	wg.Wait()
	res.Ops = ops.Load()
	res.Latency = summarize(hist.merged())
	return nil
}

// measure lets the workers run unrecorded for the warm-up, then turns recording on for Duration
// and fills in the measured interval and the CPU spent over it.
func (r *runner) measure(ctx context.Context, res *Result, recording *atomic.Bool) {
	select {
	case <-time.After(r.cfg.Warmup):
	case <-ctx.Done():
	}
	cpu := startCPU(r.cfg.WatchPIDs)
	recording.Store(true)
	t0 := time.Now()
	select {
	case <-time.After(r.cfg.Duration):
	case <-ctx.Done():
	}
	recording.Store(false)
	res.DurationS = time.Since(t0).Seconds()
	res.CPU = cpu.end()
}

// connectLoop measures connection set-up as a new torch client lives it: each of Conns workers
// opens a connection, handshakes, sends one GET, reads the reply and closes, over and over. One
// op is one connection; its latency runs from the dial to the GET's reply, so through a proxy it
// covers the proxy's own set-up (its dial to the store, a TLS handshake) and the first forwarded
// request. The close is not timed: its cost to the parties shows in the next set-ups.
func (r *runner) connectLoop(ctx context.Context, res *Result) error {
	keys := make([][]byte, r.cfg.Keys)
	for i := range keys {
		keys[i] = r.key(i)
	}
	if err := r.prefill(ctx, keys, bytes.Repeat([]byte{'v'}, r.cfg.ValueSize)); err != nil {
		return err
	}
	var (
		hist      shardedHist
		ops       atomic.Uint64
		recording atomic.Bool
		stop      atomic.Bool
		wg        sync.WaitGroup
	)
	for w := range r.cfg.Conns {
		wg.Go(func() {
			for i := w * len(keys) / r.cfg.Conns; !stop.Load() && ctx.Err() == nil; i++ {
				t0 := time.Now()
				err := r.setUp(ctx, w, keys[i%len(keys)])
				d := time.Since(t0)
				if err != nil {
					if !stop.Load() {
						r.errs.add(err)
					}
					continue
				}
				if recording.Load() {
					hist.record(w, d)
					ops.Add(1)
				}
			}
		})
	}
	r.measure(ctx, res, &recording)
	stop.Store(true)
	wg.Wait()
	res.Ops = ops.Load()
	res.Latency = summarize(hist.merged())
	return nil
}

// setUp is one connection of connectLoop: dial, handshake, GET key, close.
func (r *runner) setUp(ctx context.Context, id int, key []byte) error {
	c, _, err := r.d.dial(ctx, id)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(r.cfg.Timeout))
	cl := newClient(c, r.cfg.Gen)
	if err := cl.handshake(uint32(id) + 1); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if err := cl.do(cl.encode(nil, protocol.Request{Op: protocol.OpGet, Key: key}), replyBytes); err != nil {
		return fmt.Errorf("first get: %w", err)
	}
	return nil
}

// waitStorm repeats the barrier pattern: connections 1..N-1 each WAIT on the round's key, then
// connection 0 sets it. A round ends when every waiter has been released.
func (r *runner) waitStorm(ctx context.Context, res *Result) error {
	cls, took := r.connectAll(ctx, r.cfg.Conns)
	defer closeAll(cls)
	res.Connect = r.connectSummary(took)
	if cls[0] == nil || res.Connect.OK < 2 {
		return errors.New("wait-storm: the setter or every waiter failed to connect")
	}
	if r.cfg.OnReady != nil {
		r.cfg.OnReady(res.Connect.OK)
	}
	var hist Histogram
	t0 := time.Now()
	end := t0.Add(r.cfg.Duration)
	rounds := 0
	for ; time.Now().Before(end) && ctx.Err() == nil; rounds++ {
		key := []byte(fmt.Sprintf("/bench/%s/storm/%d", r.nonce, rounds))
		rt := time.Now()
		var sent, done sync.WaitGroup
		for w := 1; w < len(cls); w++ {
			if cls[w] == nil {
				continue
			}
			sent.Add(1)
			done.Go(func() {
				cl := cls[w]
				cl.c.SetDeadline(time.Now().Add(r.cfg.Timeout))
				_, err := cl.c.Write(cl.encode(nil, protocol.Request{Op: protocol.OpWait, Keys: [][]byte{key}}))
				sent.Done()
				if err == nil {
					err = cl.readReply(replyByte)
				}
				if err != nil {
					r.errs.add(fmt.Errorf("waiter: %w", err))
					cl.close()
					cls[w] = nil
				}
			})
		}
		sent.Wait()
		setter := cls[0]
		setter.c.SetDeadline(time.Now().Add(r.cfg.Timeout))
		req := setter.encode(nil, protocol.Request{Op: protocol.OpSet, Key: key, Value: []byte("1")})
		req = setter.encode(req, protocol.Request{Op: protocol.OpGetNumKeys})
		if err := setter.do(req, replyInt); err != nil {
			r.errs.add(fmt.Errorf("setter: %w", err))
			done.Wait()
			break
		}
		done.Wait()
		hist.Record(time.Since(rt))
	}
	res.DurationS = time.Since(t0).Seconds()
	res.Ops = uint64(rounds)
	res.Latency = summarize(&hist)
	return nil
}

// rendezvous is what a world_size N job does against its store at start-up: N clients connect
// and handshake, each ADDs 1 to the init key, the one that brings it to N sets a done key, and
// every client WAITs on that key. All connections stay open until every client is released.
// The keys carry the run's nonce so that repeated runs on one store stay independent.
func (r *runner) rendezvous(ctx context.Context, res *Result) error {
	n := r.cfg.Conns
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	initKey := []byte("/init/" + r.nonce)
	doneKey := []byte("/rdzv/" + r.nonce + "/done")
	deadline, _ := ctx.Deadline()
	var (
		hist      Histogram
		histMu    sync.Mutex
		completed atomic.Int64
		lastConn  atomic.Int64 // ns since t0
		wg        sync.WaitGroup
		cls       = make([]*client, n)
	)
	cpu := startCPU(r.cfg.WatchPIDs)
	t0 := time.Now()
	for i := range n {
		wg.Go(func() {
			cl, err := r.connect(ctx, i)
			if err != nil {
				return
			}
			cls[i] = cl
			for v := int64(time.Since(t0)); ; {
				old := lastConn.Load()
				if v <= old || lastConn.CompareAndSwap(old, v) {
					break
				}
			}
			cl.c.SetDeadline(deadline)
			err = cl.do(cl.encode(nil, protocol.Request{Op: protocol.OpAdd, Key: initKey, Int: 1}))
			var v int64
			if err == nil {
				v, err = cl.readInt()
			}
			if err == nil {
				var req []byte
				if v == int64(n) {
					req = cl.encode(req, protocol.Request{Op: protocol.OpSet, Key: doneKey, Value: []byte("1")})
				}
				req = cl.encode(req, protocol.Request{Op: protocol.OpWait, Keys: [][]byte{doneKey}})
				err = cl.do(req, replyByte)
			}
			if err != nil {
				r.errs.add(fmt.Errorf("rendezvous: %w", err))
				return
			}
			completed.Add(1)
			histMu.Lock()
			hist.Record(time.Since(t0))
			histMu.Unlock()
		})
	}
	wg.Wait()
	total := time.Since(t0)
	res.CPU = cpu.end()
	closeAll(cls)
	res.Connect = r.connectSummary(time.Duration(lastConn.Load()))
	res.Rendezvous = &Rendezvous{Clients: n, Completed: int(completed.Load()), TotalS: total.Seconds()}
	res.DurationS = total.Seconds()
	res.Ops = uint64(completed.Load())
	res.Latency = summarize(&hist)
	if res.Rendezvous.Completed < n {
		return fmt.Errorf("rendezvous: %d of %d clients completed", res.Rendezvous.Completed, n)
	}
	return nil
}

// idle opens the connections, handshakes, and holds them silently for Duration: the memory a
// proxy spends per waiting torch worker.
func (r *runner) idle(ctx context.Context, res *Result) error {
	cls, took := r.connectAll(ctx, r.cfg.Conns)
	defer closeAll(cls)
	res.Connect = r.connectSummary(took)
	if r.cfg.OnReady != nil {
		r.cfg.OnReady(res.Connect.OK)
	}
	t0 := time.Now()
	select {
	case <-time.After(r.cfg.Duration):
	case <-ctx.Done():
	}
	res.DurationS = time.Since(t0).Seconds()
	// A held connection that received bytes or was closed by the peer is an error.
	var wg sync.WaitGroup
	for _, cl := range cls {
		if cl == nil {
			continue
		}
		wg.Go(func() {
			cl.c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, err := cl.r.Peek(1); err == nil || !isTimeout(err) {
				r.errs.add(fmt.Errorf("idle connection: unexpected bytes or close (%v)", err))
			}
		})
	}
	wg.Wait()
	if res.Connect.Failed > 0 {
		return fmt.Errorf("idle: %d of %d connections failed", res.Connect.Failed, r.cfg.Conns)
	}
	return nil
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
