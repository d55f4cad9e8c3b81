// Package storesim is a TCPStore server of a chosen generation and backend for tests: it frames
// each connection with a decoder of its generation, answers as real torch does (replies, closes,
// the libuv backend's first-read VALIDATE check), and records every byte each connection sent.
// The interop suite runs real torch; this is the stand-in for unit and fuzz tests. A recorder
// (StartRecorder) only records: the one fake store for tests that must see every byte the guard
// forwards, whatever it means to a store.
//
// What it follows of real stores (docs/protocol.md, docs/protocol-confirmed.md): an unknown
// opcode or a length a store cannot take closes the connection; a G2+ legacy store closes a
// connection whose first message is not VALIDATE; a G2+ libuv store lets such a first read pass
// and parses the next read from its start; a legacy GET of a missing key closes the connection.
// It keeps the first MaxRecordedFields fields of a list op only.
package storesim

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// Store is a running simulated store.
type Store struct {
	Gen     protocol.Generation
	Backend protocol.Backend
	// Ended receives, when a connection ends, everything it sent (dropped while 64 wait unread).
	Ended chan []byte

	ln     net.Listener
	record bool // a recorder (StartRecorder)
	mu     sync.Mutex
	paused bool
	resume *sync.Cond
	reply  []byte
	answer *protocol.GenSetting
	conns  []*conn
	// Settle's own connection: its address, and where it came in the accept order (-1: not yet).
	marker   netip.AddrPort
	markerAt int
	settled  int // connections accepted before the previous Settle's own
	open     map[net.Conn]struct{}
	data     map[string][]byte
	waiters  map[net.Conn][]string
}

// conn is what the store keeps of one accepted connection.
type conn struct {
	received bytes.Buffer
	ended    bool
}

// Start listens on addr ("127.0.0.1:0" for any port) and serves until Close.
func Start(addr string, gen protocol.Generation, backend protocol.Backend) (*Store, error) {
	if gen < protocol.G2 {
		backend = protocol.BackendLegacy
	}
	return start(addr, &Store{Gen: gen, Backend: backend})
}

// StartT starts a simulated store for test t, which closes it when t ends; a store that cannot
// start fails t.
func StartT(t testing.TB, addr string, gen protocol.Generation, backend protocol.Backend) *Store {
	t.Helper()
	s, err := Start(addr, gen, backend)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// StartRecorder listens on addr and records what each connection sends: it closes a connection
// only when the peer does (or at Close). It answers each read with what SetReply set, nothing by
// default, or, after Answer, each complete request with the shortest reply a store gives it. Gen and Backend are unused.
func StartRecorder(addr string) (*Store, error) {
	return start(addr, &Store{record: true})
}

func start(addr string, s *Store) (*Store, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s.ln, s.Ended, s.markerAt = ln, make(chan []byte, 64), -1
	s.open, s.data, s.waiters = map[net.Conn]struct{}{}, map[string][]byte{}, map[net.Conn][]string{}
	s.resume = sync.NewCond(&s.mu)
	go s.serve()
	return s, nil
}

// Answer makes a recorder answer each complete request of the connections it accepts from now on
// as a store of generation gen would, with the shortest reply (empty values, no keys, WAITs
// satisfied at once), until a message it cannot read: for a guard that lets a client pipeline
// only so many requests awaiting replies (limits.max-pending-replies).
func (s *Store) Answer(gen protocol.GenSetting) {
	s.mu.Lock()
	s.answer = &gen
	s.mu.Unlock()
}

// SetReply makes a recorder answer every read from now on with b (nil: nothing).
func (s *Store) SetReply(b []byte) {
	s.mu.Lock()
	s.reply = append([]byte(nil), b...)
	s.mu.Unlock()
}

// Addr is the listening address.
func (s *Store) Addr() string { return s.ln.Addr().String() }

// Close stops the store as a process exit does: the listener and every connection close.
func (s *Store) Close() {
	s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.open {
		c.Close()
	}
	s.paused = false
	s.resume.Broadcast()
}

// Pause makes the store stop answering and reading (each connection's read in progress still
// arrives), as a busy or frozen store; Resume lets it go on.
func (s *Store) Pause() {
	s.mu.Lock()
	s.paused = true
	s.mu.Unlock()
}

func (s *Store) Resume() {
	s.mu.Lock()
	s.paused = false
	s.resume.Broadcast()
	s.mu.Unlock()
}

// NumConns is how many connections the store accepted.
func (s *Store) NumConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// NumOpen is how many of the connections the store accepted are open now (the store has not seen
// them end).
func (s *Store) NumOpen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.open)
}

