package tlsrelay

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/storeguard/storeguard/internal/tcpcount"
	"github.com/storeguard/storeguard/tlsrec"
)

// A kept End is an End whose state a keeper holds, in a slot of the ledger it shares (Keep):
// a worker killed at any instant leaves every byte of the connection either in a socket, in the
// slot's ring, or passed on, and the next worker goes on from the slot and the sockets' counters
// (RestoreEnd) with nothing lost or sent twice. It has no loopback pair, so it costs what an End
// costs (docs/design.md, "What a crash costs a TLS connection").
//
// The read side reads the TLS socket into the slot's ring, where a byte at stream offset x
// lives at x mod ringSize, and opens each whole record from there into a buffer of its own: the
// ring keeps the records as they came. The slot's In state stands at the first record whose
// plaintext is not all passed on yet (Settle, which the caller calls once the store has the
// plaintext, or holds it in memory it gives up on): its sequence number, its offset in the TLS
// stream and that of its plaintext in the store's. So the ring holds every record from the start
// of the message in progress on, and a worker that dies leaves it there. The write side saves
// each record it is about to write (the Intent), and then the state that counts it written, as a
// relay's does; its plaintext is the store's replies, read with MSG_PEEK by the caller and
// consumed once written.

// kept is what an End keeps in its slot.
type kept struct {
	ledger *Ledger
	ix     int
	slot   slot
	mu     sync.Mutex // the slot's writes, against Release's free
	freed  bool
	handed *atomic.Bool // the End's: handed over, it writes nothing to the slot until thawed

	// The read side (Next's goroutine). in: the saved state; read, open: the TLS stream's offsets
	// read into the ring and opened up to; plain: the plaintext's offset after the records opened;
	// skip: plaintext of the records still to open that was passed on before (a restart's).
	in         Dir
	read, open uint64
	plain      uint64
	skip       uint64
	floor      uint64    // the plaintext the store is known to have (a restart's): its records may be settled
	recs       []openRec // records opened and not settled, oldest first

	// The write side (e.wmu held): the TLS bytes written and the store's bytes counted at the
	// start of the record under way.
	out Dir
}

// openRec is where a record opened and not settled ends, and the read state after it.
type openRec struct {
	end, plainEnd, seq, updates uint64
	secret                      []byte // a KeyUpdate's new secret; nil: unchanged
	closed                      bool
}

// Keep puts the End's state in a slot of ledger, as connection id's: from then on its reads and
// writes keep it there. A full ledger leaves the End as it was (its state in this process
// only). Call it before the End reads or writes.
func (e *End) Keep(ledger *Ledger, id uint64) error {
	read, written, err := counts(e.TLS)
	if err != nil {
		return err
	}
	st := State{ID: id, Suite: e.suite,
		In:  Dir{Secret: e.in.Secret(), Seq: e.in.Seq(), From: read, Updates: e.asked.Load()},
		Out: Dir{Secret: e.out.Secret(), Seq: e.out.Seq(), To: written, Updates: e.answered}}
	ix, s, err := ledger.alloc(&st)
	if err != nil {
		return err
	}
	e.k = &kept{ledger: ledger, ix: ix, slot: s, handed: &e.handed, in: st.In, read: read, open: read, out: st.Out}
	return nil
}

// Slot is the End's slot in its ledger; -1 when it keeps none.
func (e *End) Slot() int {
	if e.k == nil {
		return -1
	}
	return e.k.ix
}

// save writes one side's state to the slot, unless the slot was freed or handed over.
func (k *kept) save(out bool, d *Dir) {
	k.mu.Lock()
	if !k.freed && !k.handed.Load() {
		k.slot.save(out, d)
	}
	k.mu.Unlock()
}

// free gives the slot back, once: nothing is written to it after.
func (k *kept) free() {
	k.mu.Lock()
	if !k.freed {
		k.freed = true
		k.ledger.free(k.ix)
	}
	k.mu.Unlock()
}

