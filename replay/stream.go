package replay

import (
	"container/heap"
	"container/list"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/reassembly"
	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/guard"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/verdict"
)

// stream is one client-to-server TCP stream and the decoder serve would have run on it.
type stream struct {
	c     *capture
	id    uint64
	key   tuple
	flow  gopacket.Flow // the reassembler's key
	start time.Time
	last  time.Time // capture time of its latest packet
	elem  *list.Element

	midstream bool   // no SYN: not decoded
	halfOpen  bool   // its SYN came, its handshake has not completed: not admitted, not judged
	isn       uint32 // initial sequence number
	next      uint32 // sequence number of the next byte to decode
	seen      uint32 // end of the furthest byte seen; beyond next while a hole waits to be filled
	truncated bool   // a segment was dropped because the snap length cut it

	route route     // where its segments go (see capture.feed)
	maxTS time.Time // latest timestamp of the segments the reassembler has, or would have, been given

	g     guard.Stream // serve's judgement of the stream
	bytes uint64       // payload of a midstream stream, which is not judged
	due   time.Time    // deadline while in capture.timers
	timer int          // index in capture.timers, -1 when not there

	done      bool
	verdict   Verdict
	reason    string
	end       time.Time
	violation *protocol.Violation
	event     audit.Event
	banned    bool // its violation banned its source: a banned event follows its own

	// Admission, asked once its handshake completed (capture.admit); a stream without a SYN was
	// admitted before the capture.
	release func()           // gives its admission back at its flow's end
	refused admission.Reason // why serve would have refused it; "" admitted
	peek    *verdict.Peek    // a banned source's first bytes, read for ban.peek; nil: not read
	judged  *protocol.Violation

	// Its flow record (audit.Flow), as serve would have kept it for the connection. The flow
	// goes on after the verdict while serve would have kept the connection: in monitor mode, or
	// after a gap.
	fromClient  uint64 // client bytes, by sequence number: a retransmission counts once
	cliNext     uint32 // sequence number after the client's furthest byte
	cliKnown    bool
	fromStore   uint64 // the store's bytes, counted as the client's
	srvNext     uint32
	srvKnown    bool
	toStore     uint64 // what serve would have forwarded: whole valid messages
	held        uint64 // what serve would hold of the message in progress
	first       [audit.MaxFirstBytes]byte
	firstN      int
	flowVerdict audit.Verdict // as decided; open at the end of the capture
	warnings    []audit.Event // would_block events of rules in monitor mode (at most maxWarnings)
	warnedRule  string        // the first of them
	flowReason  string
	flowEnded   bool
	flowEnd     time.Time
	closedBy    string
	flowOpen    bool // the capture ended first
}

// Accept takes every segment: checksums are not checked, and the synthetic resets of
// unhookStream force the never-fed server half to start.
func (s *stream) Accept(tcp *layers.TCP, _ gopacket.CaptureInfo, dir reassembly.TCPFlowDirection, _ reassembly.Sequence,
	start *bool, _ reassembly.AssemblerContext) bool {
	if dir == reassembly.TCPDirServerToClient {
		*start = true
		return true
	}
	s.see(tcp)
	return true
}

// see records how far the client's sequence numbers have gone.
func (s *stream) see(tcp *layers.TCP) {
	if end := tcp.Seq + uint32(len(tcp.Payload)); int32(end-s.seen) > 0 {
		s.seen = end
	}
}

// ReassembledSG decodes the next in-order bytes.
func (s *stream) ReassembledSG(sg reassembly.ScatterGather, _ reassembly.AssemblerContext) {
	dir, _, end, skip := sg.Info()
	if dir == reassembly.TCPDirServerToClient || s.done {
		return
	}
	n, _ := sg.Lengths()
	if skip != 0 {
		// The reassembler gave up waiting for a hole (or its page limits forced it on): the
		// framing after it cannot be trusted.
		s.next += uint32(max(skip, 0) + n)
		if s.refused != "" {
			s.endPeek(s.last) // what came before the hole is what can be told
			return
		}
		s.decide(VerdictIncomplete, s.gapReason(), s.last)
		return
	}
	var p []byte
	if n > 0 {
		p = sg.Fetch(n)
	}
	s.deliver(p, end)
}

// deliver decodes p, the next in-order bytes of the stream; end is its FIN or RST.
func (s *stream) deliver(p []byte, end bool) {
	s.next += uint32(len(p))
	if len(p) > 0 {
		s.feed(p)
	}
	if end && !s.done {
		s.close(audit.ClosedByClient, s.last)
	}
}

// countClient counts a client segment's new bytes.
func (s *stream) countClient(tcp *layers.TCP) {
	s.fromClient += advance(&s.cliNext, &s.cliKnown, tcp)
}

