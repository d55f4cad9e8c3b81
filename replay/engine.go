package replay

import (
	"cmp"
	"container/heap"
	"container/list"
	"encoding/binary"
	"net/netip"
	"slices"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/reassembly"
	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/verdict"
)

// capture is the state of one capture file: its streams, the reassembler and the clock.
type capture struct {
	r    *Replayer
	file string
	pd   *packetDecoder
	asm  *reassembly.Assembler // nil until assembler makes it

	streams  map[tuple]*stream // the current stream of each 4-tuple, decided ones lingering
	live     list.List         // undecided streams, least recently active first
	trailing list.List         // decided streams whose flow goes on, least recently active first
	done     list.List         // streams whose flow ended, lingering, least recently active first
	timers   timerHeap         // undecided streams with a deadline
	sources  *verdict.Sources  // the streams that completed a message, by source
	gate     *admission.Gate   // serve's admission, on capture time; made at the first packet
	gateAt   time.Time         // the gate's clock: the time of what it is asked or told
	peeks    verdict.Peeks     // refused streams being read for ban.peek

	now       time.Time // capture clock: the latest timestamp seen
	started   bool
	lastFlush time.Time
	flushing  bool
	decided   []*stream // decided, to report
	flows     []*stream // flows ended, to record
	ending    bool      // the capture ended: what lasts is open
	unhook    []*stream // decided, to remove from the reassembler
	ac        captureContext
	madeUp    layers.TCP
	creating  *stream   // the stream whose segment the reassembler is given
	recent    *stream   // the stream of the latest segment, while c.streams maps its 4-tuple to it
	idle      []*stream // scratch for closeIdleBypassed
}

type tuple struct{ src, dst netip.AddrPort }

// captureContext satisfies reassembly.AssemblerContext. Stream callbacks use the capture clock
// instead, so one value serves every packet.
type captureContext struct{ ci gopacket.CaptureInfo }

func (c *captureContext) GetCaptureInfo() gopacket.CaptureInfo { return c.ci }

func (r *Replayer) newCapture(file string) *capture {
	return &capture{r: r, file: file, pd: newPacketDecoder(), streams: map[tuple]*stream{},
		sources: verdict.NewSources(nil, nil)}
}

// assembler returns the reassembler, made when a stream first needs it: a capture whose streams
// all come in order never does.
func (c *capture) assembler() *reassembly.Assembler {
	if c.asm == nil {
		a := reassembly.NewAssembler(reassembly.NewStreamPool(c))
		a.MaxBufferedPagesPerConnection = c.r.opts.MaxBufferedPagesPerConnection
		a.MaxBufferedPagesTotal = c.r.opts.MaxBufferedPagesTotal
		c.asm = a
	}
	return c.asm
}

// New is the reassembly.StreamFactory. segment makes every stream before the reassembler sees
// it; a flow that is not the one being fed (a reset to a connection already gone) gets none.
func (c *capture) New(flow, _ gopacket.Flow, _ *layers.TCP, _ reassembly.AssemblerContext) reassembly.Stream {
	if c.creating == nil || flow != c.creating.flow {
		return nil
	}
	return c.creating
}

// segment handles one TCP segment decoded into c.pd.
func (c *capture) segment(ci gopacket.CaptureInfo) {
	pd := c.pd
	fromStore := false
	if !c.r.isPort(pd.dst.Port()) {
		if !c.r.isPort(pd.src.Port()) {
			return // another service
		}
		fromStore = true
	}
	if ts := ci.Timestamp; ts.After(c.now) || !c.started {
		c.now = ts
	}
	if !c.started {
		c.started, c.lastFlush, c.gateAt = true, c.now, c.now
		c.gate = admission.New(c.r.adm, func() time.Time { return c.gateAt })
	}
	c.r.clock = c.now
	c.tick()

	tcp := &pd.tcp
	if fromStore {
		c.storeSegment(tcp)
		return
	}
	key := tuple{pd.src, pd.dst}
	s := c.lookup(key)
	switch {
	case tcp.SYN && !tcp.ACK:
		if s != nil && (s.midstream || s.isn != tcp.Seq) {
			// A new connection on the same 4-tuple: the old one ended unseen.
			if !s.done {
				s.observe()
			}
			c.forget(s)
			s = nil
		}
		if s == nil {
			s = c.newStream(key, true, tcp.Seq)
		}
		if s.halfOpen && len(tcp.Payload) > 0 && !tcp.RST {
			c.admit(s) // a SYN with data (TCP Fast Open): the kernel hands it to accept at once
		}
	case s == nil:
		if len(tcp.Payload) == 0 {
			return // an ACK or FIN of a connection begun before the capture: nothing to judge
		}
		s = c.newStream(key, false, 0)
	}
	s.last = c.now
	switch {
	case s.flowEnded:
		c.done.MoveToBack(s.elem)
		c.settle(false) // a stream over: refused at its accept, or half open
		return
	case s.done:
		// Decided, but serve would still forward it (monitor mode) or replay cannot judge it (a
		// gap): its bytes go on counting to its end.
		c.trailing.MoveToBack(s.elem)
		s.countClient(tcp)
		if tcp.FIN || tcp.RST {
			s.endFlow(audit.ClosedByClient, s.last)
			c.settle(false)
		}
		return
	}
	c.live.MoveToBack(s.elem)
	if s.halfOpen && !tcp.SYN {
		if tcp.RST {
			s.close(audit.ClosedByClient, s.last) // a SYN scan: the handshake never completed
			c.settle(false)
			return
		}
		if tcp.ACK {
			c.admit(s) // the handshake's last ACK (or data): where serve's accept returns
		}
	}
	s.countClient(tcp)
	switch {
	case s.midstream:
		s.bytes += uint64(len(tcp.Payload))
		if tcp.FIN || tcp.RST {
			s.close(audit.ClosedByClient, s.last)
		}
	case pd.truncated:
		s.truncated = true // drop it: the hole it leaves is reported as a gap
	default:
		c.feed(s, tcp, ci)
	}
	c.settle(false)
}