// nextKept is Next for a kept End.
func (e *End) nextKept() ([]byte, error) {
	k := e.k
	ring := k.slot.ring()
	if e.rbuf != nil { // the last record's plaintext, which the caller is done with
		e.putRbuf()
	}
	for {
		if e.handed.Load() {
			return nil, errHanded
		}
		if e.rEnded {
			return nil, io.EOF
		}
		plain, whole, err := e.openNext()
		switch {
		case err != nil:
			return nil, err
		case whole && k.skip > 0:
			d := min(k.skip, uint64(len(plain)))
			plain, k.skip = plain[d:], k.skip-d
		}
		if len(plain) > 0 {
			return plain, nil
		}
		if whole {
			continue
		}
		if k.skip > 0 {
			return nil, fmt.Errorf("%w: %d bytes passed on past the records kept", ErrLostRequest, k.skip)
		}
		if k.read-k.in.From == ringSize { // the ring is full
			if len(k.recs) == 0 {
				return nil, errors.New("tlsrelay: a kept End's ring is full and no record in it is whole")
			}
			if i := k.passed(k.floor); i > 0 { // records the store has, not settled since a restart
				e.settleThrough(i)
			} else { // a message in progress larger than the ring: in the caller's memory only, a crash now closes the connection
				e.settleThrough(1)
			}
		}
		pos := k.read % ringSize
		e.rd.dst = ring[pos:min(ringSize, pos+ringSize-(k.read-k.in.From))]
		n, err := e.readRaw()
		e.rd.dst = nil
		k.read += uint64(n)
		if n > 0 {
			crashPoint("kept-read")
		}
		if err := e.readEnded(err, k.read == k.open); err != nil {
			return nil, err
		}
	}
}

// openNext opens the record at the ring's offset open, if it is whole there (whole): its
// plaintext is in rbuf, and the record is kept until settled. At a close_notify err is io.EOF.
func (e *End) openNext() (plain []byte, whole bool, err error) {
	k := e.k
	ring := k.slot.ring()
	have := k.read - k.open
	if have < 5 {
		return nil, false, nil
	}
	var hdr [5]byte
	ringCopy(hdr[:], ring, k.open)
	n, err := tlsrec.RecordLen(hdr[:])
	if err != nil || have < uint64(n) {
		return nil, false, err
	}
	if e.rbuf != nil {
		e.putRbuf()
	}
	e.rbp = recBufs.Get().(*[]byte)
	e.rbuf = *e.rbp
	rec := e.rbuf[:n]
	ringCopy(rec, ring, k.open)
	plain, asked, err := e.in.OpenRecord(rec)
	closed := errors.Is(err, tlsrec.ErrClosed)
	if err != nil && !closed {
		return nil, false, err
	}
	if asked {
		e.asked.Add(1)
	}
	k.open += uint64(n)
	k.plain += uint64(len(plain))
	r := openRec{end: k.open, plainEnd: k.plain, seq: e.in.Seq(), updates: e.asked.Load(), closed: closed}
	if r.seq == 0 { // a KeyUpdate starts the new secret's numbering
		r.secret = e.in.Secret()
	}
	k.recs = append(k.recs, r)
	if closed {
		e.rEnded = true
		return nil, true, io.EOF
	}
	return plain, true, nil
}

// Settle says that of the plaintext Next returned, all but the last held bytes (the start of a
// message in progress) has been passed on: the records it came from need not be kept any more.
// held < 0 keeps them all (the caller holds some of it in memory it has not passed on yet).
func (e *End) Settle(held int) {
	k := e.k
	if k == nil || held < 0 || e.handed.Load() {
		return
	}
	e.settleThrough(k.passed(k.plain - min(uint64(held), k.plain)))
}

// passed is how many of the records opened end at or before the plaintext offset p.
func (k *kept) passed(p uint64) int {
	i := 0
	for i < len(k.recs) && k.recs[i].plainEnd <= p {
		i++
	}
	return i
}

// settleThrough saves the read state after the first i records opened, and forgets them.
func (e *End) settleThrough(i int) {
	k := e.k
	if i == 0 {
		return
	}
	for _, r := range k.recs[:i] {
		if r.secret != nil {
			k.in.Secret = r.secret
		}
	}
	r := k.recs[i-1]
	k.in.From, k.in.To, k.in.Seq, k.in.Updates, k.in.Ended = r.end, r.plainEnd, r.seq, r.updates, r.closed
	k.recs = k.recs[:copy(k.recs, k.recs[i:])]
	k.save(false, &k.in)
	crashPoint("kept-settled")
}

// keptIntent saves the record just sealed as the one under way (e.wmu held).
func (e *End) keptIntent() {
	k := e.k
	d := k.out
	d.Seq, d.Intent, d.IntentLen = e.wseq, e.wkind, uint32(e.wlen)
	if e.wkind == 'k' {
		d.Secret, d.Updates = e.wsecret, e.wprev
	}
	k.save(true, &d)
	crashPoint("kept-intent")
}

// keptWritten saves the state that counts the record under way, written whole (e.wmu held).
func (e *End) keptWritten() {
	k := e.k
	k.out.To += uint64(len(e.wrec))
	if e.wkind == 'd' {
		k.out.From += uint64(e.wlen)
	}
	if e.wkind == 'k' { // the only record that moves the secret: copied then, not per record
		k.out.Secret = e.out.Secret()
	}
	k.out.Seq, k.out.Updates, k.out.Ended = e.out.Seq(), e.answered, e.wEnded
	k.save(true, &k.out)
	crashPoint("kept-written")
}