// countStore counts a store segment's new bytes.
func (s *stream) countStore(tcp *layers.TCP) {
	if tcp.SYN {
		s.srvNext, s.srvKnown = tcp.Seq+1, true
	}
	s.fromStore += advance(&s.srvNext, &s.srvKnown, tcp)
}

// advance moves next, the sequence number after the furthest byte of one direction, past tcp's
// payload and returns by how much: bytes sent again, or before next, count once. A hole (bytes
// the capture missed) counts as sent.
func advance(next *uint32, known *bool, tcp *layers.TCP) uint64 {
	if len(tcp.Payload) == 0 {
		return 0
	}
	start := tcp.Seq
	if tcp.SYN {
		start++ // a SYN's data follows its sequence number
	}
	if !*known {
		*next, *known = start, true
	}
	end := start + uint32(len(tcp.Payload))
	d := int32(end - *next)
	if d <= 0 {
		return 0
	}
	*next = end
	return uint64(d)
}

// ReassemblyComplete is the reassembler letting go of the stream: after unhookStream, or when
// it has been idle for IdleClose.
func (s *stream) ReassemblyComplete(reassembly.AssemblerContext) bool {
	if !s.done {
		s.c.letGo(s)
	}
	return true
}

// feed judges p, the next bytes of the stream, arriving at the capture clock's time.
func (s *stream) feed(p []byte) {
	now := s.c.now
	if s.expireDue(now, true) {
		return // the message in progress timed out (or a refused stream's reading ended) before these bytes came
	}
	if s.refused != "" {
		s.readPeek(p, now)
		return
	}
	d := s.g.Feed(p, now)
	for _, w := range d.Warnings {
		s.warn(w, now)
	}
	if s.firstN < len(s.first) {
		s.firstN += copy(s.first[s.firstN:], p)
	}
	if d.Send {
		s.toStore += s.held + uint64(d.Forward)
		s.held = 0
	}
	if d.Keep {
		s.held += uint64(len(p) - d.Forward)
	}
	if d.Talked {
		s.c.sources.Talk(s.key.src.Addr())
	}
	if d.Violation != nil {
		s.reject(d.Violation, d.First, now)
		return
	}
	s.schedule()
}

// readPeek reads p, the next bytes of a banned source's stream, at now, as serve's peek reads
// them (verdict.Peek).
func (s *stream) readPeek(p []byte, now time.Time) {
	if s.peek.Read(p, now) {
		s.endPeek(now)
		return
	}
	s.schedule()
}

// endPeek ends a refused stream where serve closes the connection, at: its flow record holds what
// was read for ban.peek and the rule those bytes would have broken, as a stream's first bytes.
func (s *stream) endPeek(at time.Time) {
	if s.peek != nil {
		s.c.peeks.Done()
		s.judged = protocol.FirstViolation(s.c.r.dec, s.peek.Bytes())
	}
	s.decide(VerdictRefused, string(s.refused), at)
	s.endFlow(audit.ClosedByGuard, at)
}

// deadline is when serve's read deadline would fire in the stream's state; zero for none.
func (s *stream) deadline() time.Time {
	switch {
	case s.done || s.midstream || s.halfOpen:
		return time.Time{}
	case s.refused != "":
		return s.peek.Until()
	}
	return s.g.Deadline()
}

// expireDue applies a deadline that has passed by now and reports whether the stream is decided.
// Unless bytes are being delivered, a hole waiting to be filled defers the judgement: the bytes
// behind it may have come in time, and the gap will be reported if they never do.
func (s *stream) expireDue(now time.Time, delivering bool) bool {
	if s.done {
		return true
	}
	if s.timer >= 0 && now.Before(s.due) {
		return false // s.due is s.deadline() while the stream is in the timer heap
	}
	d := s.deadline()
	switch {
	case d.IsZero() || now.Before(d):
		return false
	case s.refused != "":
		s.endPeek(d) // serve stops reading then, whether bytes wait behind a hole or not
		return true
	case !delivering && s.holePending():
		return false
	}
	if e := s.g.Expired(s.c.sources.Serving(s.key.src.Addr())); e.Violation != nil {
		s.reject(e.Violation, e.First, d)
		return true
	}
	s.schedule() // spared
	return false
}

func (s *stream) holePending() bool { return int32(s.seen-s.next) > 0 }

func (s *stream) gapReason() string {
	if s.truncated {
		return ReasonSnaplen
	}
	return ReasonGap
}

