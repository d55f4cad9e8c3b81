package fdpass

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/internal/fdpass/fdtest"
)

// open is a connected pair of Conns; the caller closes them.
func open(t *testing.T) (a, b *Conn) {
	t.Helper()
	mine, theirs, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	defer theirs.Close()
	if a, err = New(mine); err != nil {
		t.Fatal(err)
	}
	if b, err = New(theirs); err != nil {
		a.Close()
		t.Fatal(err)
	}
	return a, b
}

// pair is open's pair, closed when the test ends.
func pair(t *testing.T) (a, b *Conn) {
	a, b = open(t)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestPacketsRoundTripWithTheirDescriptors(t *testing.T) {
	for _, tc := range []struct {
		name string
		fds  int
	}{
		{"no descriptors", 0},
		{"one (an O or U)", 1},
		{"two (a C with its store connection)", 2},
		{"a full keeper batch (M, 200)", 200},
		{"the most one packet carries (SCM_MAX_FD)", 253},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fdtest.NoLeak(t)
			a, b := pair(t)
			pass, peer := fdtest.Sockets(t, tc.fds)
			sent := map[string]int{"fds": tc.fds}
			if err := a.Send('M', sent, fdtest.Fds(pass...)...); err != nil {
				t.Fatal(err)
			}
			kind, body, fds, err := b.Recv(0)
			if err != nil {
				t.Fatal(err)
			}
			defer CloseFds(fds)
			var got map[string]int
			if kind != 'M' || json.Unmarshal(body, &got) != nil || got["fds"] != tc.fds {
				t.Fatalf("received %c %s, want M %v", kind, body, sent)
			}
			if len(fds) != tc.fds {
				t.Fatalf("received %d descriptors, sent %d", len(fds), tc.fds)
			}
			for i, fd := range fds {
				fdtest.Same(t, fd, peer[i])
			}
		})
	}
}

func TestSendRefusesAPacketOverTheLimit(t *testing.T) {
	a, b := pair(t)
	// A JSON string of n-2 letters is n bytes; the kind byte makes the packet one more.
	largest := strings.Repeat("a", maxPacket-1-2)
	if err := a.Send('B', largest); err != nil {
		t.Fatalf("a packet of exactly %d bytes: %v", maxPacket, err)
	}
	kind, body, _, err := b.Recv(0)
	if err != nil || kind != 'B' || len(body) != maxPacket-1 {
		t.Fatalf("received %c of %d bytes, %v; want B of %d", kind, len(body), err, maxPacket-1)
	}
	if err := a.Send('B', largest+"a"); err == nil {
		t.Fatalf("a packet of %d bytes was sent", maxPacket+1)
	}
	// Nothing went: the next packet read is the next one sent.
	if err := a.Send('Z', nil); err != nil {
		t.Fatal(err)
	}
	if kind, _, _, err := b.Recv(0); err != nil || kind != 'Z' {
		t.Fatalf("received %c, %v after the refused packet; want Z", kind, err)
	}
}

// A packet longer than Recv takes is an error, never a shortened packet, and its descriptors are
// closed.
func TestRecvRejectsAPacketLongerThanItTakes(t *testing.T) {
	fdtest.NoLeak(t)
	a, b := pair(t)
	pass, _ := fdtest.Sockets(t, 2)
	if err := a.sendRaw(bytes.Repeat([]byte{'B'}, maxPacket+1), fdtest.Fds(pass...)); err != nil {
		t.Fatal(err)
	}
	kind, body, fds, err := b.Recv(0)
	if err == nil {
		CloseFds(fds)
		t.Fatalf("received %c of %d bytes with %d descriptors, want an error", kind, len(body), len(fds))
	}
	if fds != nil {
		t.Fatalf("%d descriptors returned with the error %v", len(fds), err)
	}
}

func TestAClosedPeer(t *testing.T) {
	fdtest.NoLeak(t)
	a, b := open(t)
	defer b.Close()
	if b.Hungup() {
		t.Fatal("Hungup while the peer is open")
	}
	pass, peer := fdtest.Sockets(t, 1)
	if err := a.Send('O', 7, fdtest.Fds(pass...)...); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if !b.Hungup() {
		t.Fatal("not Hungup after the peer closed")
	}
	// What the peer sent before it closed is read first, whole.
	kind, body, fds, err := b.Recv(0)
	if err != nil || kind != 'O' || string(body) != "7" || len(fds) != 1 {
		t.Fatalf("received %c %s with %d descriptors, %v; want O 7 with 1", kind, body, len(fds), err)
	}
	fdtest.Same(t, fds[0], peer[0])
	CloseFds(fds)
	if _, _, fds, err := b.Recv(0); err == nil || fds != nil {
		t.Fatalf("Recv after the peer closed: %d descriptors, %v; want an error", len(fds), err)
	}
	if err := b.Send('F', nil); err == nil {
		t.Fatal("Send to a closed peer succeeded")
	}
}

