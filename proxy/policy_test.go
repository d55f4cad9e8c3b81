package proxy

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/internal/storesim"
	"github.com/storeguard/storeguard/protocol"
)

// evilPickle is an object whose __reduce__ is (os.system, ("touch /tmp/x",)), pickle protocol 4.
const evilPickle = "80049527000000000000008c05706f736978948c0673797374656d9493948c0c746f756368202f746d702f7894859452942e"

// TestPolicyBlocksWellFormedAttacks: the default rules close a client whose valid message writes a
// pickle that runs code, or a forged rendezvous state, with nothing of that message reaching the
// store, whether it arrives in one write or byte by byte (held across reads, on either transport).
func TestPolicyBlocksWellFormedAttacks(t *testing.T) { run(t, testPolicyBlocksWellFormedAttacks) }

func testPolicyBlocksWellFormedAttacks(t *testing.T, m mode) {
	evil := unhex(t, evilPickle)
	hs := protocol.AppendHandshake(nil, protocol.G3, 1)
	valid := append(append([]byte{}, hs...), enc(t, protocol.G3, protocol.Request{Op: protocol.OpSet, Key: []byte("/a"), Value: []byte("b")})...)
	for _, tc := range []struct {
		name   string
		req    protocol.Request
		rule   protocol.Rule
		detail string
	}{
		{"raw pickle on any key", protocol.Request{Op: protocol.OpSet, Key: []byte("/vllm/x"), Value: evil},
			protocol.RulePickleGlobalDenied, "pickle imports posix.system"},
		{"base64 pickle as the rendezvous state, by COMPARE_SET", protocol.Request{Op: protocol.OpCompareSet,
			Key: []byte("/torch.rendezvous.r1"), Value: []byte("Y2FuaW1hZGFt"), Desired: []byte(base64.StdEncoding.EncodeToString(evil))},
			protocol.RuleRendezvousStateInvalid, "posix.system"},
	} {
		for _, pieces := range []int{1, 7} {
			t.Run(fmt.Sprintf("%s/pieces of %d", tc.name, pieces), func(t *testing.T) {
				h := start(t, m, func(c *config.Config) { c.Generation = "2.6" })
				c := h.dial()
				c.Write(valid)
				eventually(t, "the valid messages", func() bool { return bytes.Equal(h.store.Received(0), valid) })
				bad := enc(t, protocol.G3, tc.req)
				for i := 0; i < len(bad); i += pieces {
					c.Write(bad[i:min(i+pieces, len(bad))])
					if pieces > 1 {
						time.Sleep(time.Millisecond)
					}
				}
				closedByPeer(t, c)
				if got := h.store.Received(0); !bytes.Equal(got, valid) {
					t.Fatalf("store received %d bytes, want exactly the %d valid ones", len(got), len(valid))
				}
				var ev map[string]any
				eventually(t, "the audit event", func() bool {
					for _, e := range h.audit.events(t) {
						if e["event.action"] == "blocked" {
							ev = e
						}
					}
					return ev != nil
				})
				if ev["event.reason"] != string(tc.rule) || ev["storeguard.key"] != string(tc.req.Key) ||
					!strings.Contains(ev["storeguard.detail"].(string), tc.detail) || ev["storeguard.probe"] != nil {
					t.Errorf("audit event %v", ev)
				}
				if v := h.metric(`storeguard_violations_total{mode="enforce",rule="` + string(tc.rule) + `"}`); v != "1" {
					t.Errorf("violations metric %q", v)
				}
			})
		}
	}
}

