package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/storeguard/storeguard/idpattern"
	"github.com/storeguard/storeguard/internal/glob"
	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// File is a policy file: rules for what the default rules do not know (docs/policy.md).
type File struct {
	Rules []Rule `yaml:"rules"`
}

// Rule is one rule of a policy file. A message's op on a key matches it when the key matches one
// of Keys, the op is one of Ops, the source is in one of Sources and the identity its connection's
// TLS handshake proved matches one of Identities (an empty list matches all; a message of a
// plaintext connection, with no identity, matches no Identities).
// Rules are checked in order: the first that matches decides for that key (allow, deny, or the
// value's kind); the default rules apply after it all the same.
type Rule struct {
	Name    string   `yaml:"name"`
	Keys    []string `yaml:"keys,omitempty"`    // globs: * any bytes (/ too), ? one byte; the leading / of the wire key optional
	Ops     []string `yaml:"ops,omitempty"`     // op names (set, get, ...), or read, write
	Sources []string `yaml:"sources,omitempty"` // CIDRs or addresses
	// Identities are idpattern patterns: spiffe://td/ns/*/sa/worker, dns:*.job.example, uri:, cn:.
	Identities []string   `yaml:"identities,omitempty"`
	Action     string     `yaml:"action"`          // allow, deny, value, write-once
	Value      *ValueRule `yaml:"value,omitempty"` // with action value
	Mode       string     `yaml:"mode,omitempty"`  // enforce (the default) or monitor
}

// ValueRule is what a value written to a matching key must be.
type ValueRule struct {
	Kind     string   `yaml:"kind"`                // any, pickle, base64-pickle, json, integer, utf8
	MaxBytes int64    `yaml:"max-bytes,omitempty"` // 0: no bound beyond the limits
	Globals  []string `yaml:"globals,omitempty"`   // pickle kinds: globals allowed, module.name or module.*
}

// Value kinds.
const (
	KindAny          = "any"
	KindPickle       = "pickle"
	KindBase64Pickle = "base64-pickle"
	KindJSON         = "json"
	KindInteger      = "integer"
	KindUTF8         = "utf8"
)

var kinds = []string{KindAny, KindPickle, KindBase64Pickle, KindJSON, KindInteger, KindUTF8}

// Op groups a rule may name.
var (
	writeOps = []protocol.Op{protocol.OpSet, protocol.OpCompareSet, protocol.OpAdd, protocol.OpDeleteKey,
		protocol.OpAppend, protocol.OpMultiSet, protocol.OpQueuePush, protocol.OpQueuePop}
	readOps = []protocol.Op{protocol.OpGet, protocol.OpCheck, protocol.OpWait, protocol.OpGetNumKeys,
		protocol.OpMultiGet, protocol.OpListKeys, protocol.OpQueueLen, protocol.OpWatchKey}
)

// LoadFile reads a policy file. Its errors name the file, the rule and what is wrong.
func LoadFile(path string) ([]Rule, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseFile(b, path)
}

// ParseFile reads a policy file's bytes; name is for errors. Unknown keys are errors.
func ParseFile(b []byte, name string) ([]Rule, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	for i, r := range f.Rules {
		if _, err := compile(r); err != nil {
			return nil, fmt.Errorf("%s: rules[%d] (%s): %w", name, i, r.Name, err)
		}
	}
	return f.Rules, nil
}

type action uint8

const (
	actAllow action = iota
	actDeny
	actValue
	actWriteOnce // kept apart: see Policy.writeOnce
)

type compiled struct {
	name    string
	keys    [][]byte
	ops     [32]bool // by protocol.Op; all false: every op
	anyOp   bool
	sources []netip.Prefix
	ids     idpattern.Set
	act     action
	value   ValueRule
	allow   globalAllow
	mode    Mode
}

