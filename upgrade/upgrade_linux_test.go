package upgrade

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/storeinfo"
)

// TestWireFieldNames: the S and C packets' JSON keys are those of the builds before this package
// (proxy's serverState and connState), so that an upgrade between them still works.
func TestWireFieldNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
		want []string
	}{
		{"S", ServerState{Fds: []int{3}}, []string{"Conns", "Frozen", "Handovers", "Listen", "MetricsListen", "NextID",
			"PID", "Sources", "Store", "StoreKnown", "Version"}},
		{"C", connPacket{Conn: Conn{ClientFd: 3, Refeed: []byte("x")}}, []string{"Dst", "Flow", "Guard", "HasUp", "Held",
			"ID", "ReadEnded", "Refeed", "Replies", "Src", "Start", "ToClient", "ToStore", "UpDeadline"}},
		{"Store", storeinfo.Info{}, []string{"Backend", "Gen"}},
		{"Flow", Flow{}, []string{"First", "FromClient", "FromStore", "Interim", "Reason", "Replied", "ToStore", "Verdict"}},
	} {
		b, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		var got []string
		for k := range m {
			got = append(got, k)
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s packet keys %v, want %v", tc.name, got, tc.want)
		}
	}
}

// pair is two files from open, closed when the test ends.
func pair(t *testing.T, open func() (*os.File, *os.File, error)) (*os.File, *os.File) {
	a, b, err := open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestHandOver: what Old sends, Next receives: the server's state, each connection's state, its
// sockets and its three byte strings (one longer than a packet), then go.
func TestHandOver(t *testing.T) {
	mine, theirs := pair(t, fdpass.Pair)
	r, w := pair(t, os.Pipe) // descriptors to pass
	big := bytes.Repeat([]byte("b"), 200<<10)
	sent := []Conn{
		{ID: 7, Src: netip.MustParseAddrPort("10.0.0.1:4000"), ReadEnded: true, Held: 42, Flow: Flow{FromClient: 9, First: []byte{1}},
			ClientFd: int(r.Fd()), StoreFd: int(w.Fd()), Refeed: []byte("half a message"), ToStore: big, ToClient: []byte("reply")},
		{ID: 8, ClientFd: int(r.Fd()), StoreFd: -1},
	}
	type taken struct {
		n     *Next
		conns []Conn
		err   error
	}
	done := make(chan taken, 1)
	go func() {
		n, err := Join(theirs)
		if err != nil {
			done <- taken{err: err}
			return
		}
		defer n.Close()
		var got []Conn
		err = n.Receive(func(c Conn) { got = append(got, c) })
		done <- taken{n: n, conns: got, err: err}
	}()
	o, err := WaitReady(mine, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Peer.PID != os.Getpid() {
		t.Errorf("ready from PID %d, want %d", o.Peer.PID, os.Getpid())
	}
	frozen := time.Unix(1700000000, 0).UTC()
	st := ServerState{Listen: "127.0.0.1:1", NextID: 99, Conns: len(sent), Frozen: frozen, Fds: []int{int(r.Fd())}}
	if err := o.Send(st, func(i int) (Conn, error) { return sent[i], nil }, func() { t.Error("thawed") }); err != nil {
		t.Fatal(err)
	}
	if err := o.Go(); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	from := got.n.From
	fdpass.CloseFds(from.Fds)
	if from.NextID != 99 || from.Conns != 2 || !from.Frozen.Equal(frozen) || len(from.Fds) != 1 || from.PID != os.Getpid() {
		t.Errorf("server state %+v", from)
	}
	if len(got.conns) != len(sent) {
		t.Fatalf("took %d connections, want %d", len(got.conns), len(sent))
	}
	for i, c := range got.conns {
		want := sent[i]
		fdpass.CloseFds([]int{c.ClientFd})
		if c.StoreFd >= 0 {
			fdpass.CloseFds([]int{c.StoreFd})
		}
		if c.ID != want.ID || c.Src != want.Src || c.ReadEnded != want.ReadEnded || c.Held != want.Held ||
			c.Flow.FromClient != want.Flow.FromClient || !bytes.Equal(c.Flow.First, want.Flow.First) {
			t.Errorf("connection %d: %+v", want.ID, c)
		}
		if c.ClientFd < 0 || (c.StoreFd >= 0) != (want.StoreFd >= 0) {
			t.Errorf("connection %d: sockets %d, %d", want.ID, c.ClientFd, c.StoreFd)
		}
		if !bytes.Equal(c.Refeed, want.Refeed) || !bytes.Equal(c.ToStore, want.ToStore) || !bytes.Equal(c.ToClient, want.ToClient) {
			t.Errorf("connection %d: bytes %d, %d, %d", want.ID, len(c.Refeed), len(c.ToStore), len(c.ToClient))
		}
	}
}

// TestRefused: a new process that refuses (X) fails the old one's Send, which thaws.
func TestRefused(t *testing.T) {
	mine, theirs := pair(t, fdpass.Pair)
	joined := make(chan struct{})
	defer func() { <-joined }()
	go func() {
		defer close(joined)
		if n, err := Join(theirs); err == nil {
			n.Refuse(os.ErrPermission)
			n.Close()
		}
	}()
	o, err := WaitReady(mine, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	thawed := false
	err = o.Send(ServerState{}, nil, func() { thawed = true })
	if err == nil || !MayHaveTaken(err) {
		t.Fatalf("Send: %v, want an error after which the new process is stopped", err)
	}
	Thaw(err)
	if !thawed {
		t.Error("Thaw did not thaw")
	}
}

// TestLegacyTLSBytes: a sender from before relay ledgers follows a TLS connection's packet with
// the plaintext and records its relay had not written (TLSToPlain, TLSToTLS); they are read and
// dropped, so the connections after it arrive whole.
func TestLegacyTLSBytes(t *testing.T) {
	mine, theirs := pair(t, fdpass.Pair)
	r, _ := pair(t, os.Pipe)
	done := make(chan []Conn, 1)
	errc := make(chan error, 1)
	go func() {
		n, err := Join(theirs)
		if err != nil {
			errc <- err
			return
		}
		defer n.Close()
		var got []Conn
		err = n.Receive(func(c Conn) { got = append(got, c); fdpass.CloseFds([]int{c.ClientFd}) })
		fdpass.CloseFds(n.From.Fds)
		errc <- err
		done <- got
	}()
	o, err := WaitReady(mine, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if err := o.h.Send('S', ServerState{Listen: "127.0.0.1:1", Conns: 2}, int(r.Fd())); err != nil {
		t.Fatal(err)
	}
	old := connPacket{Conn: Conn{ID: 1, TLS: &TLSConn{Identity: "spiffe://x/old"}}, TLSToPlain: 3, TLSToTLS: 2}
	if err := o.h.Send('C', old, int(r.Fd())); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"abc", "de"} {
		if err := o.h.SendBlob([]byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.sendConn(Conn{ID: 2, ClientFd: int(r.Fd()), StoreFd: -1, ToClient: []byte("reply")}); err != nil {
		t.Fatal(err)
	}
	if err := o.h.Send('E', 2); err != nil {
		t.Fatal(err)
	}
	var taken int
	if _, err := o.h.Expect('A', ackTimeout, &taken); err != nil || taken != 2 {
		t.Fatalf("acknowledged %d: %v", taken, err)
	}
	if err := o.Go(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	got := <-done
	if len(got) != 2 || got[0].ID != 1 || got[0].TLS == nil || got[1].ID != 2 || string(got[1].ToClient) != "reply" {
		t.Fatalf("took %+v", got)
	}
}
