package storeinfo

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// keyLookupTimeout bounds one question to the store: it is asked while a message waits (on an
// event loop, while the loop's other connections wait too), and a store that does not answer in
// time lets the write through (policy.Lookup), counted.
const keyLookupTimeout = 250 * time.Millisecond

// keyOracle asks the store about its keys: whether a key exists (CHECK), for the write-once rule (in
// a transparent sidecar the master host's own ranks write past the guard), and how many it holds
// (GETNUMKEYS), for the quota. It keeps one connection of its own to the store between questions
// (a torch store accepts about 10 connections a second), opened lazily and again after any error,
// and asks one question at a time.
type keyOracle struct {
	l    *Learner
	mu   sync.Mutex
	conn net.Conn
	gen  protocol.Generation
	addr string
	// The last answer to GETNUMKEYS and when it came: asked again at most once a second, however
	// many writes the quota refuses.
	numKeys   int64
	numKeysAt time.Time
}

var errStoreUnknown = errors.New("the store's generation is not known yet")

// Exists asks the store whether key, as the wire has it, exists (policy.Lookup).
func (l *Learner) Exists(key []byte) (bool, error) { return l.keys.exists(key) }

// Count asks the store how many keys it holds, or answers as it did less than a second ago
// (policy.Store.Count).
func (l *Learner) Count() (int64, error) { return l.keys.count() }

// CloseKeys closes the connection kept to ask the store about keys (a later question opens another).
func (l *Learner) CloseKeys() { l.keys.close() }

// exists is check, counted as the write-once rule's lookup (Observer.KeyLookup).
func (o *keyOracle) exists(key []byte) (bool, error) {
	ok, err := o.check(key)
	result := "absent"
	switch {
	case err != nil:
		result = "error"
	case ok:
		result = "exists"
	}
	o.l.obs.KeyLookup(result)
	return ok, err
}

// check asks the store whether key exists (CHECK).
func (o *keyOracle) check(key []byte) (bool, error) {
	var reply [1]byte // CheckResponseType: READY 0, NOT_READY 1
	if err := o.ask(protocol.Request{Op: protocol.OpCheck, Keys: [][]byte{key}}, reply[:]); err != nil {
		return false, err
	}
	if reply[0] > 1 {
		return false, fmt.Errorf("CHECK answered %#x", reply[0])
	}
	return reply[0] == 0, nil
}

// count asks the store how many keys it holds, or answers as it did less than a second ago.
func (o *keyOracle) count() (int64, error) {
	o.mu.Lock()
	if now := o.l.now(); !o.numKeysAt.IsZero() && now.Sub(o.numKeysAt) < time.Second && now.After(o.numKeysAt) {
		defer o.mu.Unlock()
		return o.numKeys, nil
	}
	o.mu.Unlock()
	var reply [8]byte // int64, the store's byte order (little-endian on every platform torch ships)
	if err := o.ask(protocol.Request{Op: protocol.OpGetNumKeys}, reply[:]); err != nil {
		return 0, err
	}
	n := int64(binary.LittleEndian.Uint64(reply[:]))
	o.mu.Lock()
	o.numKeys, o.numKeysAt = n, o.l.now()
	o.mu.Unlock()
	return n, nil
}

// Value asks the store for key's value, as the wire has it, if key exists (CHECK first: a GET of
// a missing key waits for it) and the value is at most limit bytes long.
func (l *Learner) Value(key []byte, limit int) (value []byte, exists bool, err error) {
	if exists, err = l.keys.check(key); !exists || err != nil {
		return nil, exists, err
	}
	err = l.keys.exchangeWith(protocol.Request{Op: protocol.OpGet, Key: key}, func(r io.Reader) error {
		var n [8]byte // the value's length, then the value (TCPStore's sendVector)
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return err
		}
		size := binary.LittleEndian.Uint64(n[:])
		if size > uint64(limit) {
			return fmt.Errorf("the value is %d bytes, more than %d", size, limit)
		}
		value = make([]byte, size)
		_, err := io.ReadFull(r, value)
		return err
	})
	return value, err == nil, err
}

// ask sends r and reads its reply, of len(reply) bytes.
func (o *keyOracle) ask(r protocol.Request, reply []byte) error {
	return o.exchangeWith(r, func(rd io.Reader) error {
		_, err := io.ReadFull(rd, reply)
		return err
	})
}

// exchangeWith sends r and reads its reply with read. A connection kept from an earlier question
// that fails, but for a timeout, is replaced once: the store may have restarted since. A failed
// question closes the connection (its reply may be half read).
func (o *keyOracle) exchangeWith(r protocol.Request, read func(io.Reader) error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	reused := o.conn != nil
	err := o.exchange(r, read)
	if ne := net.Error(nil); err != nil && reused && !(errors.As(err, &ne) && ne.Timeout()) {
		o.drop()
		err = o.exchange(r, read)
	}
	if err != nil {
		o.drop()
	}
	return err
}

func (o *keyOracle) exchange(r protocol.Request, read func(io.Reader) error) error {
	t := o.l.target()
	gen := t.Gen
	if t.Auto {
		info, known := o.l.Get()
		if !known {
			return errStoreUnknown
		}
		gen = info.Gen
	}
	deadline := time.Now().Add(keyLookupTimeout)
	if o.conn == nil || o.gen != gen || o.addr != t.Addr {
		o.drop()
		c, err := net.DialTimeout("tcp", t.Addr, keyLookupTimeout)
		if err != nil {
			return err
		}
		o.conn, o.gen, o.addr = c, gen, t.Addr
		c.SetDeadline(deadline)
		if _, err := c.Write(protocol.AppendHandshake(nil, gen, 1)); err != nil {
			return err
		}
		if _, ok := protocol.WireOf(gen, protocol.OpPing); ok {
			var pong [4]byte // PING's reply: its nonce
			if _, err := io.ReadFull(c, pong[:]); err != nil {
				return err
			}
		}
	}
	o.conn.SetDeadline(deadline)
	msg, err := protocol.Append(nil, gen, r)
	if err != nil {
		return err
	}
	if _, err := o.conn.Write(msg); err != nil {
		return err
	}
	return read(o.conn)
}

func (o *keyOracle) drop() {
	if o.conn != nil {
		o.conn.Close()
		o.conn = nil
	}
}

func (o *keyOracle) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.drop()
}