func compile(r Rule) (compiled, error) {
	c := compiled{name: r.Name, mode: Enforce, anyOp: len(r.Ops) == 0}
	if strings.TrimSpace(r.Name) == "" {
		return c, errors.New("name: required")
	}
	for _, k := range r.Keys {
		if k == "" {
			return c, errors.New("keys: an empty pattern matches nothing; use \"*\" for every key")
		}
		c.keys = append(c.keys, []byte(k))
	}
	for _, o := range r.Ops {
		switch o {
		case "write":
			for _, op := range writeOps {
				c.ops[op] = true
			}
			continue
		case "read":
			for _, op := range readOps {
				c.ops[op] = true
			}
			continue
		}
		op, ok := opByName(o)
		if !ok {
			return c, fmt.Errorf("ops: %q is not an op (%s) nor read or write", o, opNames())
		}
		c.ops[op] = true
	}
	for _, s := range r.Sources {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return c, fmt.Errorf("sources: %q is not a CIDR or an address", s)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		c.sources = append(c.sources, p.Masked())
	}
	for _, s := range r.Identities {
		p, err := idpattern.Parse(s)
		if err != nil {
			return c, fmt.Errorf("identities: %w", err)
		}
		c.ids = append(c.ids, p)
	}
	switch r.Action {
	case "allow":
		c.act = actAllow
	case "deny":
		c.act = actDeny
	case "value":
		c.act = actValue
		if r.Value == nil {
			return c, errors.New("value: required with action value")
		}
		c.value = *r.Value
		if !slices.Contains(kinds, c.value.Kind) {
			return c, fmt.Errorf("value.kind: %q is not one of %s", c.value.Kind, strings.Join(kinds, ", "))
		}
		if c.value.MaxBytes < 0 {
			return c, fmt.Errorf("value.max-bytes: must be 0 (none) or more, got %d", c.value.MaxBytes)
		}
		if len(c.value.Globals) > 0 && c.value.Kind != KindPickle && c.value.Kind != KindBase64Pickle {
			return c, errors.New("value.globals: only for kind pickle or base64-pickle")
		}
		var err error
		if c.allow, err = newGlobalAllow(c.value.Globals); err != nil {
			return c, fmt.Errorf("value.globals: %w", err)
		}
	case "write-once":
		c.act = actWriteOnce
		if len(c.keys) == 0 {
			return c, errors.New("keys: required with action write-once")
		}
		if len(r.Ops) > 0 || len(r.Sources) > 0 || len(r.Identities) > 0 {
			return c, errors.New("ops, sources, identities: a write-once rule applies to every write and delete, from anyone")
		}
	case "":
		return c, errors.New("action: required (allow, deny, value or write-once)")
	default:
		return c, fmt.Errorf("action: %q is not allow, deny, value or write-once", r.Action)
	}
	if r.Value != nil && c.act != actValue {
		return c, errors.New("value: only with action value")
	}
	if r.Mode != "" {
		m, err := ParseMode(r.Mode)
		if err != nil || m == Off {
			return c, fmt.Errorf("mode: %q is not enforce or monitor", r.Mode)
		}
		c.mode = m
	}
	return c, nil
}

// check applies c to v. hit: v breaks c (f says how); decided: c matched v and ends the rules of
// the file for it.
func (c *compiled) check(m *Message, v *fieldView) (f Finding, hit, decided bool) {
	if !c.matches(m, v) {
		return Finding{}, false, false
	}
	fail := func(rule protocol.Rule, field protocol.Field, detail string) (Finding, bool, bool) {
		return Finding{Rule: rule, Field: field, Key: protocol.ShowKey(v.key), Detail: "rule " + c.name + ": " + detail,
			Mode: c.mode}, true, true
	}
	switch c.act {
	case actDeny:
		return fail(protocol.RulePolicyDenied, v.keyField, v.op.String()+" denied")
	case actValue:
		if !v.hasValue() {
			return Finding{}, false, false // not a write of a value: the next rule decides
		}
		if why := c.badValue(v); why != "" {
			return fail(protocol.RuleValueInvalid, v.val, why)
		}
		// A pickle allow-list of the operator's own widens the default one for this key's pickles (a
		// framework's own classes); the deny list and the rule's calls still apply (checkPickle).
		if len(c.value.Globals) > 0 && (c.value.Kind == KindPickle || c.value.Kind == KindBase64Pickle) {
			v.pickleAllow = &c.allow
		}
	}
	return Finding{}, false, true
}