// storeSegment counts the store's bytes to a stream's client and ends the stream at the store's
// FIN or RST: serve closes the client's connection when the store closes its own, so the guard
// judges no byte after it, and a message in progress is cut short.
func (c *capture) storeSegment(tcp *layers.TCP) {
	s := c.lookup(tuple{c.pd.dst, c.pd.src})
	if s == nil || s.flowEnded {
		return // not a stream of the capture's, or over
	}
	s.countStore(tcp)
	if !tcp.FIN && !tcp.RST {
		return
	}
	if s.done {
		s.endFlow(audit.ClosedByStore, c.now)
	} else {
		s.close(audit.ClosedByStore, c.now)
	}
	c.settle(false)
}

// lookup returns the current stream of a 4-tuple. Segments come in runs of one connection, so
// the latest stream is tried before the map.
func (c *capture) lookup(key tuple) *stream {
	if s := c.recent; s != nil && s.key == key {
		return s
	}
	s := c.streams[key]
	if s != nil {
		c.recent = s
	}
	return s
}

// route is where a stream's segments go.
type route uint8

const (
	routeUnset       route = iota // no segment given yet
	routeBypass                   // every segment so far came in order and went straight to the stream
	routeReassembler              // the reassembler has the stream
)

// feed gives one segment of s to the reassembler or, while the stream has come in order, straight
// to the stream, as the reassembler would have passed it on. Most segments of a capture are the
// next bytes of their stream; the reassembler's per-segment cost is for the rest.
func (c *capture) feed(s *stream, tcp *layers.TCP, ci gopacket.CaptureInfo) {
	if s.route != routeReassembler {
		if !c.r.opts.alwaysReassemble && c.inOrder(s, tcp, ci.Timestamp) {
			return
		}
		if s.route == routeBypass {
			c.handOver(s)
		}
		s.route = routeReassembler
	}
	c.ac.ci = ci
	c.creating = s
	c.assembler().AssembleWithContext(s.flow, tcp, &c.ac)
	c.creating = nil
}

// inOrder handles, as the reassembler would, a segment that it would pass straight on: the
// stream's first segment when it is a bare SYN, then, while nothing else came, the segment at the
// next sequence number. It reports false for anything else (a retransmission, an overlap, a hole,
// a SYN with data or a repeated SYN), which the reassembler must see.
func (c *capture) inOrder(s *stream, tcp *layers.TCP, ts time.Time) bool {
	switch {
	case s.route == routeUnset:
		if !tcp.SYN || tcp.FIN || tcp.RST || len(tcp.Payload) > 0 || tcp.Seq != s.isn {
			return false
		}
		// The reassembler would start the half at isn+1, where s.next already is.
		s.route, s.maxTS = routeBypass, ts
		return true
	case tcp.SYN || tcp.Seq != s.next:
		return false
	}
	if ts.After(s.maxTS) {
		s.maxTS = ts
	}
	if len(tcp.Payload) == 0 && !tcp.FIN && !tcp.RST {
		return true // a bare ACK: nothing to pass on
	}
	s.see(tcp)
	s.deliver(tcp.Payload, tcp.FIN || tcp.RST)
	return true
}

// handOver gives the reassembler a stream that has so far bypassed it, in the state its in-order
// segments would have left it in: a SYN just before the next byte starts the half there, at the
// latest timestamp those segments had.
func (c *capture) handOver(s *stream) {
	c.ac.ci = gopacket.CaptureInfo{Timestamp: s.maxTS}
	c.creating = s
	c.feedSegment(s.flow, s.key.src.Port(), s.key.dst.Port(), s.next-1, tcpSYN)
	c.creating = nil
}

