package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/upgrade"
	"github.com/storeguard/storeguard/verdict"
)

// Flow records (audit.Flow): every connection is accounted for at its end, and a long one every
// audit.flow-interim while it lasts. Its bytes are counted where they move (readClient,
// wroteStore, replies.follow); what it came to (verdict) where it was decided.

// Who ended a connection (flowStats.endedBy).
const (
	endedByNone uint32 = iota
	endedByClient
	endedByStore
	endedByGuard
)

var closedBy = [...]string{"", audit.ClosedByClient, audit.ClosedByStore, audit.ClosedByGuard}

// maxScanSources bounds the sources whose suspicious connections are counted at once (about
// 0.5 KiB each); beyond it the oldest window is dropped.
const maxScanSources = 16384

// flowStats is a connection's account for its flow record.
type flowStats struct {
	fromClient atomic.Uint64
	toStore    atomic.Uint64
	endedBy    atomic.Uint32 // the first to end the connection wins

	mu      sync.Mutex // guards the rest
	first   [audit.MaxFirstBytes]byte
	firstN  int
	verdict audit.Verdict // "" until a violation or a refusal decides one
	reason  string
	interim time.Time // the last interim record, or the start
}

// readClient counts p, read from the client, keeping the stream's first bytes.
func (c *conn) readClient(p []byte) {
	if n := uint64(len(p)); c.flow.fromClient.Add(n) == n {
		c.s.reg.spoke(c)
	}
	if c.flow.firstN < len(c.flow.first) { // only this connection's reader writes firstN
		c.flow.mu.Lock()
		c.flow.firstN += copy(c.flow.first[c.flow.firstN:], p)
		c.flow.mu.Unlock()
	}
}

// wroteStore counts n bytes written to the store.
func (c *conn) wroteStore(n int) {
	c.s.m.bytesC2S.Add(float64(n))
	c.flow.toStore.Add(uint64(n))
}

// ended records who ended the connection, unless someone did already.
func (f *flowStats) ended(by uint32) { f.endedBy.CompareAndSwap(endedByNone, by) }

// decided records the verdict of a violation (blocked, would_block) or a refusal; the first stays
// (monitor: the connection's mode is monitor).
func (f *flowStats) decided(v audit.Verdict, reason string, monitor bool) {
	f.mu.Lock()
	// The first verdict stands, but a block after messages let through in monitor mode (a policy
	// rule's) is what ended the connection.
	if f.verdict == "" || f.verdict == audit.VerdictWouldBlock && v != audit.VerdictWouldBlock && !monitor {
		f.verdict, f.reason = v, reason
	}
	f.mu.Unlock()
}

// carry is the flow's account, with the reply half's (r), as an upgrade carries it to the new
// process.
func (f *flowStats) carry(r *replies) upgrade.Flow {
	fc := upgrade.Flow{FromClient: f.fromClient.Load(), ToStore: f.toStore.Load()}
	r.mu.Lock()
	fc.FromStore, fc.Replied = r.fromStore, r.replied
	r.mu.Unlock()
	f.mu.Lock()
	fc.First = append([]byte(nil), f.first[:f.firstN]...)
	fc.Verdict, fc.Reason, fc.Interim = f.verdict, f.reason, f.interim
	f.mu.Unlock()
	return fc
}

// restore takes up the account a previous process kept (upgrade_linux.go), with the reply half's
// (r), before the connection starts.
func (f *flowStats) restore(fc *upgrade.Flow, r *replies) {
	f.fromClient.Store(fc.FromClient)
	f.toStore.Store(fc.ToStore)
	r.fromStore, r.replied = fc.FromStore, fc.Replied
	f.firstN = copy(f.first[:], fc.First)
	f.verdict, f.reason, f.interim = fc.Verdict, fc.Reason, fc.Interim
}

// flowRecord is c's flow as of now: final, or an interim record of a connection that lasts.
func (c *conn) flowRecord(now time.Time, interim bool) audit.Flow {
	f := audit.Flow{ConnID: c.id, Src: c.src, Dst: c.dst, Start: c.start, End: now, TLS: c.cl.record(),
		FromClient: c.flow.fromClient.Load(), ToStore: c.flow.toStore.Load(), Mode: c.st.mode()}
	c.rep.mu.Lock()
	f.FromStore, f.Replies = c.rep.fromStore, c.rep.replied
	c.rep.mu.Unlock()
	if g := c.seen.gen.Load(); g > 0 {
		f.Generation = protocol.Generation(g - 1).String()
	}
	c.flow.mu.Lock()
	f.Verdict, f.Reason = c.flow.verdict, c.flow.reason
	f.First = append([]byte(nil), c.flow.first[:c.flow.firstN]...)
	c.flow.mu.Unlock()
	if !interim {
		// The guard's counts are its reader's: read once the connection has ended.
		f.Ops = new(*c.g.Counts())
		for _, n := range f.Ops {
			f.Messages += n
		}
		pw := c.g.Pickles()
		f.Pickles, f.Base64Pickles, f.PickleKeys = pw.Raw, pw.Base64, append([]string(nil), pw.Keys...)
		f.ClosedBy = closedBy[c.flow.endedBy.Load()]
	}
	switch {
	case interim:
		f.Verdict = audit.VerdictOpen
	case f.Verdict == "":
		f.Verdict = verdict.Default(f.FromClient)
	}
	return f
}

func (st *settings) mode() audit.Mode {
	if st.monitor {
		return audit.ModeMonitor
	}
	return audit.ModeEnforce
}

// endFlow writes c's final flow record.
func (c *conn) endFlow() {
	f := c.flowRecord(c.s.now(), false)
	c.s.ev.flow(&f)
}
