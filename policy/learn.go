package policy

import (
	"bytes"
	"cmp"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"

	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// Bounds of what a Learner keeps, whatever the traffic.
const (
	// MaxLearnedPatterns is how many key patterns a Learner keeps; uses of further patterns are
	// counted (LearnStats.Dropped) and left to the catch-all rule.
	MaxLearnedPatterns = 4096
	// maxLearnedGlobals is how many globals one pattern's pickles may import in all before the
	// pattern stops being learned as a pickle kind (its values are then utf8 or any).
	maxLearnedGlobals = 256
	// maxDistinctKeys is how many distinct keys of one pattern are counted exactly.
	maxDistinctKeys = 1024
	// maxExamples is how many keys of one pattern the policy file shows.
	maxExamples = 3
	// minMaxBytes is the least max-bytes a learned value rule gets.
	minMaxBytes = 4 << 10
)

// NotLearned is the name of a learned policy's last rule: any op on any key (or none) that the
// learned rules do not name, denied in monitor mode.
const NotLearned = "not-learned"

// A Learner records what a job's traffic does, for `storeguard policy learn`: per key pattern the
// ops used and the kinds and sizes of the values written, and the ops without a key. Rules turns
// that into a starting policy. It has no sockets and no clock; a Policy whose Config.Learn is set
// feeds it every message that breaks no rule. It is safe for concurrent use.
type Learner struct {
	seed maphash.Seed

	mu       sync.Mutex
	patterns map[string]*keyUse
	keyless  [32]uint64 // views of ops without a key, by protocol.Op
	messages uint64
	skipped  uint64
	dropped  uint64
}

// LearnStats say how much a Learner has seen.
type LearnStats struct {
	Messages uint64 // messages judged
	Skipped  uint64 // messages not learned: they broke a rule (in enforce or monitor mode)
	Patterns int    // key patterns learned
	// Dropped counts key uses not learned: an empty key (no pattern can name it), or a pattern
	// beyond MaxLearnedPatterns. The catch-all rule records them.
	Dropped uint64
}

// keyUse is what one key pattern was used for.
type keyUse struct {
	pattern  string
	ops      [32]uint64 // views by protocol.Op
	valueOps [32]bool   // ops seen writing a value
	values   uint64
	kinds    kindSet // the kinds every value had
	maxBytes int64
	globals  [2]map[string]bool // union of the globals its values import, as pickle and as base64 pickle
	keys     map[uint64]struct{}
	examples []string
}

// kindSet is a set of value kinds (ValueRule.Kind), any excluded: every value is any.
type kindSet uint8

const (
	kindPickle kindSet = 1 << iota
	kindBase64Pickle
	kindJSON
	kindInteger
	kindUTF8
	allKinds kindSet = 1<<iota - 1
)

// narrowest lists the kinds from the narrowest: a learned rule takes the first that every value had.
var narrowest = []struct {
	bit  kindSet
	name string
}{
	{kindInteger, KindInteger}, {kindJSON, KindJSON}, {kindBase64Pickle, KindBase64Pickle},
	{kindPickle, KindPickle}, {kindUTF8, KindUTF8},
}

func (k kindSet) narrowest() string {
	for _, n := range narrowest {
		if k&n.bit != 0 {
			return n.name
		}
	}
	return KindAny
}

// NewLearner returns an empty Learner.
func NewLearner() *Learner {
	return &Learner{seed: maphash.MakeSeed(), patterns: map[string]*keyUse{}}
}

// Stats returns what l has seen so far.
func (l *Learner) Stats() LearnStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return LearnStats{Messages: l.messages, Skipped: l.skipped, Patterns: len(l.patterns), Dropped: l.dropped}
}

// KeyPattern generalises a key as learned rules name it: every maximal run of decimal digits
// becomes *, so that the keys of every round, rank and index share one pattern
// (/torch.rendezvous.job.0/MASTER_ADDR and .1/ merge). A ? or * of the key becomes * too (a
// pattern cannot say the byte itself), and runs of * are one. The client's leading / is kept:
// it is what audit events show as storeguard.key, and it is what keeps each learned key under its
// own pattern's rule (see Rules). ok is false for an empty key, which no pattern can name.
func KeyPattern(key []byte) (pattern string, ok bool) {
	if len(key) == 0 {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(key))
	star := false
	for _, c := range key {
		if c >= '0' && c <= '9' || c == '?' || c == '*' {
			if !star {
				b.WriteByte('*')
			}
			star = true
			continue
		}
		star = false
		b.WriteByte(c)
	}
	return b.String(), true
}