// ErrLostRequest and ErrLostReply: a kept End's process died holding bytes in its memory only
// (the start of a message larger than the ring, replies its client had not taken), so the
// connection cannot go on exactly (RestoreEnd).
var (
	ErrLostRequest = errors.New("tlsrelay: client bytes were taken and not passed on")
	ErrLostReply   = errors.New("tlsrelay: store bytes were taken and not passed on")
)

// RestoreEnd makes the End of connection id from its slot ix in a keeper's shared ledger, after
// its process died: fd is its TLS socket, storeFd its store's (-1: not connected). It squares the
// slot with the sockets' counters:
//   - the records read past the read state are in the ring; of their plaintext, what the store's
//     socket counts written past the state was passed on, and Next returns what follows (the
//     start of a message: the guard starts afresh there);
//   - a record that was under way is sealed again from the store's bytes, still in its socket,
//     to the same bytes, and the rest of it is written first; store bytes counted written and
//     not consumed are consumed.
//
// Bytes the dead process had consumed and not passed on are lost: ErrLostRequest or ErrLostReply,
// and the connection must close. The End is detached on fd (Detach). On an error nothing is
// closed and the slot stays free.
func RestoreEnd(ledger *Ledger, ix int, id uint64, fd, storeFd int) (*End, error) {
	return fromSlot(ledger, ix, id, fd, func(s slot, st State, read, written uint64) (*End, error) {
		return restoreEnd(ledger, ix, s, st, fd, storeFd, read, written)
	})
}

// fromSlot claims slot ix of ledger for connection id and makes its End with build, given the
// slot's state and the counters of its TLS socket fd; the slot is free again if build fails.
func fromSlot(ledger *Ledger, ix int, id uint64, fd int,
	build func(s slot, st State, read, written uint64) (*End, error)) (e *End, err error) {
	s, st, err := ledger.claim(ix, id)
	if err != nil {
		return nil, err
	}
	read, written, err := tcpcount.Counts(fd, false)
	if err == nil {
		e, err = build(s, st, read, written)
	}
	if err != nil {
		ledger.free(ix)
		return nil, err
	}
	return e, nil
}

