package policy

import (
	"strings"
	"testing"

	"github.com/storeguard/storeguard/protocol"
)

func multiGet(keys ...string) protocol.Request {
	r := protocol.Request{Op: protocol.OpMultiGet}
	for _, k := range keys {
		r.Keys = append(r.Keys, []byte(k))
	}
	return r
}

// TestReplyTooLarge: a MULTI_GET naming a key twice is refused (reply_too_large) before it reaches
// the store; torch's own, each key once, passes; so do values the account knows up to the bound,
// and more is refused.
func TestReplyTooLarge(t *testing.T) {
	c := Defaults()
	c.MaxReplyBytes = 1 << 20
	c.Quota = QuotaLimits{Mode: Enforce, SourceBytes: 1 << 30, TotalBytes: 1 << 30, SourceKeys: 1 << 20, TotalKeys: 1 << 20}
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	p = p.WithStore(Store{Written: NewWritten(64), Quota: NewQuota(), Appends: NewAppends(64)})
	for _, k := range []string{"/big/0", "/big/1"} {
		if f, broke := checkOn(t, p, 1, setReq(k, strings.Repeat("x", 600<<10))); broke {
			t.Fatalf("SET %s: %q", k, f.Detail)
		}
	}
	role := "/torch.rendezvous.j.0/torchelastic/role_info/"
	for _, tc := range []struct {
		name   string
		req    protocol.Request
		detail string
	}{
		{"torchrun's role_info read", multiGet(role+"0", role+"1", role+"2"), ""},
		{"one known value", multiGet("/big/0", "/absent"), ""},
		{"a key named twice", multiGet("/k", "/j", "/k"), "names a key twice"},
		{"one key 131,072 times", multiGet(strings.Split(strings.Repeat("/big/0,", 1<<17), ",")[:1<<17]...), "names a key twice"},
		{"a WAIT naming a key twice", protocol.Request{Op: protocol.OpWait, Keys: [][]byte{[]byte("/k"), []byte("/k")}}, "wait names a key twice"},
		{"torch's WAIT of its keys", protocol.Request{Op: protocol.OpWait, Keys: [][]byte{[]byte(role + "0"), []byte(role + "1")}}, ""},
		{"known values past the bound", multiGet("/big/0", "/big/1"), "more than limits.max-message-bytes 1048576"},
	} {
		f, broke := checkOn(t, p, 2, tc.req)
		if tc.detail == "" && broke || tc.detail != "" && (!broke || f.Rule != protocol.RuleReplyTooLarge || !strings.Contains(f.Detail, tc.detail)) {
			t.Errorf("%s: %v %s %q, want %q", tc.name, broke, f.Rule, f.Detail, tc.detail)
		}
	}
}
