package protocol

import (
	"errors"
	"fmt"
	"strconv"
)

// Limits are the ceilings a decoder enforces. The defaults are torch's libuv backend's own
// (TCPStoreLibUvBackend.cpp MAX_STRING_LEN, MAX_PAYLOAD_LEN, MAX_KEY_COUNT) plus a whole-message cap,
// which libuv lacks.
type Limits struct {
	MaxKeyBytes     uint64 // a key's declared length
	MaxValueBytes   uint64 // a value's (expected's, desired's) declared length
	MaxKeys         uint64 // keys in CHECK/WAIT/MULTI_GET, pairs in MULTI_SET
	MaxMessageBytes uint64 // a whole message, as declared so far
	BlockWatchKey   bool   // G0 WATCH_KEY: pushes unsolicited bytes, leaks across connections
	RejectZeroCount bool   // CHECK/WAIT/MULTI_GET/MULTI_SET with no keys
}

// MaxLimit bounds every configurable limit, so that sums of limits cannot overflow a uint64.
const MaxLimit = 1 << 40

// DefaultLimits returns the default ceilings.
func DefaultLimits() Limits {
	return Limits{
		MaxKeyBytes:     8192,
		MaxValueBytes:   8 << 20,
		MaxKeys:         128 << 10,
		MaxMessageBytes: 32 << 20,
		BlockWatchKey:   true,
	}
}

// Validate reports limits that are zero or above MaxLimit.
func (l Limits) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    uint64
	}{
		{"max-key-bytes", l.MaxKeyBytes}, {"max-value-bytes", l.MaxValueBytes},
		{"max-keys", l.MaxKeys}, {"max-message-bytes", l.MaxMessageBytes},
	} {
		if f.v == 0 || f.v > MaxLimit {
			errs = append(errs, fmt.Errorf("%s: must be between 1 and %d, got %d", f.name, uint64(MaxLimit), f.v))
		}
	}
	return errors.Join(errs...)
}

// Rule is a stable identifier of what a violation broke; audit logs and metrics use it verbatim.
type Rule string

const (
	RuleKeyTooLong          Rule = "key_too_long"
	RuleValueTooLong        Rule = "value_too_long"
	RuleTooManyKeys         Rule = "too_many_keys"
	RuleMessageTooLarge     Rule = "message_too_large"
	RuleUnknownOpcode       Rule = "unknown_opcode"
	RuleValidateMissing     Rule = "validate_missing"
	RuleValidateBadMagic    Rule = "validate_bad_magic"
	RuleValidateRepeated    Rule = "validate_repeated"
	RulePingBeforeValidate  Rule = "ping_before_validate"
	RuleOpNotInBackend      Rule = "op_not_in_backend"
	RuleWatchKeyBlocked     Rule = "watch_key_blocked"
	RuleZeroCount           Rule = "zero_count"
	RuleMessageTimeout      Rule = "message_timeout"
	RuleFirstMessageTimeout Rule = "first_message_timeout"
	// RuleValidateToLegacyStore is VALIDATE (a torch 2.2+ client's first message) on its way to a
	// G0/G1 store, which reads it as a SET whose 8-byte key length starts with the magic: the
	// attacker's next bytes size the store's allocation (#106294 through a handshake).
	RuleValidateToLegacyStore Rule = "validate_to_legacy_store"
	// RuleRepliesUnread is a client that takes none of the replies the guard holds for it within
	// timeouts.reply-read (or for 500 ms once they fill caps.reply-buffer-bytes): serve, not the decoder.
	RuleRepliesUnread Rule = "replies_unread"
	// RuleTruncatedMessage is a stream that ended (the client's FIN or RST) inside a message: a probe
	// of a few bytes, or a client that died mid-message. Nothing of it reached the store; it is
	// recorded, never counted towards a ban (a rank killed mid-message is no attacker).
	RuleTruncatedMessage Rule = "truncated_message"

	// The policy stage's rules (package policy): a complete, well-formed message whose op, key,
	// value or source a rule forbids. Violation.Key names the key, Violation.Detail what broke.
	//
	// RulePickleGlobalDenied: a value that is a pickle (raw or base64) importing a global that runs
	// code (os.system, builtins.eval, subprocess.Popen ...): whoever unpickles it runs it.
	RulePickleGlobalDenied Rule = "pickle_global_denied"
	// RuleRendezvousStateInvalid: a write to torchrun's rendezvous state key that is neither
	// torch's sentinel nor base64 of a pickle of torch's own state objects, or an APPEND to it.
	RuleRendezvousStateInvalid Rule = "rendezvous_state_invalid"
	// RuleKeyWriteOnce: a second write, or a delete, of a key torch writes once (a policy rule).
	RuleKeyWriteOnce Rule = "key_write_once"
	// RulePolicyDenied: an op on a key that a policy rule denies.
	RulePolicyDenied Rule = "policy_denied"
	// RuleValueInvalid: a value that is not of the kind a policy rule asks for.
	RuleValueInvalid Rule = "value_invalid"
	// RuleValueSplit: a value made of pieces (APPEND) that a reader would load as a pickle no single
	// write of it could carry: an APPEND that leaves a value more bytes could still turn into a
	// pickle, to a key written whole through the guard, or a whole write racing an APPEND (a policy rule).
	RuleValueSplit Rule = "value_split"
	// RuleReplyTooLarge: a read whose reply the guard can tell would exceed what a client may hold
	// (a MULTI_GET naming a key more than once; the sizes the quota's account knows) (a policy rule).
	RuleReplyTooLarge Rule = "reply_too_large"
	// RuleStoreQuota: a write that would make the store hold more for its source, or for everyone,
	// than quota.* allows (valid SETs that fill the store's host).
	RuleStoreQuota Rule = "store_quota_exceeded"
)