// use is one fieldView as the learner records it, worked out before the lock is taken.
type use struct {
	op       protocol.Op
	pattern  string // "" for an op without a key
	key      string // as protocol.ShowKey shows it
	hash     uint64
	unnamed  bool // a key no pattern can name
	hasValue bool
	size     int64
	kinds    kindSet
	globals  [2][]string // the globals it imports as pickle and as base64 pickle, module.name
}

// observe records m, a message that broke (broke) or did not break a rule. Only messages that
// broke none are learned: what a rule stops or records is not the job's to keep doing.
func (l *Learner) observe(m Message, broke bool) {
	var uses []use
	if !broke {
		w := walker{m: m}
		w.each(func(v fieldView) bool {
			uses = append(uses, l.describe(&v))
			return true
		})
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.messages++
	if broke {
		l.skipped++
		return
	}
	for i := range uses {
		l.add(&uses[i])
	}
}

// describe works out what the learner keeps of v.
func (l *Learner) describe(v *fieldView) use {
	u := use{op: v.op}
	if v.keyField.Kind != protocol.FieldNone {
		p, ok := KeyPattern(v.key)
		if !ok {
			return use{op: v.op, unnamed: true}
		}
		u.pattern, u.key, u.hash = p, protocol.ShowKey(v.key), maphash.Bytes(l.seed, v.key)
	}
	if v.hasValue() {
		u.hasValue, u.size = true, int64(len(v.va)+len(v.vb))
		u.kinds, u.globals = valueKinds(v)
	}
	return u
}

// add records u; l.mu is held.
func (l *Learner) add(u *use) {
	if u.unnamed {
		l.dropped++
		return
	}
	if u.pattern == "" {
		if int(u.op) < len(l.keyless) {
			l.keyless[u.op]++
		}
		return
	}
	k := l.patterns[u.pattern]
	if k == nil {
		if len(l.patterns) >= MaxLearnedPatterns {
			l.dropped++
			return
		}
		k = &keyUse{pattern: u.pattern, kinds: allKinds, keys: map[uint64]struct{}{}}
		l.patterns[u.pattern] = k
	}
	if int(u.op) < len(k.ops) {
		k.ops[u.op]++
	}
	if _, seen := k.keys[u.hash]; !seen && len(k.keys) < maxDistinctKeys {
		k.keys[u.hash] = struct{}{}
		if len(k.examples) < maxExamples {
			k.examples = append(k.examples, u.key)
		}
	}
	if !u.hasValue {
		return
	}
	k.valueOps[u.op] = true
	k.values++
	k.kinds &= u.kinds
	k.maxBytes = max(k.maxBytes, u.size)
	for i, bit := range pickleKinds {
		if k.kinds&bit == 0 {
			k.globals[i] = nil
			continue
		}
		if k.globals[i] == nil {
			k.globals[i] = map[string]bool{}
		}
		for _, g := range u.globals[i] {
			k.globals[i][g] = true
		}
		if len(k.globals[i]) > maxLearnedGlobals {
			k.kinds &^= bit
			k.globals[i] = nil
		}
	}
}

// defaultAllowed is the default pickle allow-list: what a learned value.globals need not name.
var defaultAllowed = defaultAllow()

// pickleKinds are the pickle kinds, in the order of keyUse.globals.
var pickleKinds = [2]kindSet{kindPickle, kindBase64Pickle}

// valueKinds is every kind v's value is, as a value rule of that kind judges it (badValue, with no
// size bound), and for a pickle kind the globals it imports. Cheap tests skip the checks that
// cannot pass; they may only leave a kind out, never claim one.
func valueKinds(v *fieldView) (kindSet, [2][]string) {
	var ks kindSet
	var globals [2][]string
	fits := func(kind string, globals []string) bool {
		c := compiled{act: actValue, value: ValueRule{Kind: kind, Globals: globals}}
		var err error
		if c.allow, err = newGlobalAllow(globals); err != nil {
			return false
		}
		return c.badValue(v) == ""
	}
	if names, ok := listable(pickle.Scan(v.va, v.vb, Limits())); ok && fits(KindPickle, names) {
		ks |= kindPickle
		globals[0] = names
	}
	if r, ok := pickle.ScanBase64(v.va, v.vb, Limits()); ok {
		if names, ok := listable(r); ok && fits(KindBase64Pickle, names) {
			ks |= kindBase64Pickle
			globals[1] = names
		}
	}
	first := firstNonSpace(v.va, v.vb)
	if n := len(v.va) + len(v.vb); n <= 64 && fits(KindInteger, nil) {
		ks |= kindInteger
	}
	if first >= 0 && bytes.IndexByte([]byte(`{["-0123456789tfn`), byte(first)) >= 0 && fits(KindJSON, nil) {
		ks |= kindJSON
	}
	if fits(KindUTF8, nil) {
		ks |= kindUTF8
	}
	return ks, globals
}

// firstNonSpace is the first byte of a then b that is not JSON whitespace, -1 if none.
func firstNonSpace(a, b []byte) int {
	for _, p := range [][]byte{a, b} {
		for _, c := range p {
			if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
				return int(c)
			}
		}
	}
	return -1
}

