package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
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
	probeValidate = []byte{0x00, 0xCE, 0xF7, 0x85, 0x3C}
	// probePing is PING with nonce 0xffffffff: its bytes 1-3 make the G0/G1 key length >= 2^63.
	probePing = []byte{0x0D, 0xFF, 0xFF, 0xFF, 0xFF}
	// probeKey names the key of the BARRIER and QUEUE_LEN probes, which no job uses.
	probeKey = []byte("storeguard/generation-probe")
)

// Wire bytes of the G2+ operations the probes use (G2+ numbering).
const (
	wireG2GetNumKeys = 0x07
	wireG2DeleteKey  = 0x08
	wireG2CancelWait = 0x0C
	wireG2QueueLen   = 0x10
	wireG2ListKeys   = 0x11
	wireG2Barrier    = 0x12
	wireG0GetNumKeys = 0x06
	wireG1CancelWait = 0x0B
)

func keyBytes(b []byte, k []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(k)))
	return append(b, k...)
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
// every generation handles without harm (see probeValidate). Each answer is positive evidence:
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
	a := append(append(append([]byte(nil), probeValidate...), wireG2GetNumKeys), probePing...)
	got, closed, err := exchange(ctx, addr, timeout, a, 12)
	if err != nil {
		return StoreInfo{}, err
	}
	switch {
	case closed && len(got) == 0:
		return learnLegacy(ctx, addr, timeout)
	case closed && len(got) == 8:
		b, err := learnBackend(ctx, addr, timeout)
		return StoreInfo{Gen: protocol.G2, Backend: b}, err
	case !closed && len(got) == 12 && bytes.Equal(got[8:], probePing[1:]):
	default:
		return StoreInfo{}, fmt.Errorf("unexpected answer %x (closed %v) to VALIDATE, GETNUMKEYS, PING: not a TCPStore of a known generation", got, closed)
	}
	backend, err := learnBackend(ctx, addr, timeout)
	if err != nil {
		return StoreInfo{}, err
	}
	g3 := func(op []byte, want int) (bool, error) { // true: the store answered the op after PING
		msg := append(append(append([]byte(nil), probeValidate...), probePing...), op...)
		got, closed, err := exchange(ctx, addr, timeout, msg, want)
		switch {
		case err != nil:
			return false, err
		case !closed && len(got) == want && bytes.Equal(got[:4], probePing[1:]):
			return true, nil
		case closed && len(got) == 4:
			return false, nil
		}
		return false, fmt.Errorf("unexpected answer %x (closed %v) to op %#x after PING", got, closed, op[0])
	}
	listKeys, err := g3([]byte{wireG2ListKeys}, 12)
	if err != nil {
		return StoreInfo{}, err
	}
	if listKeys {
		barrier := keyBytes([]byte{wireG2Barrier}, probeKey)
		barrier = binary.LittleEndian.AppendUint64(barrier, 1)
		barrier = keyBytes(append(barrier, wireG2DeleteKey), probeKey)
		g6, err := g3(barrier, 4+1+8)
		if g6 {
			return StoreInfo{Gen: protocol.G6, Backend: backend}, nil
		}
		return StoreInfo{Gen: protocol.G5, Backend: backend}, err
	}
	if backend == protocol.BackendLibuv {
		g4, err := g3(keyBytes([]byte{wireG2QueueLen}, probeKey), 12)
		if g4 {
			return StoreInfo{Gen: protocol.G4, Backend: backend}, nil
		}
		return StoreInfo{Gen: protocol.G3, Backend: backend}, err
	}
	return StoreInfo{Gen: protocol.G3, Backend: backend}, nil
}

// learnLegacy tells G0 from G1 (step B).
func learnLegacy(ctx context.Context, addr string, timeout time.Duration) (StoreInfo, error) {
	got, closed, err := exchange(ctx, addr, timeout, []byte{wireG0GetNumKeys, wireG1CancelWait}, 9)
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
		if _, err := c.Write([]byte{wireG2CancelWait}); err != nil {
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
// store that is not up, slow or busy, every 50 ms to 1 s), then holds one idle connection to it,
// a sentinel, whose close says the store went away; then it forgets and asks again.
func (s *Server) learnStore(ctx context.Context, state *storeState, addr string) {
	const probeTimeout = 3 * time.Second
	for ctx.Err() == nil {
		var info StoreInfo
		for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
			var err error
			info, err = LearnStore(ctx, addr, probeTimeout)
			if err == nil {
				break
			}
			s.m.storeProbes.WithLabelValues("failed").Inc()
			if ctx.Err() != nil {
				return
			}
			if s.dialLog.allow(s.now()) {
				s.log.Info("auto: the store's generation is not known yet; new connections wait for it", "upstream", addr, "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
		}
		s.m.storeProbes.WithLabelValues("learned").Inc()
		sentinel, err := openSentinel(ctx, addr, info, probeTimeout)
		if err != nil {
			s.log.Info("auto: the store went away while its generation was learned; asking again", "err", err)
			continue
		}
		state.set(info)
		if ctx.Err() == nil {
			s.m.setStore(info, true)
		}
		s.log.Info("auto: the store speaks "+info.String(), "upstream", addr)
		stop := context.AfterFunc(ctx, func() { sentinel.Close() })
		var b [1]byte
		_, err = sentinel.Read(b[:]) // blocks while the store lives
		stop()
		sentinel.Close()
		state.forget()
		if ctx.Err() == nil {
			s.m.setStore(info, false)
		}
		if ctx.Err() == nil {
			s.log.Warn("auto: the store closed the guard's connection (a restart?); new connections wait until its generation is learned again",
				"upstream", addr, "err", err)
		}
	}
}

// openSentinel opens the idle connection whose close tells learnStore the store went away. It is
// a client like any other: a G2+ store gets its handshake.
func openSentinel(ctx context.Context, addr string, info StoreInfo, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout, KeepAlive: 15 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if info.Gen >= protocol.G2 {
		hs := append([]byte(nil), probeValidate...)
		want := 0
		if info.Gen >= protocol.G3 {
			hs, want = append(hs, probePing...), 4
		}
		c.SetDeadline(time.Now().Add(timeout))
		_, err = c.Write(hs)
		if err == nil && want > 0 {
			_, err = io.ReadFull(c, make([]byte, want))
		}
		c.SetDeadline(time.Time{})
		if err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Store reports the generation and backend of the store as learned in auto mode; ok is false
// while it is not known (and always with a generation configured).
func (s *Server) Store() (info StoreInfo, ok bool) {
	info, ok, _ = s.store.Load().get()
	return info, ok
}

// startLearning starts learning the store's generation anew for settings st (auto mode): at
// Serve, and on a reload that switches to auto or changes the upstream. What was known of the
// old upstream is dropped; with a generation configured nothing is learned.
func (s *Server) startLearning(st *settings) {
	s.learnMu.Lock()
	defer s.learnMu.Unlock()
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
