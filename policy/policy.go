// Package policy judges complete, well-formed TCPStore messages by what they do: which op on which
// key, with what value, from which source. The decoder (package protocol) stops malformed and
// oversize messages; the policy stops valid ones that attack the job: a pickle that runs code in
// whoever loads it (pickle_global_denied), a write to torchrun's rendezvous state that is not
// torch's own state (rendezvous_state_invalid), and what a policy file forbids (policy_denied,
// value_invalid).
//
// Like protocol it has no sockets and no clock: guard.Stream calls Check on each message as it
// completes, before any byte of it is forwarded, for serve and replay alike.
package policy

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// Mode is how a rule acts on a message that breaks it.
type Mode uint8

const (
	// Off: the rule is not checked.
	Off Mode = iota
	// Enforce: the message is a violation (the connection closed, nothing of it forwarded).
	Enforce
	// Monitor: the message is recorded (would_block) and forwarded; the stream goes on decoded.
	Monitor
)

func (m Mode) String() string {
	switch m {
	case Enforce:
		return "enforce"
	case Monitor:
		return "monitor"
	}
	return "off"
}

// ParseMode reads enforce, monitor or off.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "enforce":
		return Enforce, nil
	case "monitor":
		return Monitor, nil
	case "off":
		return Off, nil
	}
	return Off, fmt.Errorf("%q is not enforce, monitor or off", s)
}

// Config is the policy as configured: the default rules' modes and the rules of a policy file.
type Config struct {
	// RendezvousState: writes to torchrun's rendezvous state key (rendezvous.go).
	RendezvousState Mode
	// PickleGlobals: values on any key that are pickles importing or calling what the allow-list does
	// not hold (allow.go), or what the deny list names (globals.go).
	PickleGlobals Mode
	// ValueSplit: values made of APPENDs, judged whole as the reader loads them (append.go).
	ValueSplit Mode
	// ReplySize: reads whose reply the guard can tell is too large (reply.go), with MaxReplyBytes
	// the largest reply the values the quota's account knows may add up to (0: no bound).
	ReplySize     Mode
	MaxReplyBytes int64
	// WriteOnce: the keys torch writes once per rendezvous round (writeonce.go) are not written
	// again nor deleted; it needs WithStore.
	WriteOnce Mode
	// DenyGlobals are more globals to deny, "module.name" or "module.*".
	DenyGlobals []string
	// Rules are the policy file's, checked in order before the default rules.
	Rules []Rule
	// Pickle bounds each pickle scan.
	Pickle pickle.Limits
	// Quota caps what sources make the store hold (quota.go); it needs WithStore with a Quota.
	Quota QuotaLimits
	// Learn, if set, is given every message that breaks no rule (learn.go), and Wants is true for
	// every op: `storeguard policy learn`.
	Learn *Learner
}

// Defaults is the configuration the product ships: both default rules enforced.
func Defaults() Config {
	return Config{RendezvousState: Enforce, PickleGlobals: Enforce, ValueSplit: Enforce, ReplySize: Enforce, WriteOnce: Enforce,
		Pickle: Limits()}
}

// Limits are the pickle scanner's bounds for the policy: every opcode of the largest value a store
// takes is read (an opcode is at least a byte; values are at most 64 MiB), so that nothing hides
// past the bound; a pickle past the others (stack, globals) is refused.
func Limits() pickle.Limits {
	l := pickle.DefaultLimits()
	l.MaxOps = 1 << 26
	return l
}

// Policy is a compiled Config, shared by every stream; Check may be called from any goroutine.
type Policy struct {
	cfg       Config
	deny      globalSet
	allow     globalAllow // what a pickle may import and call (allow.go)
	rules     []compiled
	writeOnce []writeOnce // the default rule, then the policy file's
	written   *Written    // WithStore
	lookup    Lookup
	quota     *Quota
	count     Count
	jobStores *JobStores
	appends   *Appends
	value     Value
}