// listable returns the globals of a complete pickle that the default allow-list does not hold, as
// value.globals entries, sorted and unique;
// ok is false when the pickle is not one a pickle kind accepts (incomplete, truncated) or imports
// a global an entry cannot name exactly (unresolved, an empty module or name, a name that would
// read as the module.* wildcard).
func listable(r pickle.Report) (names []string, ok bool) {
	if !r.Complete || r.Truncated {
		return nil, false
	}
	names = []string{} // not nil: a pickle with no global is still a pickle
	for _, g := range r.Globals {
		if defaultAllowed.allowed(g) {
			continue
		}
		if !g.Resolved || g.Module == "" || g.Name == "" || g.Name == "*" ||
			strings.HasSuffix(g.Name, ".") || strings.HasSuffix(g.Name, ".*") {
			return nil, false
		}
		names = append(names, g.Module+"."+g.Name)
	}
	slices.Sort(names)
	return slices.Compact(names), true
}

// marginBytes is a learned max-bytes: twice the largest value seen, rounded up to a power of two,
// at least minMaxBytes. A job's values grow with its model and world size; twice the largest is
// room for that, and a value far beyond it is worth a look.
func marginBytes(largest int64) int64 {
	n := int64(minMaxBytes)
	for n < 2*largest && n < 1<<62 {
		n <<= 1
	}
	return n
}

// specificity orders patterns so that a key's own pattern comes before every other pattern that
// matches it: more literal bytes first, then fewer stars. A pattern Q that matches a key k
// matches every literal byte of Q to a literal byte of k (a learned pattern has no digit, ? or *
// byte), so Q has at most as many literal bytes as k's pattern, one fewer when it matches k
// without its leading /; with as many, Q's literals are k's, and Q has a star wherever k's
// pattern has one, and more.
func specificity(a, b *keyUse) int {
	la, sa := literals(a.pattern)
	lb, sb := literals(b.pattern)
	if c := cmp.Compare(lb, la); c != 0 {
		return c
	}
	if c := cmp.Compare(sa, sb); c != 0 {
		return c
	}
	return strings.Compare(a.pattern, b.pattern)
}

func literals(p string) (lits, stars int) {
	stars = strings.Count(p, "*")
	return len(p) - stars, stars
}

// learnedRule is a rule of a learned policy and what it was learned from, for the file's comments.
type learnedRule struct {
	Rule
	note string
}

// Rules returns the starting policy l has learned, in the order it must be checked:
//   - per key pattern, most specific first, a value rule for the ops that wrote values there
//     (kind: the narrowest every value was; pickle kinds with globals the union of those
//     imported; max-bytes: marginBytes of the largest), then an allow rule for its other ops;
//   - an allow rule for the ops seen without a key (VALIDATE, PING, GETNUMKEYS, LIST_KEYS ...);
//   - NotLearned: every other op on any key, or without one, denied in monitor mode, so that an
//     operator sees what else the job does before enforcing.
//
// The rules pass New, and give no finding on the messages learned from: each key's own pattern
// comes first among those matching it (see specificity), and its value rule admits every value
// seen there.
func (l *Learner) Rules() []Rule {
	lr := l.rules()
	rules := make([]Rule, len(lr))
	for i := range lr {
		rules[i] = lr[i].Rule
	}
	return rules
}