// closeIdleBypassed ends the streams that bypass the reassembler and that it would have closed
// in a flush: those with no segment since tc.
func (c *capture) closeIdleBypassed(tc time.Time) {
	c.idle = c.idle[:0]
	for e := c.live.Front(); e != nil; e = e.Next() {
		if s := e.Value.(*stream); s.route == routeBypass && s.maxTS.Before(tc) {
			c.idle = append(c.idle, s)
		}
	}
	for _, s := range c.idle {
		c.letGo(s)
	}
	clear(c.idle)
}

// tick fires the deadlines that have passed and, every flushEvery, flushes reassembly and ends
// idle streams.
func (c *capture) tick() {
	for len(c.timers) > 0 && !c.now.Before(c.timers[0].due) {
		s := heap.Pop(&c.timers).(*stream)
		s.expireDue(c.now, false)
	}
	c.settle(false)
	if c.now.Sub(c.lastFlush) < flushEvery {
		return
	}
	c.lastFlush = c.now
	c.gateAt = c.now
	c.gate.Sweep() // as serve's sweepLoop: ended bans and idle sources go
	o := c.r.opts
	c.flushing = true
	idle := c.now.Add(-o.IdleClose)
	if c.asm != nil {
		c.asm.FlushWithOptions(reassembly.FlushOptions{T: c.now.Add(-o.ReorderWait), TC: idle})
	}
	c.closeIdleBypassed(idle)
	c.flushing = false
	for e := c.live.Front(); e != nil && e.Value.(*stream).last.Before(idle); e = c.live.Front() {
		c.letGo(e.Value.(*stream))
	}
	for e := c.trailing.Front(); e != nil && e.Value.(*stream).last.Before(idle); e = c.trailing.Front() {
		c.forget(e.Value.(*stream))
	}
	linger := c.now.Add(-doneLinger)
	for e := c.done.Front(); e != nil && e.Value.(*stream).last.Before(linger); e = c.done.Front() {
		c.forget(e.Value.(*stream))
	}
	c.settle(true)
}

// settle reports decided streams, in order of id when a flush decided them (the reassembler
// visits connections in map order), and unhooks them from the reassembler.
func (c *capture) settle(sortByID bool) {
	if sortByID && len(c.decided) > 1 {
		slices.SortFunc(c.decided, func(a, b *stream) int { return cmp.Compare(a.id, b.id) })
	}
	for _, s := range c.decided {
		c.r.emit(s.result())
		for _, e := range s.warnings {
			c.r.writeAudit(e)
		}
		if s.violation != nil {
			c.r.writeAudit(s.event)
		}
		if s.banned {
			b := audit.AdmissionEvent(s.key.src, s.key.dst, audit.ActionBanned, string(s.violation.Rule))
			b.Timestamp, b.ConnID, b.Mode = s.event.Timestamp, s.id, audit.ModeReplay
			c.r.writeAudit(b)
		}
	}
	c.decided = c.decided[:0]
	if sortByID && len(c.flows) > 1 {
		slices.SortFunc(c.flows, func(a, b *stream) int { return cmp.Compare(a.id, b.id) })
	}
	for _, s := range c.flows {
		c.r.writeFlow(s, c.sources)
	}
	clear(c.flows)
	c.flows = c.flows[:0]
	for _, s := range c.unhook {
		c.unhookStream(s)
	}
	c.unhook = c.unhook[:0]
}

// end judges the streams still open when the capture ends, oldest first, and records their flows
// as open at its last packet.
func (c *capture) end() {
	c.ending = true
	open := make([]*stream, 0, c.live.Len())
	for e := c.live.Front(); e != nil; e = e.Next() {
		open = append(open, e.Value.(*stream))
	}
	slices.SortFunc(open, func(a, b *stream) int { return cmp.Compare(a.id, b.id) })
	for _, s := range open {
		s.observe()
	}
	open = open[:0]
	for e := c.trailing.Front(); e != nil; e = e.Next() {
		open = append(open, e.Value.(*stream))
	}
	for _, s := range open {
		s.openFlow(c.now)
	}
	c.unhook = c.unhook[:0] // the reassembler goes with the capture
	c.settle(true)
}

