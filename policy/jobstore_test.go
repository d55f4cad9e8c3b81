package policy

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/storeguard/storeguard/protocol"
)

// TestJobStores: each round's store is told once its MASTER_PORT passes, with the round's
// MASTER_ADDR if it came first; a blocked message, a port that is no port and keys outside a
// round tell nothing.
func TestJobStores(t *testing.T) {
	var got []JobStore
	var from []netip.Addr
	js := NewJobStores(2, func(j JobStore, m Message) { got, from = append(got, j), append(from, m.Src) })
	p, err := New(Defaults())
	if err != nil {
		t.Fatal(err)
	}
	p = p.WithStore(Store{Written: NewWritten(16), JobStores: js})
	src := netip.MustParseAddr("10.0.0.7")
	send := func(r protocol.Request) bool {
		t.Helper()
		msg, b := message(t, r)
		_, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}, Src: src}, nil)
		return !broke
	}
	want := func(step string, w ...JobStore) {
		t.Helper()
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("%s: told %+v, want %+v", step, got, w)
		}
		got = nil
	}

	// torch's order (RendezvousStoreInfo.build): MASTER_ADDR, then MASTER_PORT, one SET each.
	send(setReq("torch.rendezvous.job-7.0/MASTER_ADDR", "10.0.0.7"))
	want("address alone")
	send(setReq("torch.rendezvous.job-7.0/MASTER_PORT", "41234"))
	want("port", JobStore{Round: "torch.rendezvous.job-7.0", Addr: "10.0.0.7", Port: 41234})
	if len(from) != 1 || from[0] != src {
		t.Fatalf("told with the message of %v", from)
	}
	// A rewrite is blocked (write-once): it tells nothing.
	if send(setReq("torch.rendezvous.job-7.0/MASTER_PORT", "4444")) {
		t.Fatal("a second MASTER_PORT passed")
	}
	want("blocked rewrite")
	// A port without its address (written past the guard), with the leading "/" of a store's prefix.
	send(setReq("/torch.rendezvous.job-8.0/MASTER_PORT", "29600"))
	want("port alone", JobStore{Round: "torch.rendezvous.job-8.0", Port: 29600})
	// Both in one MULTI_SET, and COMPARE_SET's desired value.
	send(protocol.Request{Op: protocol.OpMultiSet,
		Keys:   [][]byte{[]byte("torch.rendezvous.job-9.0/MASTER_ADDR"), []byte("torch.rendezvous.job-9.0/MASTER_PORT")},
		Values: [][]byte{[]byte("node-a"), []byte("29700")}})
	want("multi-set", JobStore{Round: "torch.rendezvous.job-9.0", Addr: "node-a", Port: 29700})
	send(protocol.Request{Op: protocol.OpCompareSet, Key: []byte("torch.rendezvous.job-10.0/MASTER_PORT"),
		Value: []byte(""), Desired: []byte("29800")})
	want("compare-set", JobStore{Round: "torch.rendezvous.job-10.0", Port: 29800})
	// Names no store: not a port, a key outside a round's prefix, a deeper key, a read.
	send(setReq("torch.rendezvous.job-11.0/MASTER_PORT", "70000"))
	send(setReq("torch.rendezvous.job-11.1/MASTER_PORT", "0"))
	send(setReq("torch.rendezvous.job-11.2/MASTER_PORT", "port"))
	send(setReq("other/MASTER_PORT", "29900"))
	send(setReq("torch.rendezvous.job-11.3/x/MASTER_PORT", "29900"))
	send(protocol.Request{Op: protocol.OpGet, Key: []byte("torch.rendezvous.job-7.0/MASTER_PORT")})
	want("no store")
	// Two rounds remembered: the oldest address is forgotten first.
	for _, r := range []string{"a", "b", "c"} {
		send(setReq("torch.rendezvous."+r+".0/MASTER_ADDR", "host-"+r))
	}
	send(setReq("torch.rendezvous.a.0/MASTER_PORT", "1"))
	send(setReq("torch.rendezvous.c.0/MASTER_PORT", "3"))
	want("bounded", JobStore{Round: "torch.rendezvous.a.0", Port: 1}, JobStore{Round: "torch.rendezvous.c.0", Addr: "host-c", Port: 3})
}
