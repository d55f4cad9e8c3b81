package tlsrelay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// A relay's state lives in a slot of a ledger: plain memory, or memory shared with a keeper
// (NewSharedLedger), which then holds every relay's state as of the last record each direction
// finished. Each direction writes its own half of the slot, and only that goroutine does:
// a half has two copies and an index, the copy not in use is written and then the index
// switched, so that a process killed at any instruction leaves one whole state behind.
//
// The state says where each direction stands in its two byte streams (how many bytes it had
// consumed from its source and written to its destination at that record's end); the sockets'
// own counters (counters_linux.go) say where they stand now. The difference is exactly what
// the dead process did after its last record: a record written in part, or consumed but not
// yet counted. Resume finishes that and goes on.

// Dir is one direction's state at the end of its last record.
type Dir struct {
	Secret []byte // the direction's traffic secret
	Seq    uint64 // the next record's sequence number
	// From: bytes consumed from the source socket; To: bytes written to the destination (the
	// sockets' counters, not counting the handshake's, which the relay started after).
	From, To uint64
	// Updates: for the read direction, the KeyUpdates the peer asked for; for the write
	// direction, those answered (one answer covers all asked so far).
	Updates uint64
	// Ended: the end went on (close_notify or end of stream, passed on as a half-close).
	Ended bool
	// Intent (write direction only): the record being written when this state was saved, not
	// counted in it yet: 'd' application data of IntentLen plaintext bytes at the start of the
	// source, 'k' a KeyUpdate, 'c' close_notify; 0 none.
	Intent    byte
	IntentLen uint32
}

// State is a relay's whole state: its connection id (the slot's owner), its suite and both
// directions. In reads the TLS side and writes the plaintext side; Out the other way.
type State struct {
	ID      uint64
	Suite   uint16
	In, Out Dir
	// Rx is what the read direction had read past In.From (the start of a record) when the
	// state was taken for an upgrade; with a keeper it stays in the slot's ring.
	// An upgrade sends it as bytes after its packet.
	Rx []byte `json:"-"`
}

const (
	maxSecret = 48
	dirSize   = 96
	// ringSize is the bytes of a slot's ring, where the read direction reads records: at least
	// one whole record.
	ringSize = 20 << 10
	offRing  = 512
	// SlotSize is the bytes of a ledger's slot.
	SlotSize = offRing + ringSize
	offID    = 0
	offSuite = 8
	offInIx  = 16
	offOutIx = 20
	offDirs  = 24 // In's two copies, then Out's
)

// slot is one relay's state in memory.
type slot []byte

func (s slot) ix(out bool) *uint32 {
	off := offInIx
	if out {
		off = offOutIx
	}
	return (*uint32)(unsafe.Pointer(&s[off]))
}

func (s slot) dirCopy(out bool, i uint32) []byte {
	off := offDirs + int(i)*dirSize
	if out {
		off += 2 * dirSize
	}
	return s[off : off+dirSize]
}

func (s slot) ring() []byte { return s[offRing : offRing+ringSize] }

// save writes d as the direction's state: the copy not in use, then the index.
func (s slot) save(out bool, d *Dir) {
	ix := s.ix(out)
	next := 1 - atomic.LoadUint32(ix)&1
	b := s.dirCopy(out, next)
	clear(b)
	b[0] = byte(len(d.Secret))
	copy(b[8:8+maxSecret], d.Secret)
	le := binary.LittleEndian
	le.PutUint64(b[56:], d.Seq)
	le.PutUint64(b[64:], d.From)
	le.PutUint64(b[72:], d.To)
	le.PutUint64(b[80:], d.Updates)
	if d.Ended {
		b[88] = 1
	}
	b[89] = d.Intent
	le.PutUint32(b[92:], d.IntentLen)
	atomic.StoreUint32(ix, next)
}

func (s slot) load(out bool) (Dir, error) {
	b := s.dirCopy(out, atomic.LoadUint32(s.ix(out))&1)
	le := binary.LittleEndian
	if b[0] > maxSecret {
		return Dir{}, errors.New("tlsrelay: a state with a secret too long")
	}
	return Dir{Secret: append([]byte(nil), b[8:8+int(b[0])]...), Seq: le.Uint64(b[56:]), From: le.Uint64(b[64:]),
		To: le.Uint64(b[72:]), Updates: le.Uint64(b[80:]), Ended: b[88] == 1, Intent: b[89], IntentLen: le.Uint32(b[92:])}, nil
}

// init gives the slot to a relay: its id and suite, and both directions' first states.
func (s slot) init(st *State) {
	clear(s[:offRing])
	binary.LittleEndian.PutUint64(s[offID:], st.ID)
	binary.LittleEndian.PutUint16(s[offSuite:], st.Suite)
	s.save(false, &st.In)
	s.save(true, &st.Out)
}

// state reads the slot's whole state.
func (s slot) state() (State, error) {
	st := State{ID: binary.LittleEndian.Uint64(s[offID:]), Suite: binary.LittleEndian.Uint16(s[offSuite:])}
	var err error
	if st.In, err = s.load(false); err != nil {
		return st, err
	}
	st.Out, err = s.load(true)
	return st, err
}

// Ledger is a set of slots, one per relay.
type Ledger struct {
	mem  []byte
	fd   int // the shared memory's descriptor; -1 for plain memory
	mu   sync.Mutex
	used []bool
	next int // where the search for a free slot starts
}

// NewLedger is a ledger of n slots in this process's memory: state that an upgrade hands on,
// but a crash loses.
func NewLedger(n int) *Ledger {
	return &Ledger{mem: make([]byte, n*SlotSize), fd: -1, used: make([]bool, n)}
}

// Fd is the descriptor of a shared ledger's memory (for its keeper), -1 for plain memory.
func (l *Ledger) Fd() int { return l.fd }

// errFull: every slot is in use (the relay then takes a ledger of its own).
var errFull = errors.New("tlsrelay: every slot of the ledger is in use")

// alloc takes a free slot for a relay with state st.
func (l *Ledger) alloc(st *State) (int, slot, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.used {
		j := (l.next + i) % len(l.used)
		if !l.used[j] {
			l.used[j], l.next = true, j+1
			s := l.slot(j)
			s.init(st)
			ringPut(s.ring(), st.In.From, st.Rx)
			return j, s, nil
		}
	}
	return -1, nil, errFull
}

// claim takes slot i, which a keeper's ledger says belongs to the connection id, and reads it.
func (l *Ledger) claim(i int, id uint64) (slot, State, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i < 0 || i >= len(l.used) {
		return nil, State{}, fmt.Errorf("tlsrelay: no slot %d", i)
	}
	if l.used[i] {
		return nil, State{}, fmt.Errorf("tlsrelay: slot %d is taken twice", i)
	}
	s := l.slot(i)
	st, err := s.state()
	if err == nil && st.ID != id {
		err = fmt.Errorf("tlsrelay: slot %d belongs to connection %d, not %d", i, st.ID, id)
	}
	if err != nil {
		return nil, State{}, err
	}
	l.used[i] = true
	return s, st, nil
}

func (l *Ledger) free(i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i >= 0 && i < len(l.used) {
		l.used[i] = false
	}
}

func (l *Ledger) slot(i int) slot { return slot(l.mem[i*SlotSize : (i+1)*SlotSize : (i+1)*SlotSize]) }