func (c *capture) newStream(key tuple, syn bool, isn uint32) *stream {
	c.r.nextID++
	s := &stream{c: c, id: c.r.nextID, key: key, start: c.now, last: c.now, timer: -1}
	var id [8]byte
	binary.BigEndian.PutUint64(id[:], s.id)
	// The reassembler's key for this stream alone, so that a reused 4-tuple is a new stream.
	s.flow = gopacket.NewFlow(endpointStream, id[:], nil)
	s.g.Reset(c.r.dec, &c.r.pol, c.now)
	s.g.From(key.src.Addr())
	if syn {
		s.isn, s.next, s.seen, s.halfOpen = isn, isn+1, isn+1, true
	} else {
		s.midstream = true
	}
	// MaxStreams bounds the streams whose flow goes on: undecided ones, and decided ones still
	// counted (trailing); the least recently active trailing one ends first.
	if c.live.Len()+c.trailing.Len() >= c.r.opts.MaxStreams {
		if c.trailing.Len() > 0 {
			c.forget(c.trailing.Front().Value.(*stream))
		} else {
			c.letGo(c.live.Front().Value.(*stream))
		}
		c.settle(false)
	}
	c.streams[key] = s
	c.recent = s
	s.elem = c.live.PushBack(s)
	return s
}

// admit asks the gate, as serve does at accept, whether s's connection would have been admitted,
// once its handshake completed: a connection the kernel never completes (a SYN scan, a closed
// port) never reaches accept. A refused one gets serve's denied event, and is read for ban.peek
// (banned) or ends here. An admitted one's deadlines run from here, as serve's from accept.
func (c *capture) admit(s *stream) {
	s.halfOpen = false
	s.g.Reset(c.r.dec, &c.r.pol, c.now)
	s.g.From(s.key.src.Addr())
	defer s.schedule()
	c.gateAt = c.now
	release, reason := c.gate.Admit(s.key.src.Addr(), c.sources.Serving(s.key.src.Addr()))
	if reason == "" {
		s.release = release
		return
	}
	s.refused = reason
	e := audit.AdmissionEvent(s.key.src, s.key.dst, audit.ActionDenied, string(reason))
	e.Timestamp, e.Mode = c.now, audit.ModeReplay
	c.r.writeAudit(e)
	if peek := c.r.cfg.Ban.Peek; verdict.Peeked(reason, peek) && c.peeks.Take() {
		s.peek = verdict.NewPeek(c.now, peek)
		return
	}
	s.endPeek(c.now)
}

// violation tells the gate of s's violation at, as serve's recordViolation does, and reports
// whether it banned s's source (or its network).
func (c *capture) violation(s *stream, at time.Time) bool {
	c.gateAt = at
	return c.gate.Violation(s.key.src.Addr()).IsValid()
}

// letGo judges a stream that is idle (or the least recently active one over MaxStreams) and
// forgets its 4-tuple, so that anything it sends later is judged as a new, midstream, stream
// rather than swallowed.
func (c *capture) letGo(s *stream) {
	s.observe()
	c.forget(s)
}

// forget drops a decided stream's 4-tuple, ending its flow where its packets ended if it went on.
func (c *capture) forget(s *stream) {
	if s.done && !s.flowEnded {
		s.endFlow("", s.last)
	}
	if c.streams[s.key] == s {
		delete(c.streams, s.key)
	}
	if c.recent == s {
		c.recent = nil
	}
	if s.done {
		c.done.Remove(s.elem)
	}
}

// endpointStream types the reassembler flows that name one stream each.
const endpointStream gopacket.EndpointType = 0x5347

// unhookStream frees the reassembler's connection of a decided stream at once, rather than when
// it has been idle for IdleClose: a reset at the next expected byte closes the client half
// (dropping any out-of-order pages), a reset the other way closes the half never fed.
func (c *capture) unhookStream(s *stream) {
	if s.route != routeReassembler {
		return // never given to the reassembler (midstream, or in order throughout)
	}
	c.ac.ci = gopacket.CaptureInfo{Timestamp: c.now}
	c.feedSegment(s.flow, s.key.src.Port(), s.key.dst.Port(), s.next, tcpRST)
	c.feedSegment(s.flow.Reverse(), s.key.dst.Port(), s.key.src.Port(), 0, tcpRST)
}

// TCP flags byte values of the segments replay makes up.
const (
	tcpSYN = 0x02
	tcpRST = 0x04
)

// feedSegment gives the reassembler an empty segment with the given flags.
func (c *capture) feedSegment(flow gopacket.Flow, from, to uint16, seq uint32, flags byte) {
	var h [20]byte
	binary.BigEndian.PutUint16(h[0:], from)
	binary.BigEndian.PutUint16(h[2:], to)
	binary.BigEndian.PutUint32(h[4:], seq)
	h[12], h[13] = 5<<4, flags // data offset 5 words
	if err := c.madeUp.DecodeFromBytes(h[:], gopacket.NilDecodeFeedback); err != nil {
		return
	}
	c.assembler().AssembleWithContext(flow, &c.madeUp, &c.ac)
}
