package policy

import (
	"fmt"
	"hash/maphash"

	"github.com/storeguard/storeguard/protocol"
)

// A read asks the store for a reply it builds whole before it sends a byte: a MULTI_GET's is every
// value it names, once per time it names it. One MULTI_GET naming one stored 8 MiB key 131,072
// times (a 1.44 MB request, within limits.max-keys) asks a libuv store for 1 TiB: the store grew by
// a gigabyte and every other client waited seconds (issue #41). Torch names each key once
// (torchrun's agents MULTI_GET the round's role_info keys, one each; interop/results/policy-facts.md).
// So a MULTI_GET that names a key twice, or whose values as the store quota's account knows them
// add up to more than MaxReplyBytes, is refused before it reaches the store (reply_too_large). So is
// a WAIT or CHECK that names a key twice: torch's client sends a MULTI_GET's keys as a WAIT first,
// and a libuv store took 1.3 s (2.4.1) to take in that WAIT of one key 131,072 times, while every
// other client waited; torch names each key once there too.

// replySeed hashes a MULTI_GET's keys to find one named twice, when there is no quota account.
var replySeed = maphash.MakeSeed()

// replyCheck is what checkReply keeps of one message.
type replyCheck struct {
	keys  int                 // keys seen
	first uint64              // the first key's hash: a message of one key allocates nothing
	seen  map[uint64]struct{} // from the second key on
	bytes int64               // the values the account knows, added up
}

func (p *Policy) checkReply(v *fieldView, rc *replyCheck) (Finding, bool) {
	if p.cfg.ReplySize == Off || v.key == nil {
		return Finding{}, false
	}
	switch v.op {
	case protocol.OpMultiGet, protocol.OpWait, protocol.OpCheck:
	default:
		return Finding{}, false
	}
	fail := func(detail string) (Finding, bool) {
		return Finding{Rule: protocol.RuleReplyTooLarge, Field: v.keyField, Key: protocol.ShowKey(v.key), Detail: detail,
			Mode: p.cfg.ReplySize}, true
	}
	seed := replySeed
	if p.quota != nil {
		seed = p.quota.seed
	}
	h := maphash.Bytes(seed, v.key)
	rc.keys++
	switch {
	case rc.keys == 1:
		rc.first = h
	case rc.keys == 2:
		rc.seen = map[uint64]struct{}{rc.first: {}}
		fallthrough
	default:
		if _, twice := rc.seen[h]; twice {
			return fail(v.op.String() + " names a key twice: the store does the work once for each")
		}
		rc.seen[h] = struct{}{}
	}
	if p.quota != nil && p.cfg.MaxReplyBytes > 0 && v.op == protocol.OpMultiGet {
		rc.bytes += p.quota.valueBytes(h)
		if rc.bytes > p.cfg.MaxReplyBytes {
			return fail(fmt.Sprintf("multi_get of values the store holds %d bytes of at least, more than limits.max-message-bytes %d",
				rc.bytes, p.cfg.MaxReplyBytes))
		}
	}
	return Finding{}, false
}

// valueBytes is the length of the value the account knows key hash h to hold, 0 if none.
func (q *Quota) valueBytes(h uint64) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	k, ok := q.keys[h]
	if !ok || k.queue {
		return 0
	}
	return max(k.bytes-k.base, 0)
}