// TestNewReadsThePolicyFileOnce: the server runs on the policy file as the configuration was
// validated (config.Parse), not as it is when New runs: New reads and parses nothing again. A file
// broken in between neither stops the start nor loosens the rule.
func TestNewReadsThePolicyFileOnce(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte("rules:\n  - name: no-listing\n    ops: [get_num_keys]\n    action: deny\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	store := recorder(t, reservedAddr(t))
	cfg := testConfig(goroutineMode, store.Addr())
	cfg.Generation, cfg.Policy.File = "2.6", file
	p := parsed(t, cfg)
	if err := os.WriteFile(file, []byte("rules: [not a rule\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := startParsed(t, p, Options{})
	h.store = store
	hs := protocol.AppendHandshake(nil, protocol.G3, 1)
	c := h.dial()
	c.Write(append(append([]byte{}, hs...), enc(t, protocol.G3, protocol.Request{Op: protocol.OpGetNumKeys})...))
	closedByPeer(t, c)
	if got := h.store.Received(0); !bytes.Equal(got, hs) {
		t.Fatalf("store received % x, want only the handshake", got)
	}
}

// TestPolicyMonitorRuleForwardsAndGoesOn: a policy file rule in monitor mode records would_block,
// forwards the message and keeps judging the connection, which a later enforced rule then closes.
func TestPolicyMonitorRuleForwardsAndGoesOn(t *testing.T) {
	run(t, testPolicyMonitorRuleForwardsAndGoesOn)
}

func testPolicyMonitorRuleForwardsAndGoesOn(t *testing.T, m mode) {
	file := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(file, []byte(`rules:
  - name: no-listing
    ops: [get_num_keys]
    action: deny
    mode: monitor
  - name: json-config
    keys: ["cfg/*"]
    action: value
    value: {kind: json}
`), 0o600)
	h := start(t, m, func(c *config.Config) { c.Generation = "2.6"; c.Policy.File = file })
	c := h.dial()
	first := append(protocol.AppendHandshake(nil, protocol.G3, 1), enc(t, protocol.G3,
		protocol.Request{Op: protocol.OpGetNumKeys},
		protocol.Request{Op: protocol.OpSet, Key: []byte("/cfg/a"), Value: []byte(`{"lr": 0.1}`)})...)
	c.Write(first)
	eventually(t, "the monitored and the valid message", func() bool { return bytes.Equal(h.store.Received(0), first) })
	c.Write(enc(t, protocol.G3, protocol.Request{Op: protocol.OpSet, Key: []byte("/cfg/b"), Value: []byte(`{"lr": `)}))
	closedByPeer(t, c)
	if got := h.store.Received(0); !bytes.Equal(got, first) {
		t.Fatalf("store received %d bytes, want %d", len(got), len(first))
	}
	eventually(t, "two events", func() bool { return len(h.audit.events(t)) >= 2 })
	evs := h.audit.events(t)
	if evs[0]["event.action"] != "would_block" || evs[0]["event.reason"] != "policy_denied" ||
		evs[1]["event.action"] != "blocked" || evs[1]["event.reason"] != "value_invalid" || evs[1]["storeguard.key"] != "/cfg/b" {
		t.Fatalf("events %v", evs)
	}
	if v := h.metric(`storeguard_bans_total`); v != "0" {
		t.Errorf("bans %q", v)
	}
}

// TestWriteOnceKeys: a key torch writes once a round is refused a second write, whether the first
// came through the guard or past it, straight to the store (the master host's own ranks in a
// transparent sidecar): the guard asks the store.
func TestWriteOnceKeys(t *testing.T) { run(t, testWriteOnceKeys) }

func testWriteOnceKeys(t *testing.T, m mode) {
	h, store := startSim(t, m, nil)
	hs := protocol.AppendHandshake(nil, protocol.G3, 1)
	set := func(key, value string) []byte {
		return append(append([]byte{}, hs...), enc(t, protocol.G3, protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte(value)})...)
	}
	const addr, port = "/torch.rendezvous.r.0/MASTER_ADDR", "/torch.rendezvous.r.0/MASTER_PORT"
	pong := func(c net.Conn) { // the handshake's PING reply
		t.Helper()
		var b [4]byte
		c.SetReadDeadline(time.Now().Add(patience))
		if _, err := io.ReadFull(c, b[:]); err != nil {
			t.Fatalf("PING reply: %v", err)
		}
	}
	store.Set("/torch.rendezvous.r", []byte("state")) // the run's agents joined past the guard
	// Rank 0 through the guard, then an intruder.
	c := h.dial()
	c.Write(set(addr, "10.0.0.1"))
	pong(c)
	eventually(t, "the first write stored", func() bool { return store.NumKeys() == 2 })
	intruder := h.dial()
	intruder.Write(set(addr, "6.6.6.6"))
	closedAfterReplies(t, intruder)
	// Rank 0 past the guard, then an intruder through it.
	direct, err := net.Dial("tcp", store.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	direct.Write(set(port, "29500"))
	pong(direct)
	eventually(t, "the direct write stored", func() bool { return store.NumKeys() == 3 })
	intruder = h.dial()
	intruder.Write(set(port, "1"))
	closedAfterReplies(t, intruder)
	// A delete of a write-once key that was never written is nothing to refuse.
	c.Write(enc(t, protocol.G3, protocol.Request{Op: protocol.OpDeleteKey, Key: []byte("/torch.rendezvous.r.1/MASTER_ADDR")}))
	var reply [8]byte
	c.SetReadDeadline(time.Now().Add(patience))
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		t.Fatalf("DELETE_KEY of an unwritten key: %v; flows %v", err, h.audit.flows(t))
	}
	var details []string
	eventually(t, "two events", func() bool {
		details = details[:0]
		for _, e := range h.audit.events(t) {
			if e["event.reason"] == string(protocol.RuleKeyWriteOnce) {
				details = append(details, e["storeguard.key"].(string)+": "+e["storeguard.detail"].(string))
			}
		}
		return len(details) == 2
	})
	if !strings.Contains(details[0], addr+": set of a key written once, already written through the guard") ||
		!strings.Contains(details[1], port+": set of a key written once, already in the store") {
		t.Fatalf("events %q", details)
	}
	// Both second writes asked the store: the key written through the guard is refused only while
	// the store still has it (a restarted store would not). Each of the four writes (the delete
	// too) asked for the run's state: no agent joined through the guard.
	if v := h.metric(`storeguard_policy_key_lookups_total{result="exists"}`); v != "6" {
		t.Errorf("lookups that found the key: %q", v)
	}
}

// startSim starts a server forwarding in mode m, configured for 2.6 (and by mutate), in front of a
// simulated 2.6 libuv store, which answers.
func startSim(t *testing.T, m mode, mutate func(*config.Config)) (*harness, *storesim.Store) {
	t.Helper()
	store, err := storesim.Start("127.0.0.1:0", protocol.G3, protocol.BackendLibuv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	return startOn(t, m, store.Addr(), func(c *config.Config) {
		c.Generation = "2.6"
		if mutate != nil {
			mutate(c)
		}
	}), store
}

// closedAfterReplies waits for the proxy to close c, which may first pass on the replies to the
// messages before the one it refused.
func closedAfterReplies(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(patience))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("connection not closed: %v", err)
	}
}

// TestUnguardedJobStore: a rendezvous round whose MASTER_PORT is neither the guard's nor its
// store's (torchrun's c10d rendezvous: the ranks' own store on a free port) is counted once, and
// forwarded like any write; one on the guarded store's port is not counted, nor a rewrite that
// write-once refused.
func TestUnguardedJobStore(t *testing.T) { run(t, testUnguardedJobStore) }

func testUnguardedJobStore(t *testing.T, m mode) {
	h, store := startSim(t, m, nil)
	_, storePort, _ := net.SplitHostPort(store.Addr())
	set := func(key, value string) []byte {
		return enc(t, protocol.G3, protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte(value)})
	}
	store.Set("torch.rendezvous.job", []byte("state")) // the runs' agents joined past the guard
	store.Set("torch.rendezvous.job2", []byte("state"))
	c := h.dial()
	c.Write(protocol.AppendHandshake(nil, protocol.G3, 1))
	c.Write(set("torch.rendezvous.job.0/MASTER_ADDR", "10.0.0.7"))
	c.Write(set("torch.rendezvous.job.0/MASTER_PORT", "41234"))
	c.Write(set("torch.rendezvous.job2.0/MASTER_PORT", storePort))
	eventually(t, "the three writes stored", func() bool { return store.NumKeys() == 5 })
	if v := h.metric("storeguard_unguarded_job_stores_total"); v != "1" {
		t.Fatalf("unguarded job stores %q, want 1", v)
	}
	intruder := h.dial()
	intruder.Write(append(protocol.AppendHandshake(nil, protocol.G3, 1), set("torch.rendezvous.job.0/MASTER_PORT", "4444")...))
	closedAfterReplies(t, intruder)
	if v := h.metric("storeguard_unguarded_job_stores_total"); v != "1" {
		t.Fatalf("unguarded job stores %q after a refused rewrite, want 1", v)
	}

	// Rank 0 past the guard (a transparent sidecar's own host), an agent reading through it: the
	// guard asks the store. The read may come first: asked again until the write.
	get := func(key string) []byte {
		return enc(t, protocol.G3, protocol.Request{Op: protocol.OpGet, Key: []byte(key)})
	}
	c.Write(get("torch.rendezvous.job.0/MASTER_PORT")) // told by the write above: nothing to ask
	c.Write(enc(t, protocol.G3, protocol.Request{Op: protocol.OpCheck, Keys: [][]byte{[]byte("/torch.rendezvous.job3.0/MASTER_PORT")}}))
	time.Sleep(700 * time.Millisecond)
	if v := h.metric("storeguard_unguarded_job_stores_total"); v != "1" {
		t.Fatalf("unguarded job stores %q before rank 0 wrote the round, want 1", v)
	}
	store.Set("/torch.rendezvous.job3.0/MASTER_ADDR", []byte("10.0.0.9"))
	store.Set("/torch.rendezvous.job3.0/MASTER_PORT", []byte("45678"))
	eventually(t, "the store asked about the round read through the guard", func() bool {
		return h.metric("storeguard_unguarded_job_stores_total") == "2"
	})
	c.Write(get("/torch.rendezvous.job3.0/MASTER_PORT")) // asked once per round
	time.Sleep(700 * time.Millisecond)
	if v := h.metric("storeguard_unguarded_job_stores_total"); v != "2" {
		t.Fatalf("unguarded job stores %q after a second read of the round, want 2", v)
	}
}