// Received returns what connection i (in accept order) sent so far; nil if there is no such
// connection.
func (s *Store) Received(i int) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= len(s.conns) {
		return nil
	}
	return append([]byte(nil), s.conns[i].received.Bytes()...)
}

// ReceivedLen is how many bytes connection i (in accept order) sent so far: a cheap wait for a
// large transfer, where Received copies every byte.
func (s *Store) ReceivedLen(i int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= len(s.conns) {
		return 0
	}
	return s.conns[i].received.Len()
}

// Forget drops what ended connections sent (Received is then empty for them; NumConns still
// counts them), for a fuzz target that takes each connection's bytes from Ended and runs for
// long.
func (s *Store) Forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		if c.ended {
			c.received = bytes.Buffer{}
		}
	}
}

// Settle waits until the store has accepted every connection made to it before the call, and
// returns the accept-order numbers [from, to) of those it accepted since the previous Settle (or
// Start): a test that made a connection through a guard learns so which store connections the
// guard made for it, none included. The kernel accepts connections in the order they were
// established, so Settle makes one of its own (not counted or recorded) and waits for it to be
// accepted. Calls must not overlap.
func (s *Store) Settle(timeout time.Duration) (from, to int, err error) {
	ip := s.ln.Addr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	d := net.Dialer{Timeout: timeout, Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) { err = s.bindMarker(int(fd), ip) }); cerr != nil {
			return cerr
		}
		return err
	}}
	m, err := d.Dial("tcp", s.Addr())
	if err != nil {
		return 0, 0, err
	}
	defer m.Close()
	for end := time.Now().Add(timeout); ; time.Sleep(50 * time.Microsecond) {
		s.mu.Lock()
		if at := s.markerAt; at >= 0 {
			from, s.settled, s.markerAt = s.settled, at, -1
			s.mu.Unlock()
			return from, at, nil
		}
		s.mu.Unlock()
		if time.Now().After(end) {
			return 0, 0, errors.New("storesim: the store did not accept Settle's connection in time")
		}
	}
}

// bindMarker binds Settle's socket before it connects, so that serve knows it by its address.
func (s *Store) bindMarker(fd int, ip netip.Addr) error {
	var sa syscall.Sockaddr = &syscall.SockaddrInet6{Addr: ip.As16()}
	if ip.Is4() {
		sa = &syscall.SockaddrInet4{Addr: ip.As4()}
	}
	if err := syscall.Bind(fd, sa); err != nil {
		return err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return err
	}
	var port int
	switch sa := sa.(type) {
	case *syscall.SockaddrInet4:
		port = sa.Port
	case *syscall.SockaddrInet6:
		port = sa.Port
	}
	s.mu.Lock()
	s.marker, s.markerAt = netip.AddrPortFrom(ip, uint16(port)), -1
	s.mu.Unlock()
	return nil
}

// Wait waits until connection i (in accept order) has ended and returns what it sent.
func (s *Store) Wait(i int, timeout time.Duration) ([]byte, error) {
	for end := time.Now().Add(timeout); ; time.Sleep(100 * time.Microsecond) {
		s.mu.Lock()
		if i < len(s.conns) && s.conns[i].ended {
			b := append([]byte(nil), s.conns[i].received.Bytes()...)
			s.mu.Unlock()
			return b, nil
		}
		s.mu.Unlock()
		if time.Now().After(end) {
			return nil, errors.New("storesim: connection " + strconv.Itoa(i) + " did not end in time")
		}
	}
}

// NumKeys is the number of keys stored.
func (s *Store) NumKeys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.data)
}

func (s *Store) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		rec := &conn{}
		s.mu.Lock()
		if from := c.RemoteAddr().(*net.TCPAddr).AddrPort(); s.marker.IsValid() &&
			netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) == s.marker {
			s.marker, s.markerAt = netip.AddrPort{}, len(s.conns)
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns = append(s.conns, rec)
		s.open[c] = struct{}{}
		s.mu.Unlock()
		if s.record {
			go s.recordConn(c, rec)
		} else {
			go s.simulateConn(c, rec)
		}
	}
}

// read reads from c into b and records it, then waits while the store is paused.
func (s *Store) read(c net.Conn, rec *conn, b []byte) (int, error) {
	n, err := c.Read(b)
	if n > 0 {
		s.mu.Lock()
		rec.received.Write(b[:n])
		for s.paused {
			s.resume.Wait()
		}
		s.mu.Unlock()
	}
	return n, err
}

// end closes c and reports what it sent on Ended.
func (s *Store) end(c net.Conn, rec *conn) {
	c.Close()
	s.mu.Lock()
	delete(s.open, c)
	delete(s.waiters, c)
	rec.ended = true
	b := append([]byte(nil), rec.received.Bytes()...)
	s.mu.Unlock()
	select {
	case s.Ended <- b:
	default:
	}
}