// restoreEnd is RestoreEnd's End, once its slot is claimed.
func restoreEnd(ledger *Ledger, ix int, s slot, st State, fd, storeFd int, read, written uint64) (e *End, err error) {
	var stored, replied uint64 // the store's socket: bytes written to it, consumed from it
	if storeFd >= 0 {
		if replied, stored, err = tcpcount.Counts(storeFd, true); err != nil {
			return nil, err
		}
	}
	if read < st.In.From || read-st.In.From > ringSize || written < st.Out.To {
		return nil, fmt.Errorf("tlsrelay: the TLS socket at %d read and %d written, the slot at %d and %d",
			read, written, st.In.From, st.Out.To)
	}
	if stored < st.In.To {
		return nil, fmt.Errorf("%w: %d bytes counted, %d written to the store", ErrLostRequest, st.In.To, stored)
	}
	var head []byte // the plaintext of the record under way, in the store's socket after what was counted
	if st.Out.Intent == 'd' {
		switch {
		case replied > st.Out.From:
			return nil, fmt.Errorf("%w: a record under way, and the store's socket consumed past it", ErrLostReply)
		case replied < st.Out.From: // records written in the same Write, not consumed yet
			if err = tcpcount.Discard(storeFd, st.Out.From-replied); err != nil {
				return nil, err
			}
			replied = st.Out.From
		}
		if head, err = peekFd(storeFd, int(st.Out.IntentLen)); err != nil {
			return nil, err
		}
	}
	if skip := stored - st.In.To; skip > read-st.In.From {
		return nil, fmt.Errorf("%w: %d bytes passed on past the %d of records kept", ErrLostRequest, skip, read-st.In.From)
	}
	if e, err = endOf(fd, st, 0, head); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.putWbuf()
		}
	}()
	e.k = &kept{ledger: ledger, ix: ix, slot: s, handed: &e.handed, in: st.In, read: read, open: st.In.From,
		plain: st.In.To, skip: stored - st.In.To, floor: stored, out: st.Out}
	e.k.out.Intent, e.k.out.IntentLen = 0, 0
	if e.wrec != nil {
		sent := written - st.Out.To
		switch n := uint64(len(e.wrec)); {
		case sent > n:
			return nil, fmt.Errorf("tlsrelay: %d bytes written of a record of %d", sent, n)
		case sent == n: // written whole before the state said so
			e.wsent = int(sent)
			e.keptWritten()
			e.wrec = nil
			e.putWbuf()
		default:
			e.wsent = int(sent)
		}
	} else if written != st.Out.To {
		return nil, fmt.Errorf("tlsrelay: %d bytes written past the slot's state, and no record under way", written-st.Out.To)
	}
	switch {
	case replied > e.k.out.From:
		return nil, fmt.Errorf("%w: %d bytes consumed from the store, %d written on", ErrLostReply, replied, e.k.out.From)
	case replied < e.k.out.From:
		if err = tcpcount.Discard(storeFd, e.k.out.From-replied); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// reopen opens the ring's records again up to the TLS stream's offset open: what the previous
// process had opened, and its connection handed on. Each is kept until settled, as when it was
// opened first, so that the caller can settle before it reads.
func (e *End) reopen(open uint64) error {
	k := e.k
	for k.open < open {
		_, whole, err := e.openNext()
		switch {
		case errors.Is(err, io.EOF): // a close_notify the previous process had opened: Next says so again
		case err != nil:
			return err
		case !whole || k.open > open:
			return fmt.Errorf("tlsrelay: the records in the ring end at %d, not where the previous process had opened (%d)", k.open, open)
		}
	}
	if e.rbuf != nil {
		e.putRbuf()
	}
	return nil
}

// peekFd is the first n bytes in fd's receive queue, which must be there.
func peekFd(fd, n int) ([]byte, error) {
	if fd < 0 {
		return nil, errors.New("tlsrelay: a record under way and no store socket")
	}
	b := make([]byte, n)
	m, _, err := unix.Recvfrom(fd, b, unix.MSG_PEEK|unix.MSG_DONTWAIT)
	if err != nil || m < n {
		return nil, fmt.Errorf("tlsrelay: %d bytes of a record under way in the store's socket, not %d: %v", max(m, 0), n, err)
	}
	return b, nil
}

// Release gives a kept End's slot back once its connection is over (nothing reads or writes it
// any more), unless the End was handed over: the slot is the next process's then.
func (e *End) Release() {
	if e.k != nil && !e.handed.Load() {
		e.k.free()
	}
}

// HandOff is Handover for a kept End whose next process takes it from its slot (EndFromSlot):
// its State, with no loopback pair and no Rx (the records read and not opened are in the ring).
// The End then reads, writes and saves nothing until Thaw.
func (e *End) HandOff(id uint64) (State, error) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	if e.k == nil {
		return State{}, errors.New("tlsrelay: an End that keeps no slot")
	}
	e.handed.Store(true)
	st, err := e.stateAt(id, e.k.plain+e.k.skip, e.k.out.From) // a restart's skip not done yet: the next skips it
	if err != nil {
		e.handed.Store(false)
	}
	return st, err
}

// EndFromSlot makes the End a previous process handed off (HandOff: its State st) from its slot
// ix in the ledger it handed over, on its TLS socket fd; toClient is the replies it was given
// and had not written whole, which the caller writes first (a record under way is sealed again
// from their start). The plaintext of the records it had opened went with the connection (its
// guard's carry, bytes judged or not): Next goes on after them, and the ring keeps them until
// they are settled. The End is detached on fd. On an error nothing is closed.
func EndFromSlot(ledger *Ledger, ix int, id uint64, fd int, st State, toClient []byte) (*End, error) {
	return fromSlot(ledger, ix, id, fd, func(s slot, saved State, read, written uint64) (*End, error) {
		in := saved.In
		if read < in.From || read-in.From > ringSize || st.In.To < in.To || st.In.From < in.From || read < st.In.From ||
			written < st.Out.To {
			return nil, fmt.Errorf("tlsrelay: the TLS socket at %d read and %d written, the slot at %d, the state at %d and %d",
				read, written, in.From, st.In.From, st.Out.To)
		}
		e, err := endOf(fd, State{ID: id, Suite: st.Suite, In: in, Out: st.Out}, written-st.Out.To, toClient)
		if err != nil {
			return nil, err
		}
		e.k = &kept{ledger: ledger, ix: ix, slot: s, handed: &e.handed, in: in, read: read, open: in.From, plain: in.To,
			out: st.Out}
		e.k.out.Intent, e.k.out.IntentLen = 0, 0
		if err := e.reopen(st.In.From); err != nil {
			e.putWbuf()
			return nil, err
		}
		if e.k.plain > st.In.To {
			e.putWbuf()
			return nil, fmt.Errorf("tlsrelay: the records opened again make %d bytes of plaintext, not %d", e.k.plain, st.In.To)
		}
		e.k.skip = st.In.To - e.k.plain // a restart's skip the previous process had not done
		return e, nil
	})
}
