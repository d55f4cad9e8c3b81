package policy

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/storeguard/storeguard/protocol"
)

// TestJobStores: each round's store is told once its MASTER_PORT passes, with the round's
// MASTER_ADDR if it came first and who wrote it; a blocked message, a port that is no port and
// keys outside a round tell nothing. A read of a round's MASTER_PORT that no write through the
// guard told is asked about once.
func TestJobStores(t *testing.T) {
	var got []JobStore
	var asked []string
	js := NewJobStores(64, func(j JobStore) { got = append(got, j) })
	js.Asked = func(key []byte, j JobStore) { asked = append(asked, string(key)+" by "+j.Src.String()) }
	p, err := New(Defaults())
	if err != nil {
		t.Fatal(err)
	}
	p = p.WithStore(Store{Written: NewWritten(16), JobStores: js})
	src := netip.MustParseAddr("10.0.0.7")
	send := func(r protocol.Request) bool {
		t.Helper()
		if !p.Wants(r.Op) {
			t.Fatalf("the policy does not want %s", r.Op)
		}
		msg, b := message(t, r)
		_, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}, Src: src, Identity: "spiffe://x/w"}, nil)
		return !broke
	}
	want := func(step string, w ...JobStore) {
		t.Helper()
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("%s: told %+v, want %+v", step, got, w)
		}
		got = nil
	}
	get := func(key string) protocol.Request { return protocol.Request{Op: protocol.OpGet, Key: []byte(key)} }
	told := func(round string, port uint16, addr string) JobStore {
		return JobStore{Round: round, Addr: addr, Port: port, Src: src, Identity: "spiffe://x/w"}
	}

	// torch's order (RendezvousStoreInfo.build): MASTER_ADDR, then MASTER_PORT, one SET each.
	send(setReq("torch.rendezvous.job-7.0/MASTER_ADDR", "10.0.0.7"))
	want("address alone")
	send(setReq("torch.rendezvous.job-7.0/MASTER_PORT", "41234"))
	want("port", told("torch.rendezvous.job-7.0", 41234, "10.0.0.7"))
	// Every agent reads it back: told already, nothing asked.
	send(get("torch.rendezvous.job-7.0/MASTER_PORT"))
	// A rewrite is blocked (write-once): it tells nothing.
	if send(setReq("torch.rendezvous.job-7.0/MASTER_PORT", "4444")) {
		t.Fatal("a second MASTER_PORT passed")
	}
	want("blocked rewrite")
	// A port without its address (written past the guard), with the leading "/" of a store's prefix.
	send(setReq("/torch.rendezvous.job-8.0/MASTER_PORT", "29600"))
	want("port alone", told("torch.rendezvous.job-8.0", 29600, ""))
	// Both in one MULTI_SET, and COMPARE_SET's desired value.
	send(protocol.Request{Op: protocol.OpMultiSet,
		Keys:   [][]byte{[]byte("torch.rendezvous.job-9.0/MASTER_ADDR"), []byte("torch.rendezvous.job-9.0/MASTER_PORT")},
		Values: [][]byte{[]byte("node-a"), []byte("29700")}})
	want("multi-set", told("torch.rendezvous.job-9.0", 29700, "node-a"))
	send(protocol.Request{Op: protocol.OpCompareSet, Key: []byte("torch.rendezvous.job-10.0/MASTER_PORT"),
		Value: []byte(""), Desired: []byte("29800")})
	want("compare-set", told("torch.rendezvous.job-10.0", 29800, ""))
	// Names no store: not a port, a key outside a round's prefix, a deeper key.
	send(setReq("torch.rendezvous.job-11.0/MASTER_PORT", "70000"))
	send(setReq("torch.rendezvous.job-11.1/MASTER_PORT", "0"))
	send(setReq("torch.rendezvous.job-11.2/MASTER_PORT", "port"))
	send(setReq("other/MASTER_PORT", "29900"))
	send(setReq("torch.rendezvous.job-11.3/x/MASTER_PORT", "29900"))
	want("no store")
	if len(asked) != 0 {
		t.Fatalf("asked %q before any read of an untold round", asked)
	}
	// Rank 0 wrote past the guard: the first read of the port is asked about, once; reads of
	// other keys and of the address are not.
	send(get("torch.rendezvous.job-12.0/MASTER_ADDR"))
	send(get("/torch.rendezvous.job-12.0/MASTER_PORT"))
	send(protocol.Request{Op: protocol.OpWait, Keys: [][]byte{[]byte("/torch.rendezvous.job-12.0/MASTER_PORT")}})
	send(protocol.Request{Op: protocol.OpMultiGet, Keys: [][]byte{[]byte("torch.rendezvous.job-13.0/MASTER_PORT"), []byte("k")}})
	send(get("torch.rendezvous.job-14.0/x"))
	if w := []string{"/torch.rendezvous.job-12.0/MASTER_PORT by 10.0.0.7", "torch.rendezvous.job-13.0/MASTER_PORT by 10.0.0.7"}; !reflect.DeepEqual(asked, w) {
		t.Fatalf("asked %q, want %q", asked, w)
	}
	if k := AddrKey([]byte("/torch.rendezvous.job-12.0/MASTER_PORT")); string(k) != "/torch.rendezvous.job-12.0/MASTER_ADDR" {
		t.Fatalf("AddrKey = %q", k)
	}
	// Who asked tells once (Told); a round a write told is told already.
	if js.Told("torch.rendezvous.job-12.0") || !js.Told("torch.rendezvous.job-12.0") || !js.Told("torch.rendezvous.job-9.0") {
		t.Fatal("Told")
	}
	// Two rounds remembered: the oldest address is forgotten first.
	js = NewJobStores(2, func(j JobStore) { got = append(got, j) })
	p = p.WithStore(Store{Written: NewWritten(16), JobStores: js})
	for _, r := range []string{"a", "b", "c"} {
		send(setReq("torch.rendezvous."+r+".0/MASTER_ADDR", "host-"+r))
	}
	send(setReq("torch.rendezvous.a.0/MASTER_PORT", "1"))
	send(setReq("torch.rendezvous.c.0/MASTER_PORT", "3"))
	want("bounded", told("torch.rendezvous.a.0", 1, ""), told("torch.rendezvous.c.0", 3, "host-c"))
}