// close ends the stream at the FIN or RST of by (the client or the store), at: serve's connection
// would end there, the client's side closing it or the store's. A message in progress is cut
// short: truncated_message, at its start.
func (s *stream) close(by string, at time.Time) {
	switch {
	case s.done:
	case s.halfOpen:
		s.decide(VerdictHalfOpen, "", at)
	case s.refused != "":
		if !s.expireDue(s.c.now, true) {
			s.endPeek(at)
		}
	case s.midstream:
		s.decide(VerdictIncomplete, ReasonMidstream, at)
	case s.holePending():
		s.decide(VerdictIncomplete, s.gapReason(), at)
	case s.expireDue(s.c.now, true):
	default:
		if d := s.g.Ended(); d.Violation != nil {
			s.reject(d.Violation, d.First, at)
		} else {
			s.decide(VerdictPass, "", at)
		}
	}
	s.endFlow(by, at)
}

// observe judges a stream that will get no more bytes while the capture cannot tell how it
// ended: idle, evicted, its 4-tuple reused, or the capture ended, at the capture clock's time.
func (s *stream) observe() {
	switch {
	case s.done:
	case s.halfOpen:
		// never accepted: its flow ends at its last packet, the capture's end no exception
		s.decide(VerdictHalfOpen, "", s.last)
		s.endFlow("", s.last)
	case s.refused != "":
		if !s.expireDue(s.c.now, true) {
			s.endPeek(s.last)
		}
	case s.midstream:
		s.decide(VerdictIncomplete, ReasonMidstream, s.last)
	case s.holePending():
		s.decide(VerdictIncomplete, s.gapReason(), s.last)
	case s.expireDue(s.c.now, true):
	default:
		s.decide(VerdictPass, "", s.last)
	}
}

func (s *stream) reject(v *protocol.Violation, first []byte, at time.Time) {
	_, known := s.g.Generation()
	s.violation = v
	o := verdict.Of(v, s.c.r.monitor)
	s.event = audit.ViolationEvent(v, known, s.key.src, s.key.dst, o.Action, audit.ModeReplay, first, s.g.Bytes())
	s.event.Timestamp, s.event.ConnID = at, s.id
	if o.Bans() {
		s.banned = s.c.violation(s, at)
	}
	end := at
	if s.last.After(end) {
		end = s.last
	}
	s.decide(VerdictReject, "", end)
	if o.Closes() {
		s.endFlow(audit.ClosedByGuard, end) // as serve does
	}
}

// maxWarnings bounds the would_block events one stream keeps for its report; the rest are counted
// in the flow's verdict only.
const maxWarnings = 64

// warn records a rule broken in monitor mode by a message serve would have forwarded, as serve's
// recordWarning does.
func (s *stream) warn(w guard.Warning, at time.Time) {
	if s.warnedRule == "" {
		s.warnedRule = string(w.Violation.Rule)
	}
	if len(s.warnings) >= maxWarnings {
		return
	}
	e := audit.ViolationEvent(w.Violation, true, s.key.src, s.key.dst, audit.ActionWouldBlock, audit.ModeReplay, w.First, s.g.Bytes())
	e.Timestamp, e.ConnID = at, s.id
	s.warnings = append(s.warnings, e)
}

// passesAll reports whether serve would have passed every byte on from the violation on: monitor
// mode, but for a message cut short, which never was.
func (s *stream) passesAll() bool {
	return s.violation != nil && verdict.Of(s.violation, s.c.r.monitor).Verdict == audit.VerdictWouldBlock
}

// decide records the verdict and queues the stream for reporting.
func (s *stream) decide(v Verdict, reason string, end time.Time) {
	if s.done {
		return
	}
	c := s.c
	s.done, s.verdict, s.reason, s.end = true, v, reason, end
	switch {
	case v == VerdictRefused:
		s.flowVerdict, s.flowReason = audit.VerdictRefused, reason
	case v == VerdictHalfOpen:
		s.flowVerdict = audit.VerdictHalfOpen
	case v == VerdictReject:
		s.flowVerdict, s.flowReason = verdict.Of(s.violation, c.r.monitor).Verdict, string(s.violation.Rule)
	case v == VerdictIncomplete:
		s.flowVerdict, s.flowReason = audit.VerdictIncomplete, reason
	case s.warnedRule != "":
		s.flowVerdict, s.flowReason = audit.VerdictWouldBlock, s.warnedRule // forwarded, a rule in monitor mode broken
	case c.ending:
		s.flowVerdict = audit.VerdictOpen // the capture ends, the connection lasts
	default:
		s.flowVerdict = verdict.Default(s.fromClient)
	}
	if s.timer >= 0 {
		heap.Remove(&c.timers, s.timer)
	}
	c.live.Remove(s.elem)
	s.elem = c.trailing.PushBack(s)
	if s.g.Talked() {
		c.sources.Untalk(s.key.src.Addr())
	}
	c.decided = append(c.decided, s)
	c.unhook = append(c.unhook, s)
}