func (c *compiled) matches(m *Message, v *fieldView) bool {
	if !c.anyOp && (int(v.op) >= len(c.ops) || !c.ops[v.op]) {
		return false
	}
	if len(c.ids) > 0 && !c.ids.Match(m.Identity) {
		return false
	}
	if len(c.sources) > 0 {
		src := m.Src.Unmap()
		in := false
		for _, p := range c.sources {
			if p.Contains(src) {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	}
	if len(c.keys) == 0 {
		return true
	}
	if v.key == nil {
		return false
	}
	// Patterns name keys as the job does; torch's client sends them with a leading "/", which a
	// pattern may leave out.
	bare := bytes.TrimPrefix(v.key, []byte("/"))
	for _, k := range c.keys {
		if glob.Match(k, v.key) || glob.Match(k, bare) {
			return true
		}
	}
	return false
}

// badValue says why v's value is not what c asks for, "" when it is.
func (c *compiled) badValue(v *fieldView) string {
	n := int64(len(v.va) + len(v.vb))
	if c.value.MaxBytes > 0 && n > c.value.MaxBytes {
		return fmt.Sprintf("value of %d bytes, more than max-bytes %d", n, c.value.MaxBytes)
	}
	switch c.value.Kind {
	case KindPickle, KindBase64Pickle:
		var r pickle.Report
		if c.value.Kind == KindPickle {
			r = pickle.Scan(v.va, v.vb, Limits())
		} else {
			var ok bool
			if r, ok = pickle.ScanBase64(v.va, v.vb, Limits()); !ok {
				return "not base64"
			}
		}
		if !r.Complete {
			return "not a complete pickle"
		}
		return "" // what it imports and calls: checkPickle, with value.globals allowed""
	}
	val := append(append(make([]byte, 0, n), v.va...), v.vb...) // small kinds: values are checked whole
	switch c.value.Kind {
	case KindJSON:
		if !json.Valid(val) {
			return "not JSON"
		}
	case KindInteger:
		if _, err := strconv.ParseInt(strings.TrimSpace(string(val)), 10, 64); err != nil {
			return "not an integer"
		}
	case KindUTF8:
		if !utf8.Valid(val) {
			return "not UTF-8"
		}
	}
	return ""
}

// globalAllow is a pickle allow-list: module.name entries, and module.* for every name of a module.
type globalAllow struct {
	names   map[string]bool
	modules map[string]bool
}

func newGlobalAllow(entries []string) (globalAllow, error) {
	a := globalAllow{names: map[string]bool{}, modules: map[string]bool{}}
	for _, e := range entries {
		dot := strings.LastIndexByte(e, '.')
		if dot <= 0 || dot == len(e)-1 {
			return a, fmt.Errorf("%q is not module.name or module.*", e)
		}
		if e[dot+1:] == "*" {
			a.modules[e[:dot]] = true
		} else {
			a.names[e] = true
		}
	}
	return a, nil
}

func (a globalAllow) allowed(g pickle.Global) bool {
	return g.Resolved && (a.names[g.Module+"."+g.Name] || a.modules[g.Module])
}

func opByName(name string) (protocol.Op, bool) {
	for _, op := range protocol.Ops() {
		if op.String() == name {
			return op, true
		}
	}
	return protocol.OpInvalid, false
}

func opNames() string {
	var names []string
	for _, op := range protocol.Ops() {
		names = append(names, op.String())
	}
	return strings.Join(names, ", ")
}
