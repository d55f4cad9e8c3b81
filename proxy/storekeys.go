package proxy

import (
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

// keyOracle asks the store whether a key exists (CHECK), for the write-once rule: in a transparent
// sidecar the master host's own ranks write past the guard. It keeps one connection of its own to
// the store between questions (a torch store accepts about 10 connections a second), opened
// lazily and again after any error, and asks one question at a time.
type keyOracle struct {
	s    *Server
	mu   sync.Mutex
	conn net.Conn
	gen  protocol.Generation
	addr string
}

var errStoreUnknown = errors.New("the store's generation is not known yet")

// exists asks the store whether key, as the wire has it, exists.
func (o *keyOracle) exists(key []byte) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	exists, err := o.ask(key)
	result := "absent"
	switch {
	case err != nil:
		result = "error"
		o.drop()
	case exists:
		result = "exists"
	}
	o.s.m.keyLookups.WithLabelValues(result).Inc()
	return exists, err
}

func (o *keyOracle) ask(key []byte) (bool, error) {
	st := o.s.set.Load()
	gen := st.dec.Gen.Gen
	if st.dec.Gen.Auto {
		info, known, _ := o.s.store.Load().get()
		if !known {
			return false, errStoreUnknown
		}
		gen = info.Gen
	}
	deadline := time.Now().Add(keyLookupTimeout)
	if o.conn == nil || o.gen != gen || o.addr != st.cfg.Upstream {
		o.drop()
		c, err := net.DialTimeout("tcp", st.cfg.Upstream, keyLookupTimeout)
		if err != nil {
			return false, err
		}
		o.conn, o.gen, o.addr = c, gen, st.cfg.Upstream
		c.SetDeadline(deadline)
		if _, err := c.Write(protocol.AppendHandshake(nil, gen, 1)); err != nil {
			return false, err
		}
		if _, ok := protocol.WireOf(gen, protocol.OpPing); ok {
			var pong [4]byte // PING's reply: its nonce
			if _, err := io.ReadFull(c, pong[:]); err != nil {
				return false, err
			}
		}
	}
	o.conn.SetDeadline(deadline)
	msg, err := protocol.Append(nil, gen, protocol.Request{Op: protocol.OpCheck, Keys: [][]byte{key}})
	if err != nil {
		return false, err
	}
	if _, err := o.conn.Write(msg); err != nil {
		return false, err
	}
	var reply [1]byte // CheckResponseType: READY 0, NOT_READY 1
	if _, err := io.ReadFull(o.conn, reply[:]); err != nil {
		return false, err
	}
	switch reply[0] {
	case 0:
		return true, nil
	case 1:
		return false, nil
	}
	return false, fmt.Errorf("CHECK answered %#x", reply[0])
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