func TestRecvWaitsAtMostItsTimeout(t *testing.T) {
	a, b := pair(t)
	start := time.Now()
	if _, _, _, err := b.Recv(10 * time.Millisecond); err == nil {
		t.Fatal("Recv with nothing sent returned no error")
	}
	if waited := time.Since(start); waited < 10*time.Millisecond { // a non-blocking socket: no wait at all
		t.Fatalf("Recv gave up after %s, before its timeout", waited)
	}
	// The timeout is per call: a packet is still read after one.
	if err := a.Send('F', nil); err != nil {
		t.Fatal(err)
	}
	if kind, _, _, err := b.Recv(0); err != nil || kind != 'F' {
		t.Fatalf("received %c, %v; want F", kind, err)
	}
}

func TestSendTimeoutEndsASendThatNobodyReads(t *testing.T) {
	a, _ := pair(t)
	if err := a.SetSendTimeout(10 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	failed := make(chan error, 1)
	go func() {
		chunk := make([]byte, blobPacket)
		for range 1000 { // 60 MB: far more than a socket buffer holds
			if err := a.SendBlob(chunk); err != nil {
				failed <- err
				return
			}
		}
		failed <- nil
	}()
	select {
	case err := <-failed:
		if err == nil {
			t.Fatal("1000 packets sent to a peer that reads nothing")
		}
	case <-time.After(30 * time.Second): // only if the send blocks for good
		t.Fatal("a send to a peer that reads nothing did not end")
	}
}

func TestExpect(t *testing.T) {
	type body struct{ ID int }
	for _, tc := range []struct {
		name    string
		kind    byte
		v       any
		wantErr string // "" when the packet is taken
	}{
		{"the packet expected", 'C', body{ID: 3}, ""},
		{"the other side gave up", 'X', "no room", "gave up: no room"},
		{"another kind", 'E', 3, "expected a C packet, got E"},
		{"a body that is not the type", 'C', "three", "C packet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fdtest.NoLeak(t)
			a, b := pair(t)
			pass, peer := fdtest.Sockets(t, 2)
			if err := a.Send(tc.kind, tc.v, fdtest.Fds(pass...)...); err != nil {
				t.Fatal(err)
			}
			var got body
			fds, err := b.Expect('C', 0, &got)
			defer CloseFds(fds)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || fds != nil {
					t.Fatalf("Expect: %d descriptors, %v; want an error with %q", len(fds), err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.v || len(fds) != 2 {
				t.Fatalf("Expect: %+v with %d descriptors, %v; want %+v with 2", got, len(fds), err, tc.v)
			}
			for i, fd := range fds {
				fdtest.Same(t, fd, peer[i])
			}
		})
	}
}

func TestBlob(t *testing.T) {
	blob := make([]byte, 2*blobPacket+7) // two full packets and a short one
	for i := range blob {
		blob[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		name    string
		send    func(a *Conn) error
		want    int
		wantErr bool
	}{
		{"whole", func(a *Conn) error { return a.SendBlob(blob) }, len(blob), false},
		{"longer than asked", func(a *Conn) error { return a.SendBlob(blob) }, len(blob) - 1, true},
		{"another packet in its place", func(a *Conn) error {
			if err := a.SendBlob(blob[:blobPacket]); err != nil {
				return err
			}
			return a.Send('E', 0)
		}, len(blob), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fdtest.NoLeak(t)
			a, b := pair(t)
			sent := make(chan error, 1)
			go func() { sent <- tc.send(a) }() // more than a socket buffer: sent while read
			got, err := b.ReadBlob(tc.want, 0)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("ReadBlob(%d) read %d bytes, want an error", tc.want, len(got))
				}
			} else if err != nil || !bytes.Equal(got, blob) {
				t.Fatalf("ReadBlob: %d bytes (equal: %v), %v", len(got), bytes.Equal(got, blob), err)
			}
			if err := <-sent; err != nil { // every packet sent was read
				t.Fatal(err)
			}
		})
	}
}

func TestNewWorksOnAfterTheFileCloses(t *testing.T) {
	mine, theirs, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Close()
	a, err := New(mine)
	mine.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := New(theirs)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := a.Send('F', nil); err != nil {
		t.Fatal(err)
	}
	if kind, _, _, err := b.Recv(0); err != nil || kind != 'F' {
		t.Fatalf("received %c, %v; want F", kind, err)
	}
}