// recordConn serves a recorder's connection until the peer closes it.
func (s *Store) recordConn(c net.Conn, rec *conn) {
	defer s.end(c, rec)
	rb := make([]byte, 64<<10)
	s.mu.Lock()
	answer := s.answer
	s.mu.Unlock()
	var dec protocol.Decoder
	if answer != nil {
		lim := protocol.Limits{MaxKeyBytes: 1 << 62, MaxValueBytes: 1 << 62, MaxKeys: 1 << 62, MaxMessageBytes: 1 << 62}
		dec.Reset(protocol.Config{Gen: *answer, Limits: lim})
	}
	var out []byte
	for {
		n, err := s.read(c, rec, rb)
		if n > 0 {
			s.mu.Lock()
			reply := s.reply
			s.mu.Unlock()
			out = out[:0]
			for p := rb[:n]; answer != nil && len(p) > 0 && dec.Err() == nil; {
				k, msg, _ := dec.Scan(p)
				p = p[k:]
				if msg != nil {
					out = append(out, shortestReply(msg)...)
				}
			}
			if len(reply) > 0 {
				out = reply
			}
			if len(out) > 0 {
				c.Write(out)
			}
		}
		if err != nil {
			return
		}
	}
}

// limits are the store's own: libuv's, or none for legacy (a length no allocation can take,
// 2^40 here, closes the connection as bad_alloc or length_error does).
func (s *Store) limits() protocol.Limits {
	if s.Backend == protocol.BackendLibuv {
		return protocol.Limits{MaxKeyBytes: 8192, MaxValueBytes: 8 << 20, MaxKeys: 128 << 10, MaxMessageBytes: protocol.MaxLimit}
	}
	return protocol.Limits{MaxKeyBytes: protocol.MaxLimit, MaxValueBytes: protocol.MaxLimit, MaxKeys: protocol.MaxLimit,
		MaxMessageBytes: protocol.MaxLimit}
}

