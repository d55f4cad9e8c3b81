package policy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/storeguard/storeguard/protocol"
)

const (
	workerID   = "spiffe://job.example/ns/train/sa/worker"
	intruderID = "spiffe://job.example/ns/other/sa/x"
)

// TestRuleIdentities: a policy file's rules name identities beside sources; both narrow the rule.
// The NCCL unique id (T4) is readable only by the job's own identities, and an intruder with a
// valid certificate of another workload, or a plaintext client, is denied.
func TestRuleIdentities(t *testing.T) {
	rules, err := ParseFile([]byte(`
rules:
  - name: job-reads-nccl-id
    keys: ["*/nccl_unique_id*"]
    identities: ["spiffe://job.example/ns/train/**"]
    action: allow
  - name: nccl-id-only-for-the-job
    keys: ["*/nccl_unique_id*"]
    action: deny
  - name: no-recon-from-other-hosts
    ops: [list_keys]
    sources: ["10.0.0.0/8"]
    identities: ["dns:*.lab.example"]
    action: deny
`), "ids.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := Defaults()
	c.Rules = rules
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	get := protocol.Request{Op: protocol.OpGet, Key: []byte("/default_pg/0/nccl_unique_id")}
	list := protocol.Request{Op: protocol.OpListKeys}
	for _, tt := range []struct {
		name     string
		req      protocol.Request
		src      string
		identity string
		rule     string // the rule that denies it, "" for none
	}{
		{"the job's identity reads the id", get, "192.0.2.10", workerID, ""},
		{"another workload's identity", get, "192.0.2.10", intruderID, "nccl-id-only-for-the-job"},
		{"a plaintext client", get, "127.0.0.1", "", "nccl-id-only-for-the-job"},
		{"identity and source both match", list, "10.1.2.3", "dns:w1.lab.example", "no-recon-from-other-hosts"},
		{"identity matches, source does not", list, "192.0.2.10", "dns:w1.lab.example", ""},
		{"source matches, identity does not", list, "10.1.2.3", "dns:a.b.lab.example", ""},
		{"source matches, no identity", list, "10.1.2.3", "", ""},
	} {
		msg, b := message(t, tt.req)
		f, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}, Src: netip.MustParseAddr(tt.src), Identity: tt.identity}, nil)
		if broke != (tt.rule != "") || broke && !strings.HasPrefix(f.Detail, "rule "+tt.rule+":") {
			t.Errorf("%s: broke %v (%s %q), want rule %q", tt.name, broke, f.Rule, f.Detail, tt.rule)
		}
	}
}

func TestRuleIdentitiesErrors(t *testing.T) {
	for _, tt := range []struct{ file, want string }{
		{"rules:\n  - {name: r, identities: [worker-1], action: deny}\n",
			`bad.yaml: rules[0] (r): identities: "worker-1": not spiffe://, uri:, dns: or cn: followed by a name`},
		{"rules:\n  - {name: r, identities: [\"spiffe://td/a**\"], action: deny}\n",
			`rules[0] (r): identities: "spiffe://td/a**": ** stands for whole segments`},
		{"rules:\n  - {name: r, keys: [a], identities: [\"dns:x\"], action: write-once}\n",
			`rules[0] (r): ops, sources, identities: a write-once rule applies to every write and delete`},
		{"rules:\n  - {name: r, identities: \"dns:x\", action: deny}\n", "cannot unmarshal"},
	} {
		_, err := ParseFile([]byte(tt.file), "bad.yaml")
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error containing %q", tt.file, err, tt.want)
		}
	}
}