// New compiles c. Its errors name the rule and what is wrong.
func New(c Config) (*Policy, error) {
	p := &Policy{cfg: c, deny: defaultDeny(), allow: defaultAllow(), writeOnce: []writeOnce{{keys: writeOnceKeys, mode: c.WriteOnce}}}
	if err := p.deny.add(c.DenyGlobals); err != nil {
		return nil, fmt.Errorf("deny-globals: %w", err)
	}
	var errs []error
	seen := map[string]bool{}
	for i, r := range c.Rules {
		cr, err := compile(r)
		if err == nil && seen[r.Name] {
			err = fmt.Errorf("name %q is used by an earlier rule", r.Name)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rules[%d] (%s): %w", i, r.Name, err))
			continue
		}
		seen[r.Name] = true
		if cr.act == actWriteOnce {
			p.writeOnce = append(p.writeOnce, writeOnce{name: cr.name, keys: cr.keys, mode: cr.mode})
			continue
		}
		p.rules = append(p.rules, cr)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

// Config returns the configuration p was compiled from.
func (p *Policy) Config() Config { return p.cfg }

// Wants reports whether Check has anything to judge in a message of op: the default rules read
// the ops that write a key (a value, or for write-once any change), a policy file's rules any op.
func (p *Policy) Wants(op protocol.Op) bool {
	if p == nil {
		return false
	}
	if len(p.rules) > 0 || p.cfg.Learn != nil {
		return true
	}
	switch op {
	case protocol.OpSet, protocol.OpCompareSet, protocol.OpAppend, protocol.OpMultiSet, protocol.OpQueuePush:
		return true
	case protocol.OpMultiGet, protocol.OpCheck, protocol.OpWait:
		return p.cfg.ReplySize != Off || p.jobStores != nil && p.jobStores.Asked != nil
	case protocol.OpGet:
		return p.jobStores != nil && p.jobStores.Asked != nil // reads of a round's MASTER_PORT (jobstore.go)
	case protocol.OpAdd, protocol.OpDeleteKey, protocol.OpQueuePop:
		return p.written != nil && len(p.writeOnce) > 0 || p.quotaOn()
	}
	return false
}

// chargeQuota charges the message's changes to src's account. Before a write is refused, the store
// is asked whether the account outlived its keys (Quota.stale): then the account starts afresh.
func (p *Policy) chargeQuota(src netip.Addr, changes []change) (Finding, bool) {
	f, over := p.quota.charge(p.cfg.Quota, src, changes)
	if !over || p.count == nil {
		return f, over
	}
	if n, err := p.count(); err == nil && p.quota.stale(n) {
		p.quota.Reset()
		return p.quota.charge(p.cfg.Quota, src, changes)
	}
	return f, over
}

// quotaOn reports whether the store quota is checked.
func (p *Policy) quotaOn() bool { return p.quota != nil && p.cfg.Quota.Mode != Off }

// Message is one complete request as the policy judges it.
type Message struct {
	Msg   *protocol.Message
	Bytes protocol.Split // the message's bytes, its opcode byte first
	Src   netip.Addr
	// Identity is what the connection's TLS handshake proved (identity.Peer.ID), "" for a
	// plaintext connection. Rules may name it (Rule.Identities); the store quota and write-once
	// marks stay keyed by Src.
	Identity string
	// Stream numbers the client's stream: its messages reach the store in the order they are
	// judged (append.go); 0 when not known.
	Stream uint64
	// Pickles, if set, is told each value the message writes that is a complete pickle, raw or
	// base64, when the message passes: what a flow record says reached the store.
	Pickles *PickleWrites
}

// PickleWrites counts a stream's values written that were complete pickles and passed, with the
// first keys they went to: the evidence of what a reader may load, for the flow record.
type PickleWrites struct {
	Raw, Base64 uint64   // values that are pickles raw, and as base64 (a value may be both)
	Keys        []string // the first MaxPickleKeys distinct keys, as protocol.ShowKey shows them
}

// MaxPickleKeys bounds PickleWrites.Keys.
const MaxPickleKeys = 4

func (w *PickleWrites) add(pw pickleWrite) {
	if pw.kind&PickleRaw != 0 {
		w.Raw++
	}
	if pw.kind&PickleBase64 != 0 {
		w.Base64++
	}
	if len(w.Keys) >= MaxPickleKeys {
		return
	}
	k := protocol.ShowKey(pw.key)
	for _, have := range w.Keys {
		if have == k {
			return
		}
	}
	w.Keys = append(w.Keys, k)
}

// Finding is a rule a message broke.
type Finding struct {
	Rule   protocol.Rule
	Field  protocol.Field // the offending field: its kind, offset in the message and length
	Key    string         // the key concerned, as protocol.ShowKey shows it
	Detail string         // what broke the rule: the global, the policy file's rule
	Mode   Mode           // Enforce or Monitor
}

// Check judges m. It returns the first rule m breaks in enforce mode, if any, and calls warn
// (which may be nil) for each rule it breaks in monitor mode before that.
func (p *Policy) Check(m Message, warn func(Finding)) (Finding, bool) {
	if p == nil {
		return Finding{}, false
	}
	var f Finding
	broke, warned := false, false
	var marks []string // write-once keys this message writes first
	var chArr [4]change
	changes := chArr[:0]   // what the message does to the quota's account
	var jobs []jobStoreKey // what it does with the rounds' MASTER_ADDR and MASTER_PORT
	var replies replyCheck // the keys it reads (reply.go)
	var pickles []pickleWrite
	var joins [][]byte // the runs whose rendezvous state it writes (agent.go)
	// A finding in monitor mode is reported and checking goes on; the first in enforce mode ends it.
	report := func(x Finding) bool {
		if x.Mode == Monitor {
			warned = true
			if warn != nil {
				warn(x)
			}
			return false
		}
		f, broke = x, true
		return true
	}
	w := walker{m: m}
	w.each(func(fld fieldView) bool {
		for i := range p.rules {
			x, hit, decided := p.rules[i].check(&m, &fld)
			if hit && report(x) {
				return false
			}
			if decided {
				break
			}
		}
		if x, hit := p.checkRendezvous(&fld); hit && report(x) {
			return false
		}
		if x, hit := p.checkPickle(&fld); hit && report(x) {
			return false
		}
		if fld.statePickle {
			fld.pickleKind = PickleBase64
			if run, ok := stateRun(fld.key); ok && p.written != nil {
				joins = append(joins, run)
			}
		}
		if fld.pickleKind != 0 && m.Pickles != nil {
			pickles = append(pickles, pickleWrite{key: fld.key, kind: fld.pickleKind})
		}
		if x, hit := p.checkSplit(&m, &fld); hit && report(x) {
			return false
		}
		if x, hit := p.checkReply(&fld, &replies); hit && report(x) {
			return false
		}
		for i := range p.writeOnce {
			if x, hit := p.checkWriteOnce(&p.writeOnce[i], &fld, &m, &marks); hit && report(x) {
				return false
			}
		}
		if p.quotaOn() {
			changes = p.quota.note(&fld, changes)
		}
		if p.jobStores != nil {
			jobs = noteJobStore(&fld, jobs)
		}
		return true
	})
	if !broke && len(changes) > 0 {
		if x, over := p.chargeQuota(m.Src, changes); over {
			report(x)
		}
	}
	if !broke {
		for _, k := range marks {
			p.written.add(k)
		}
		for _, run := range joins {
			p.written.joined(run, m.Src, m.Identity)
		}
		if len(jobs) > 0 {
			p.jobStores.tell(jobs, m)
		}
		for _, w := range pickles {
			m.Pickles.add(w)
		}
	}
	if p.cfg.Learn != nil {
		p.cfg.Learn.observe(m, broke || warned)
	}
	return f, broke
}
