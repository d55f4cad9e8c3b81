package bench

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"

	"github.com/storeguard/storeguard/protocol"
)

// FakeStore is a small in-memory TCPStore server for unit tests and as a connection sink for
// memory measurements. It frames requests with package protocol and answers SET, GET, ADD,
// CHECK, WAIT (blocking until the keys exist), GETNUMKEYS, DELETE_KEY, COMPARE_SET, APPEND,
// MULTI_GET, MULTI_SET, VALIDATE and PING as the real store does. A GET of a missing key closes
// the connection (the real legacy store fails it too). It is no proof of compatibility: that
// is what the interop suite and the side-by-side script against real torch are for.
type FakeStore struct {
	gen protocol.Generation
	ln  net.Listener

	mu      sync.Mutex
	data    map[string][]byte
	waiters map[string][]*fakeWaiter
	conns   map[net.Conn]struct{}

	accepted atomic.Int64
	messages atomic.Int64
	wg       sync.WaitGroup
}

type fakeWaiter struct {
	c    *fakeConn
	keys []string
}

type fakeConn struct {
	c  net.Conn
	mu sync.Mutex // replies come from the connection's reader and from SETs of other connections
}

func (fc *fakeConn) write(b []byte) {
	fc.mu.Lock()
	fc.c.Write(b)
	fc.mu.Unlock()
}

// NewFakeStore serves generation gen on ln until Close.
func NewFakeStore(ln net.Listener, gen protocol.Generation) *FakeStore {
	s := &FakeStore{gen: gen, ln: ln, data: make(map[string][]byte),
		waiters: make(map[string][]*fakeWaiter), conns: make(map[net.Conn]struct{})}
	s.wg.Go(s.acceptLoop)
	return s
}

// Addr is the listening address.
func (s *FakeStore) Addr() string { return s.ln.Addr().String() }

// Accepted is the number of connections accepted so far.
func (s *FakeStore) Accepted() int64 { return s.accepted.Load() }

// Messages is the number of requests handled so far.
func (s *FakeStore) Messages() int64 { return s.messages.Load() }

// Get returns a key's value.
func (s *FakeStore) Get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[key]
	return v, ok
}

// Close stops accepting, closes every connection and waits for the handlers.
func (s *FakeStore) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *FakeStore) acceptLoop() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.accepted.Add(1)
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() { s.serveConn(c) })
	}
}

func (s *FakeStore) serveConn(c net.Conn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	fc := &fakeConn{c: c}
	dec := protocol.NewDecoder(protocol.Config{Gen: protocol.GenSetting{Gen: s.gen}, Limits: protocol.DefaultLimits()})
	buf := make([]byte, 4096)
	var cur []byte // bytes of the message in progress
	for {
		n, err := c.Read(buf)
		p := buf[:n]
		for len(p) > 0 {
			used, msg, verr := dec.Scan(p)
			if verr != nil {
				return
			}
			cur = append(cur, p[:used]...)
			p = p[used:]
			if msg == nil {
				continue
			}
			req, perr := protocol.ParseRequest(msg.Op, cur)
			if perr != nil {
				return
			}
			s.messages.Add(1) // before the reply, so a client that has it sees the count
			if !s.handle(fc, req) {
				return
			}
			cur = cur[:0]
		}
		if err != nil {
			return
		}
	}
}

func appendI64(b []byte, v int64) []byte { return binary.LittleEndian.AppendUint64(b, uint64(v)) }

// handle answers one request; it reports whether the connection lives on.
func (s *FakeStore) handle(fc *fakeConn, r protocol.Request) bool {
	var out []byte
	s.mu.Lock()
	switch r.Op {
	case protocol.OpValidate:
	case protocol.OpPing:
		out = binary.LittleEndian.AppendUint32(out, r.U32)
	case protocol.OpSet:
		s.setLocked(string(r.Key), r.Value)
	case protocol.OpAppend:
		s.setLocked(string(r.Key), append(append([]byte(nil), s.data[string(r.Key)]...), r.Value...))
	case protocol.OpCompareSet:
		cur, ok := s.data[string(r.Key)]
		switch {
		case !ok && len(r.Value) == 0, ok && string(cur) == string(r.Value):
			s.setLocked(string(r.Key), r.Desired)
			out = protocol.AppendBytes(out, r.Desired)
		case !ok:
			out = protocol.AppendBytes(out, r.Value)
		default:
			out = protocol.AppendBytes(out, cur)
		}
	case protocol.OpGet:
		v, ok := s.data[string(r.Key)]
		if !ok {
			s.mu.Unlock()
			return false
		}
		out = protocol.AppendBytes(out, v)
	case protocol.OpAdd:
		var cur int64
		if v, ok := s.data[string(r.Key)]; ok && len(v) == 8 {
			cur = int64(binary.LittleEndian.Uint64(v))
		}
		cur += r.Int
		// The real store keeps the decimal string; the fake keeps 8 bytes, which GET returns.
		s.setLocked(string(r.Key), appendI64(nil, cur))
		out = appendI64(out, cur)
	case protocol.OpGetNumKeys:
		out = appendI64(out, int64(len(s.data)))
	case protocol.OpDeleteKey:
		_, ok := s.data[string(r.Key)]
		delete(s.data, string(r.Key))
		out = appendI64(out, map[bool]int64{true: 1}[ok])
	case protocol.OpCheck:
		out = append(out, map[bool]byte{true: 0, false: 1}[s.haveLocked(r.Keys)]) // READY = 0
	case protocol.OpWait:
		if s.haveLocked(r.Keys) {
			out = append(out, 0) // STOP_WAITING
			break
		}
		w := &fakeWaiter{c: fc}
		for _, k := range r.Keys {
			w.keys = append(w.keys, string(k))
			s.waiters[string(k)] = append(s.waiters[string(k)], w)
		}
	case protocol.OpMultiGet:
		for _, k := range r.Keys {
			v, ok := s.data[string(k)]
			if !ok {
				s.mu.Unlock()
				return false
			}
			out = protocol.AppendBytes(out, v)
		}
	case protocol.OpMultiSet:
		for i, k := range r.Keys {
			s.setLocked(string(k), r.Values[i])
		}
	default:
		s.mu.Unlock()
		return false
	}
	s.mu.Unlock()
	if len(out) > 0 {
		fc.write(out)
	}
	return true
}

func (s *FakeStore) haveLocked(keys [][]byte) bool {
	for _, k := range keys {
		if _, ok := s.data[string(k)]; !ok {
			return false
		}
	}
	return true
}

// setLocked stores a value and releases the waiters whose keys now all exist.
func (s *FakeStore) setLocked(key string, v []byte) {
	s.data[key] = append([]byte(nil), v...)
	ws := s.waiters[key]
	delete(s.waiters, key)
	for _, w := range ws {
		ready := true
		for _, k := range w.keys {
			if _, ok := s.data[k]; !ok {
				ready = false
			}
		}
		// A waiter still missing a key stays registered under that key.
		if ready {
			go w.c.write([]byte{0}) // STOP_WAITING; not under s.mu: a slow reader must not stall the store
		}
	}
}