func (l *Learner) rules() []learnedRule {
	l.mu.Lock()
	defer l.mu.Unlock()
	uses := make([]*keyUse, 0, len(l.patterns))
	for _, k := range l.patterns {
		uses = append(uses, k)
	}
	slices.SortFunc(uses, specificity)
	var out []learnedRule
	for i, k := range uses {
		keys := []string{k.pattern}
		note := k.note()
		var valueOps, otherOps []string
		for op, n := range k.ops {
			switch {
			case n == 0:
			case k.valueOps[op]:
				valueOps = append(valueOps, protocol.Op(op).String())
			default:
				otherOps = append(otherOps, protocol.Op(op).String())
			}
		}
		if len(valueOps) > 0 {
			v := &ValueRule{Kind: k.kinds.narrowest(), MaxBytes: marginBytes(k.maxBytes)}
			if i := slices.Index([]string{KindPickle, KindBase64Pickle}, v.Kind); i >= 0 {
				for g := range k.globals[i] { // what the default allow-list lacks; none: nil, as a file reads back
					v.Globals = append(v.Globals, g)
				}
				slices.Sort(v.Globals)
			}
			out = append(out, learnedRule{Rule{Name: fmt.Sprintf("learned-%d-values", i+1), Keys: keys, Ops: valueOps,
				Action: "value", Value: v}, note})
			note = ""
		}
		if len(otherOps) > 0 {
			out = append(out, learnedRule{Rule{Name: fmt.Sprintf("learned-%d", i+1), Keys: keys, Ops: otherOps,
				Action: "allow"}, note})
		}
	}
	var keyless, counts []string
	listOp := false // an op that takes a list of keys, seen with none
	for op, n := range l.keyless {
		if n > 0 {
			keyless = append(keyless, protocol.Op(op).String())
			counts = append(counts, fmt.Sprintf("%s %d", protocol.Op(op), n))
			switch protocol.Op(op) {
			case protocol.OpCheck, protocol.OpWait, protocol.OpMultiGet, protocol.OpMultiSet:
				listOp = true
			}
		}
	}
	if len(keyless) > 0 {
		note := "Ops without a key: " + strings.Join(counts, ", ") + "."
		if listOp {
			note += "\nA rule without keys matches its ops on every key too: CHECK, WAIT, MULTI_GET or MULTI_SET\n" +
				"with no key here allows them on any key the rules above do not name."
		}
		out = append(out, learnedRule{Rule{Name: "learned-keyless", Ops: keyless, Action: "allow"}, note})
	}
	note := "Everything else, recorded (would_block, policy_denied) and forwarded: set mode: enforce once\n" +
		"the audit log shows nothing of the job's own here."
	if l.dropped > 0 {
		note += fmt.Sprintf("\n%d key uses were not learned (an empty key, or past %d patterns): they land here.",
			l.dropped, MaxLearnedPatterns)
	}
	out = append(out, learnedRule{Rule{Name: NotLearned, Action: "deny", Mode: "monitor"}, note})
	return out
}

// note says what k was learned from.
func (k *keyUse) note() string {
	var s string
	switch n := len(k.keys); {
	case n <= len(k.examples):
		s = fmt.Sprintf("%s: %s", plural(n, "key"), strings.Join(k.examples, " "))
	case n >= maxDistinctKeys:
		s = fmt.Sprintf("%d keys or more, such as %s", n, strings.Join(k.examples, " "))
	default:
		s = fmt.Sprintf("%d keys, such as %s", n, strings.Join(k.examples, " "))
	}
	var ops []string
	for op, c := range k.ops {
		if c > 0 {
			ops = append(ops, fmt.Sprintf("%s %d", protocol.Op(op), c))
		}
	}
	s += "\n" + strings.Join(ops, ", ")
	if k.values > 0 {
		s += fmt.Sprintf("; %s of %s, the largest %s", plural(int(k.values), "value"), k.kinds.narrowest(),
			plural(int(k.maxBytes), "byte"))
	}
	return s
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// YAML returns the learned policy as a policy file (ParseFile reads it back): header (lines,
// written as comments), then the rules of Rules, each pattern's first with a comment saying what
// it was learned from.
func (l *Learner) YAML(header string) ([]byte, error) {
	lr := l.rules()
	rules := make([]Rule, len(lr))
	for i := range lr {
		rules[i] = lr[i].Rule
	}
	var doc yaml.Node
	if err := doc.Encode(File{Rules: rules}); err != nil {
		return nil, err
	}
	doc.HeadComment = comment(header)
	if len(doc.Content) == 2 && doc.Content[1].Kind == yaml.SequenceNode {
		for i, item := range doc.Content[1].Content {
			if i < len(lr) && lr[i].note != "" {
				item.HeadComment = comment(lr[i].note)
			}
			// keys and ops on one line each, as docs/policy.md writes them
			for j := 0; j+1 < len(item.Content); j += 2 {
				if k := item.Content[j].Value; k == "keys" || k == "ops" {
					item.Content[j+1].Style = yaml.FlowStyle
				}
			}
		}
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// comment is text as YAML comment lines.
func comment(text string) string {
	if text == "" {
		return ""
	}
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	for i, ln := range lines {
		lines[i] = strings.TrimRight("# "+ln, " ")
	}
	return strings.Join(lines, "\n")
}
