package storeinfo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// Info is what the guard learned about the store behind it by asking it (Learn).
type Info struct {
	Gen     protocol.Generation
	Backend protocol.Backend // legacy or libuv; G0/G1 stores are legacy
}

func (i Info) String() string { return i.Gen.String() + " (" + i.Backend.String() + ")" }

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

// Learn asks the store at addr which generation and backend it speaks, with messages that
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
func Learn(ctx context.Context, addr string, timeout time.Duration) (Info, error) {
	got, closed, err := exchange(ctx, addr, timeout, probeG2Steps.a, 12)
	if err != nil {
		return Info{}, err
	}
	switch {
	case closed && len(got) == 0:
		return learnLegacy(ctx, addr, timeout)
	case closed && len(got) == 8:
		b, err := learnBackend(ctx, addr, timeout)
		return Info{Gen: protocol.G2, Backend: b}, err
	case !closed && len(got) == 12 && bytes.Equal(got[8:], probeNonce[:]):
	default:
		return Info{}, fmt.Errorf("unexpected answer %x (closed %v) to VALIDATE, GETNUMKEYS, PING: not a TCPStore of a known generation", got, closed)
	}
	backend, err := learnBackend(ctx, addr, timeout)
	if err != nil {
		return Info{}, err
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
		return Info{}, err
	}
	if listKeys {
		g6, err := g3(probeG2Steps.barrier, 4+1+8)
		if g6 {
			return Info{Gen: protocol.G6, Backend: backend}, nil
		}
		return Info{Gen: protocol.G5, Backend: backend}, err
	}
	if backend == protocol.BackendLibuv {
		g4, err := g3(probeG2Steps.queueLen, 12)
		if g4 {
			return Info{Gen: protocol.G4, Backend: backend}, nil
		}
		return Info{Gen: protocol.G3, Backend: backend}, err
	}
	return Info{Gen: protocol.G3, Backend: backend}, nil
}

// learnLegacy tells G0 from G1 (step B).
func learnLegacy(ctx context.Context, addr string, timeout time.Duration) (Info, error) {
	got, closed, err := exchange(ctx, addr, timeout, probeLegacy, 9)
	switch {
	case err != nil:
		return Info{}, err
	case !closed && len(got) == 9 && got[8] == 1:
		return Info{Gen: protocol.G1, Backend: protocol.BackendLegacy}, nil
	case closed && len(got) == 8:
		return Info{Gen: protocol.G0, Backend: protocol.BackendLegacy}, nil
	}
	return Info{}, fmt.Errorf("unexpected answer %x (closed %v) to GETNUMKEYS, CANCEL_WAIT: not a TCPStore of a known generation", got, closed)
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