// IsRule reports whether s names a rule.
func IsRule(s string) bool {
	for _, r := range Rules() {
		if string(r) == s {
			return true
		}
	}
	return false
}

// Rules lists every rule, for metrics that pre-register one series per rule.
func Rules() []Rule {
	return []Rule{RuleKeyTooLong, RuleValueTooLong, RuleTooManyKeys, RuleMessageTooLarge,
		RuleUnknownOpcode, RuleValidateMissing, RuleValidateBadMagic, RuleValidateRepeated,
		RulePingBeforeValidate, RuleOpNotInBackend, RuleWatchKeyBlocked, RuleZeroCount,
		RuleMessageTimeout, RuleFirstMessageTimeout, RuleValidateToLegacyStore, RuleRepliesUnread,
		RuleTruncatedMessage, RulePickleGlobalDenied, RuleRendezvousStateInvalid, RuleKeyWriteOnce,
		RulePolicyDenied, RuleValueInvalid, RuleStoreQuota, RuleValueSplit, RuleReplyTooLarge}
}

// IsPolicyRule reports whether r is one of the policy stage's rules: broken by a well-formed message.
func IsPolicyRule(r Rule) bool {
	switch r {
	case RulePickleGlobalDenied, RuleRendezvousStateInvalid, RuleKeyWriteOnce, RulePolicyDenied, RuleValueInvalid,
		RuleStoreQuota, RuleValueSplit, RuleReplyTooLarge:
		return true
	}
	return false
}

// Violation is the first rule a stream broke. It is an error; use errors.As to get it.
type Violation struct {
	Rule       Rule
	Field      FieldKind  // the offending field, FieldNone for opcode-level rules
	Offset     uint64     // stream offset of the offending field (or of the opcode byte)
	Index      uint64     // index of the offending message in the stream, 0-based
	MsgOffset  uint64     // stream offset of the offending message's opcode byte
	Op         Op         // the message's operation, OpInvalid when the opcode is unknown
	Wire       byte       // the message's opcode byte
	Generation Generation // the generation the stream was decoded as
	Declared   uint64     // the declared length, count or magic
	Limit      uint64     // the ceiling it broke (0 where none applies)
	// Policy rules only: the key concerned, with bytes outside printable ASCII escaped (Go's %q
	// escapes, without the quotes) and at most MaxKeyShown of them, and what broke the rule (the
	// global a pickle imports, the rule of the policy file).
	Key    string
	Detail string
}

// MaxKeyShown is how many bytes of a key a policy violation shows.
const MaxKeyShown = 256

// MaxFirstBytes is how many of a violating message's (or a stream's) first bytes are kept as
// evidence: the guard's Decision.First, the audit event's storeguard.first_bytes.
const MaxFirstBytes = 32

// ShowKey is key as a Violation shows it: printable ASCII, escapes for the rest, at most
// MaxKeyShown bytes of the key (then "...").
func ShowKey(key []byte) string {
	cut := len(key) > MaxKeyShown
	if cut {
		key = key[:MaxKeyShown]
	}
	q := strconv.QuoteToASCII(string(key))
	q = q[1 : len(q)-1]
	if cut {
		q += "..."
	}
	return q
}

func (v *Violation) Error() string {
	s := fmt.Sprintf("%s at offset %d (message %d, opcode 0x%02x %s, %s)", v.Rule, v.Offset, v.Index, v.Wire, v.Op, v.Generation)
	if v.Key != "" || v.Detail != "" {
		return s + fmt.Sprintf(": key %q: %s", v.Key, v.Detail)
	}
	if v.Field != FieldNone {
		s += fmt.Sprintf(": %s declared %d", v.Field, v.Declared)
		if v.Limit != 0 {
			s += fmt.Sprintf(", limit %d", v.Limit)
		}
	}
	return s
}
