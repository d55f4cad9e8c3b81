package proxy

import (
	"bytes"
	"context"

	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// StoreInfo is what the guard learned about the store behind it by asking it (LearnStore).
type StoreInfo struct {
	Gen     protocol.Generation
	Backend protocol.Backend // legacy or libuv; G0/G1 stores are legacy
}

func (i StoreInfo) String() string { return i.Gen.String() + " (" + i.Backend.String() + ")" }

// The probe's bytes. Every probe that starts with 0x00 carries, in the 8 bytes after it, a length
// of 2^63 or more when a G0/G1 store reads them as a SET's key length: libstdc++'s vector refuses
// such a size before allocating (length_error), and the store closes the connection. A G2+ store
// reads a VALIDATE and then whole messages. So no probe can freeze or grow a store of any
// generation, even one that restarted as another torch between two probes.
var (
	// probeNonce is the PING nonce: its bytes make the G0/G1 key length >= 2^63.
	probeNonce   = [4]byte{0xFF, 0xFF, 0xFF, 0xFF}
	probeHello   = protocol.AppendHandshake(nil, protocol.G3, 0xFFFFFFFF) // VALIDATE, PING
	probeKey     = []byte("storeguard/generation-probe")                  // the BARRIER and QUEUE_LEN probes' key, which no job uses
	probeG2Steps = struct{ a, list, barrier, queueLen, cancelWait []byte }{
		a: append(probeHello[:5:5], g2(protocol.Request{Op: protocol.OpGetNumKeys},
			protocol.Request{Op: protocol.OpPing, U32: 0xFFFFFFFF})...),
		list: g2(protocol.Request{Op: protocol.OpListKeys}),
		barrier: g2(protocol.Request{Op: protocol.OpBarrier, Key: probeKey, Int: 1},
			protocol.Request{Op: protocol.OpDeleteKey, Key: probeKey}),
		queueLen:   g2(protocol.Request{Op: protocol.OpQueueLen, Key: probeKey}),
		cancelWait: g2(protocol.Request{Op: protocol.OpCancelWait}),
	}
	// probeLegacy is step B: GETNUMKEYS, then CANCEL_WAIT as G1 numbers it (unknown to G0).
	probeLegacy = must(protocol.Append(must(protocol.Append(nil, protocol.G0, protocol.Request{Op: protocol.OpGetNumKeys})),
		protocol.G1, protocol.Request{Op: protocol.OpCancelWait}))
)

// g2 encodes requests as G2 and later number them (every G2+ generation only adds opcodes).
func g2(rs ...protocol.Request) []byte {
	var b []byte
	for _, r := range rs {
		b = must(protocol.Append(b, protocol.LatestGeneration, r))
	}
	return b
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// errStoreSlow: the store did not answer in time. Not an answer: the caller asks again later.
var errStoreSlow = errors.New("the store did not answer in time")

// exchange sends msg on a new connection to the store and reads until it has want bytes, the
// store closes the connection, or timeout passes. closed reports a close before want bytes.
func exchange(ctx context.Context, addr string, timeout time.Duration, msg []byte, want int) (got []byte, closed bool, err error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(msg); err != nil {
		return nil, true, nil // a store that closed before reading all of it
	}
	got = make([]byte, want)
	n, err := io.ReadFull(c, got)
	switch {
	case err == nil:
		return got, false, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return got[:n], false, errStoreSlow
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
		return got[:n], true, nil
	}
	return got[:n], false, err
}

// LearnStore asks the store at addr which generation and backend it speaks, with messages that
// every generation handles without harm (see probeHello). Each answer is positive evidence:
// a reply of the expected length, or a close where a store of the other kind replies. A store
// that is slow, busy or not up is an error, never a guess; the caller asks again. Steps:
//
//	A  VALIDATE, GETNUMKEYS(07), PING   G0/G1: close (key length >= 2^63); G2: 8 bytes, close at PING; G3+: 12 bytes
//	B  GETNUMKEYS(06), CANCEL_WAIT(0b)   (G0/G1) G0: 8 bytes, close (0b unknown); G1: 9 bytes
//	F  0c, again every 20 ms             (G2+) legacy: close (first message not VALIDATE); libuv: 01 (CANCEL_WAIT,
//	                                     after libuv let the first read pass, docs/protocol.md)
//	C  VALIDATE, PING, LIST_KEYS         (G3+) G5+: 4 + 8 bytes; G3/G4: 4 bytes, close
//	D  VALIDATE, PING, BARRIER(k, 1),    (G5+) G6: 4 + 1 + 8 bytes (the barrier's key is deleted in the same
//	   DELETE_KEY(k)                     write); G5: 4 bytes, close
//	E  VALIDATE, PING, QUEUE_LEN(k)      (G3/G4 libuv) G4: 4 + 8 bytes; G3: 4 bytes, close
//
// A G4 store on the legacy backend has no queue ops and answers exactly as a G3 store: it is
// reported as G3.
func LearnStore(ctx context.Context, addr string, timeout time.Duration) (StoreInfo, error) {
	got, closed, err := exchange(ctx, addr, timeout, probeG2Steps.a, 12)
	if err != nil {
		return StoreInfo{}, err
	}
	switch {
	case closed && len(got) == 0:
		return learnLegacy(ctx, addr, timeout)
	case closed && len(got) == 8:
		b, err := learnBackend(ctx, addr, timeout)
		return StoreInfo{Gen: protocol.G2, Backend: b}, err
	case !closed && len(got) == 12 && bytes.Equal(got[8:], probeNonce[:]):
	default:
		return StoreInfo{}, fmt.Errorf("unexpected answer %x (closed %v) to VALIDATE, GETNUMKEYS, PING: not a TCPStore of a known generation", got, closed)
	}
	backend, err := learnBackend(ctx, addr, timeout)
	if err != nil {
		return StoreInfo{}, err
	}
	g3 := func(op []byte, want int) (bool, error) { // true: the store answered the op after PING
		msg := append(probeHello[:len(probeHello):len(probeHello)], op...)
		got, closed, err := exchange(ctx, addr, timeout, msg, want)
		switch {
		case err != nil:
			return false, err
		case !closed && len(got) == want && bytes.Equal(got[:4], probeNonce[:]):
			return true, nil
		case closed && len(got) == 4:
			return false, nil
		}
		return false, fmt.Errorf("unexpected answer %x (closed %v) to op %#x after PING", got, closed, op[0])
	}
	listKeys, err := g3(probeG2Steps.list, 12)
	if err != nil {
		return StoreInfo{}, err
	}
	if listKeys {
		g6, err := g3(probeG2Steps.barrier, 4+1+8)
		if g6 {
			return StoreInfo{Gen: protocol.G6, Backend: backend}, nil
		}
		return StoreInfo{Gen: protocol.G5, Backend: backend}, err
	}
	if backend == protocol.BackendLibuv {
		g4, err := g3(probeG2Steps.queueLen, 12)
		if g4 {
			return StoreInfo{Gen: protocol.G4, Backend: backend}, nil
		}
		return StoreInfo{Gen: protocol.G3, Backend: backend}, err
	}
	return StoreInfo{Gen: protocol.G3, Backend: backend}, nil
}

// learnLegacy tells G0 from G1 (step B).
func learnLegacy(ctx context.Context, addr string, timeout time.Duration) (StoreInfo, error) {
	got, closed, err := exchange(ctx, addr, timeout, probeLegacy, 9)
	switch {
	case err != nil:
		return StoreInfo{}, err
	case !closed && len(got) == 9 && got[8] == 1:
		return StoreInfo{Gen: protocol.G1, Backend: protocol.BackendLegacy}, nil
	case closed && len(got) == 8:
		return StoreInfo{Gen: protocol.G0, Backend: protocol.BackendLegacy}, nil
	}
	return StoreInfo{}, fmt.Errorf("unexpected answer %x (closed %v) to GETNUMKEYS, CANCEL_WAIT: not a TCPStore of a known generation", got, closed)
}

// learnBackend tells a G2+ store's backend (step F). libuv checks only the first read of a
// connection for VALIDATE and lets a read that fails the check pass without closing; the next
// read is parsed from its start as ordinary messages. The legacy store closes at once.
func learnBackend(ctx context.Context, addr string, timeout time.Duration) (protocol.Backend, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	end := time.Now().Add(timeout)
	var b [1]byte
	for time.Now().Before(end) {
		if _, err := c.Write(probeG2Steps.cancelWait); err != nil {
			return protocol.BackendLegacy, nil
		}
		c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, err := c.Read(b[:])
		switch {
		case n == 1 && b[0] == 0x01:
			return protocol.BackendLibuv, nil
		case n == 1:
			return 0, fmt.Errorf("unexpected answer %x to CANCEL_WAIT", b[0])
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue
		case err != nil:
			return protocol.BackendLegacy, nil
		}
	}
	return 0, errStoreSlow
}

// storeState is the generation of the store behind the guard in auto mode: unknown until learned,
// and unknown again from the moment the store is seen to go away (a restart may bring another
// torch). Connections that arrive while it is unknown wait for it.
type storeState struct {
	mu    sync.Mutex
	info  StoreInfo
	known bool
	ready chan struct{} // closed while known; a new one replaces it when the store goes away
}

func newStoreState() *storeState { return &storeState{ready: make(chan struct{})} }

func (s *storeState) get() (StoreInfo, bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info, s.known, s.ready
}

func (s *storeState) set(i StoreInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.info, s.known = i, true
	close(s.ready)
}

func (s *storeState) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known {
		s.known, s.ready = false, make(chan struct{})
	}
}

// await returns the store's generation once known, or false after timeout or when stop closes.
func (s *storeState) await(timeout time.Duration, stop <-chan struct{}) (StoreInfo, bool) {
	info, known, ready := s.get()
	if known {
		return info, true
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ready:
		info, known, _ = s.get()
		return info, known
	case <-t.C:
	case <-stop:
	}
	return StoreInfo{}, false
}

// learnStore keeps the store's generation known while ctx lives: it asks the store (retrying a
// store that is not up, slow or busy, every 50 ms to 1 s) and, while the answer holds, keeps one
// idle connection to it, a sentinel, whose close says the store went away; then it forgets and
// asks again.
func (s *Server) learnStore(ctx context.Context, state *storeState, addr string) {
	const probeTimeout = 3 * time.Second
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		sentinel, info, err := learnOnce(ctx, addr, probeTimeout)
		if err != nil {
			s.m.storeProbes.WithLabelValues("failed").Inc()
			if ctx.Err() == nil && s.dialLog.allow(s.now()) {
				s.log.Info("auto: the store's generation is not known yet; new connections wait for it", "upstream", addr, "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		s.m.storeProbes.WithLabelValues("learned").Inc()
		state.set(info)
		if ctx.Err() == nil {
			s.m.setStore(info, true)
		}
		lim := s.set.Load().decoderFor(info).Limits
		s.log.Info("auto: the store speaks "+info.String(), "upstream", addr,
			"max-value-bytes", lim.MaxValueBytes, "max-message-bytes", lim.MaxMessageBytes)
		stop := context.AfterFunc(ctx, func() { sentinel.Close() })
		var b [1]byte
		_, err = sentinel.Read(b[:]) // blocks while the store lives
		stop()
		sentinel.Close()
		state.forget()
		if ctx.Err() == nil {
			s.storeGone()
			s.m.setStore(info, false)
			s.log.Warn("auto: the store closed the guard's connection (a restart?); new connections wait until its generation is learned again",
				"upstream", addr, "err", err)
		}
	}
}

// learnOnce connects the sentinel, then asks the store (LearnStore). The sentinel comes first, so
// that a store that goes away at any moment after the answer's first byte has closed it. It
// sends nothing: an idle connection costs no store anything, and nothing sent can be misread.
func learnOnce(ctx context.Context, addr string, timeout time.Duration) (net.Conn, StoreInfo, error) {
	d := net.Dialer{Timeout: timeout, KeepAlive: 15 * time.Second}
	sentinel, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, StoreInfo{}, err
	}
	info, err := LearnStore(ctx, addr, timeout)
	if err != nil {
		sentinel.Close()
		return nil, StoreInfo{}, err
	}
	return sentinel, info, nil
}

// Store reports the generation and backend of the store as learned in auto mode; ok is false
// while it is not known (and always with a generation configured).
func (s *Server) Store() (info StoreInfo, ok bool) {
	info, ok, _ = s.store.Load().get()
	return info, ok
}

// startLearning starts learning the store's generation anew for the current settings (auto
// mode): at Serve, and on a reload that switches to auto or changes the upstream. What was known
// of the old upstream is dropped; with a generation configured nothing is learned.
func (s *Server) startLearning() {
	s.learnMu.Lock()
	defer s.learnMu.Unlock()
	// The settings as they are now, read under learnMu: a reload racing Serve's start (Serve
	// holding older settings, the reload finding no learnCtx yet) still starts learning.
	st := s.set.Load()
	if s.learnCancel != nil {
		s.learnCancel()
		s.learnCancel = nil
	}
	state := newStoreState()
	s.store.Store(state)
	s.m.setStore(StoreInfo{}, false)
	if st.dec.Gen.Auto && s.learnCtx != nil {
		ctx, cancel := context.WithCancel(s.learnCtx)
		s.learnCancel = cancel
		go s.learnStore(ctx, state, st.cfg.Upstream)
	}
}