// endFlow ends the stream's flow at, closed by by ("" when the capture cannot tell), and queues its
// record. The stream must be decided.
func (s *stream) endFlow(by string, at time.Time) {
	if s.flowEnded {
		return
	}
	c := s.c
	s.flowEnded, s.flowEnd, s.closedBy = true, at, by
	if s.release != nil {
		s.release() // serve's connection ends here
		s.release = nil
	}
	c.trailing.Remove(s.elem)
	s.elem = c.done.PushBack(s)
	c.flows = append(c.flows, s)
}

// openFlow ends the flow of a decided stream that the capture ended while it lasted.
func (s *stream) openFlow(at time.Time) {
	s.flowOpen = true
	s.endFlow("", at)
}

// flowRecord is the stream's flow record, once its flow ended.
func (s *stream) flowRecord() audit.Flow {
	if s.refused != "" {
		// as serve's refusedFlow: no conn id, no store, nothing decoded
		return audit.Flow{Src: s.key.src, Dst: s.key.dst, Start: s.start, End: s.flowEnd, Verdict: s.flowVerdict,
			Reason: s.flowReason, ClosedBy: s.closedBy, Mode: audit.ModeReplay, FromClient: uint64(len(s.peek.Bytes())),
			First: s.peek.Bytes(), Judged: s.judged}
	}
	f := audit.Flow{ConnID: s.id, Src: s.key.src, Dst: s.key.dst, Start: s.start, End: s.flowEnd,
		Verdict: s.flowVerdict, Reason: s.flowReason, ClosedBy: s.closedBy, Mode: audit.ModeReplay,
		FromClient: s.fromClient, ToStore: s.toStore, FromStore: s.fromStore}
	if s.passesAll() {
		f.ToStore = f.FromClient
	}
	if s.flowOpen {
		f.Verdict = audit.VerdictOpen
		if s.violation == nil {
			f.Reason = "" // what an incomplete stream lacked, which the record does not judge
		}
	}
	if s.midstream {
		return f // nothing decoded
	}
	ops := *s.g.Counts()
	f.Ops = &ops
	for _, n := range ops {
		f.Messages += n
	}
	pw := s.g.Pickles()
	f.Pickles, f.Base64Pickles, f.PickleKeys = pw.Raw, pw.Base64, append([]string(nil), pw.Keys...)
	if g, ok := s.g.Generation(); ok {
		f.Generation = g.String()
	}
	if f.Verdict != audit.VerdictIncomplete {
		// An incomplete stream's first bytes may well be a job's keys and values.
		f.First = s.first[:s.firstN]
	}
	return f
}

// schedule puts the stream's deadline, if any, in the capture's timer heap.
func (s *stream) schedule() {
	c := s.c
	d := s.deadline()
	switch {
	case d.IsZero():
		if s.timer >= 0 {
			heap.Remove(&c.timers, s.timer)
		}
	case s.timer >= 0:
		if !d.Equal(s.due) { // most segments of a long message leave its deadline as it was
			s.due = d
			heap.Fix(&c.timers, s.timer)
		}
	default:
		s.due = d
		heap.Push(&c.timers, s)
	}
}

func (s *stream) result() StreamResult {
	gen := "unknown"
	if g, ok := s.g.Generation(); ok {
		gen = g.String()
	}
	msgs := make(map[string]uint64)
	for op, n := range s.g.Counts() {
		if n > 0 {
			msgs[protocol.Op(op).String()] = n
		}
	}
	r := StreamResult{Src: s.key.src, Dst: s.key.dst, Generation: gen, Messages: msgs, Verdict: s.verdict,
		Reason: s.reason, Start: s.start, End: s.end, Bytes: s.bytes + s.g.Bytes(), ID: s.id, File: s.c.file,
		FlowVerdict: s.flowVerdict}
	if s.violation != nil {
		r.Violation = newViolation(s.violation)
	}
	if s.refused != "" {
		r.Bytes = uint64(len(s.peek.Bytes()))
		if s.judged != nil {
			r.Judged = newViolation(s.judged)
		}
	}
	return r
}

// timerHeap orders streams by deadline, then id, so that equal deadlines fire in a fixed order.
type timerHeap []*stream

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].id < h[j].id
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].timer, h[j].timer = i, j
}
func (h *timerHeap) Push(x any) {
	s := x.(*stream)
	s.timer = len(*h)
	*h = append(*h, s)
}
func (h *timerHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	s.timer = -1
	return s
}