// simulateConn serves a simulated store's connection as a store of its generation would.
func (s *Store) simulateConn(c net.Conn, rec *conn) {
	defer s.end(c, rec)
	dec := protocol.NewDecoder(protocol.Config{Gen: protocol.GenSetting{Gen: s.Gen}, Backend: s.Backend, Limits: s.limits()})
	var pending []byte // bytes from the start of the message in progress
	scanned := 0       // of pending, what dec has been fed
	firstRead := true
	rb := make([]byte, 64<<10)
	for {
		n, err := s.read(c, rec, rb)
		if n > 0 {
			pending = append(pending, rb[:n]...)
			if firstRead && s.Gen.Validated() && s.Backend == protocol.BackendLibuv && pending[0] != 0 {
				// libuv: the first read's first command is not VALIDATE. It returns without
				// closing or consuming; the next read is parsed from the start, as validated.
				dec.Scan(protocol.AppendHandshake(nil, protocol.G2, 0))
				firstRead = false
				continue
			}
			firstRead = false
			if !s.parse(c, dec, &pending, &scanned) {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// parse feeds dec the bytes of *pending after the *scanned it has had, and executes every
// complete message; false: the store closes the connection. A message split across reads stays
// in *pending, scanned, until its end arrives.
func (s *Store) parse(c net.Conn, dec *protocol.Decoder, pending *[]byte, scanned *int) bool {
	for {
		n, msg, err := dec.Scan((*pending)[*scanned:])
		*scanned += n
		if err != nil {
			return false
		}
		if msg == nil {
			return true
		}
		m := (*pending)[:*scanned]
		if !s.exec(c, msg, m) {
			return false
		}
		*pending = append((*pending)[:0], (*pending)[*scanned:]...)
		*scanned = 0
	}
}

func i64(v int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(v)) }

// exec runs one message and writes its reply; false: the store closes the connection.
func (s *Store) exec(c net.Conn, msg *protocol.Message, m []byte) bool {
	f := msg.Recorded()
	body := func(i int) []byte { return msg.Body(f[i], m) }
	s.mu.Lock()
	defer s.mu.Unlock()
	var reply []byte
	switch msg.Op {
	case protocol.OpValidate, protocol.OpWatchKey:
	case protocol.OpPing:
		reply = binary.LittleEndian.AppendUint32(nil, uint32(f[0].Int))
	case protocol.OpSet, protocol.OpQueuePush:
		s.setLocked(string(body(0)), append([]byte(nil), body(1)...))
	case protocol.OpAppend:
		s.setLocked(string(body(0)), append(s.data[string(body(0))], body(1)...))
	case protocol.OpCompareSet:
		k := string(body(0))
		cur, ok := s.data[k]
		switch {
		case !ok && len(body(1)) == 0:
			s.setLocked(k, append([]byte(nil), body(2)...))
			reply = protocol.AppendBytes(nil, body(2))
		case !ok:
			reply = protocol.AppendBytes(nil, body(1))
		default:
			if bytes.Equal(cur, body(1)) {
				s.setLocked(k, append([]byte(nil), body(2)...))
			}
			reply = protocol.AppendBytes(nil, s.data[k])
		}
	case protocol.OpGet:
		v, ok := s.data[string(body(0))]
		if !ok && s.Backend == protocol.BackendLegacy {
			return false // tcpStore_.at(): std::out_of_range
		}
		reply = protocol.AppendBytes(nil, v)
	case protocol.OpAdd:
		k := string(body(0))
		n := int64(f[1].Int)
		if v, ok := s.data[k]; ok {
			old, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return false
			}
			n += old
		}
		s.setLocked(k, []byte(strconv.FormatInt(n, 10)))
		reply = i64(n)
	case protocol.OpCheck:
		reply = []byte{1} // CheckResponseType NOT_READY: one byte, as torch sends it
		if s.allSetLocked(keysOf(f[1:], m, msg)) {
			reply = []byte{0}
		}
	case protocol.OpWait:
		keys := keysOf(f[1:], m, msg)
		if s.allSetLocked(keys) {
			reply = []byte{0}
		} else {
			s.waiters[c] = keys
		}
	case protocol.OpGetNumKeys:
		reply = i64(int64(len(s.data)))
	case protocol.OpDeleteKey:
		_, ok := s.data[string(body(0))]
		delete(s.data, string(body(0)))
		reply = i64(0)
		if ok {
			reply = i64(1)
		}
	case protocol.OpMultiGet:
		for i := 1; i < len(f); i++ {
			reply = protocol.AppendBytes(reply, s.data[string(body(i))])
		}
	case protocol.OpMultiSet:
		for i := 1; i+1 < len(f); i += 2 {
			s.setLocked(string(body(i)), append([]byte(nil), body(i+1)...))
		}
	case protocol.OpCancelWait:
		delete(s.waiters, c)
		reply = []byte{1}
	case protocol.OpQueueLen, protocol.OpQueuePop:
		reply = i64(0)
	case protocol.OpListKeys:
		reply = i64(int64(len(s.data)))
		for k := range s.data {
			reply = protocol.AppendBytes(reply, []byte(k))
		}
	case protocol.OpBarrier:
		k := string(body(0))
		n := int64(1)
		if v, ok := s.data[k]; ok {
			old, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return false
			}
			n = old + 1
		}
		s.setLocked(k, []byte(strconv.FormatInt(n, 10)))
		if n >= int64(f[1].Int) {
			reply = []byte{0}
		} else {
			s.waiters[c] = []string{k}
		}
	default:
		return false
	}
	if len(reply) > 0 {
		if _, err := c.Write(reply); err != nil {
			return false
		}
	}
	return true
}

func keysOf(fields []protocol.Field, m []byte, msg *protocol.Message) []string {
	var keys []string
	for _, f := range fields {
		keys = append(keys, string(msg.Body(f, m)))
	}
	return keys
}

func (s *Store) allSetLocked(keys []string) bool {
	for _, k := range keys {
		if _, ok := s.data[k]; !ok {
			return false
		}
	}
	return true
}

// Set stores v under k, as a client's SET would (a test's write past the guard).
func (s *Store) Set(k string, v []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLocked(k, v)
}

// setLocked stores v under k and wakes the connections waiting only for keys now all set.
func (s *Store) setLocked(k string, v []byte) {
	s.data[k] = v
	for c, keys := range s.waiters {
		if s.allSetLocked(keys) {
			delete(s.waiters, c)
			c.Write([]byte{0})
		}
	}
}

// shortestReply is the shortest reply a store gives m (docs/protocol.md, the response column).
func shortestReply(m *protocol.Message) []byte {
	switch m.Op {
	case protocol.OpAdd, protocol.OpGetNumKeys, protocol.OpDeleteKey, protocol.OpQueueLen,
		protocol.OpGet, protocol.OpCompareSet, protocol.OpQueuePop, protocol.OpListKeys:
		return make([]byte, 8) // a zero, an empty value, an empty queue, no keys
	case protocol.OpCheck, protocol.OpWait, protocol.OpBarrier:
		return []byte{0}
	case protocol.OpCancelWait:
		return []byte{1}
	case protocol.OpPing:
		return make([]byte, 4)
	case protocol.OpMultiGet:
		return make([]byte, 8*m.Count)
	}
	return nil
}
