package storesim

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// A recorder keeps each connection's bytes apart, in accept order, answers every read with the
// reply of the moment, reports a connection's bytes on Ended when it ends, and forgets ended
// connections on request.
func TestRecorder(t *testing.T) {
	s, err := StartRecorder("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(5 * time.Second))
		return c
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	a := dial()
	a.Write([]byte("\x00\xffa"))
	wait("a's bytes", func() bool { return bytes.Equal(s.Received(0), []byte("\x00\xffa")) })
	s.SetReply([]byte("ok"))
	b := dial()
	b.Write([]byte("b"))
	got := make([]byte, 2)
	if _, err := io.ReadFull(b, got); err != nil || string(got) != "ok" {
		t.Fatalf("reply %q, %v", got, err)
	}
	if n := s.NumConns(); n != 2 || string(s.Received(1)) != "b" || s.Received(2) != nil {
		t.Fatalf("%d connections, the second sent %q, a third %q", n, s.Received(1), s.Received(2))
	}
	a.(*net.TCPConn).CloseWrite()
	select {
	case e := <-s.Ended:
		if string(e) != "\x00\xffa" {
			t.Errorf("ended with %q", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no end reported")
	}
	if _, err := io.ReadAll(a); err != nil {
		t.Errorf("the recorder did not close the ended connection: %v", err)
	}
	s.Forget()
	if s.Received(0) != nil || string(s.Received(1)) != "b" || s.NumConns() != 2 {
		t.Errorf("after Forget: %q, %q, %d connections", s.Received(0), s.Received(1), s.NumConns())
	}
}

// Settle reports the connections made since the previous Settle, none included, without counting
// its own; Wait returns a connection's bytes once it has ended.
func TestSettleAndWait(t *testing.T) {
	s, err := StartRecorder("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, b := range []string{"a", "bc"} {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(b))
		c.Close()
	}
	if from, to, err := s.Settle(5 * time.Second); err != nil || from != 0 || to != 2 {
		t.Fatalf("Settle = %d, %d, %v; want 0, 2", from, to, err)
	}
	for i, want := range []string{"a", "bc"} {
		if got, err := s.Wait(i, 5*time.Second); err != nil || string(got) != want {
			t.Errorf("Wait(%d) = %q, %v; want %q", i, got, err, want)
		}
	}
	if from, to, err := s.Settle(5 * time.Second); err != nil || from != 2 || to != 2 {
		t.Fatalf("Settle with no new connection = %d, %d, %v; want 2, 2", from, to, err)
	}
	if n := s.NumConns(); n != 2 {
		t.Errorf("%d connections counted, want 2: Settle's own are not", n)
	}
	if _, err := s.Wait(2, 10*time.Millisecond); err == nil {
		t.Error("Wait for a connection that was never made returned")
	}
}

// A message longer than one read (64 KiB) is executed once its end arrives: a SET of a 200 KiB
// value, then GET, reads it back. Before, each new read fed the decoder the earlier reads' bytes
// again, and the store misframed the message (a slice-bounds panic).
func TestMessageAcrossReads(t *testing.T) {
	s, err := Start("127.0.0.1:0", protocol.G6, protocol.BackendLegacy)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	value := bytes.Repeat([]byte("0123456789abcdef"), 200<<10/16)
	msg := protocol.AppendHandshake(nil, protocol.G6, 7)
	for _, r := range []protocol.Request{{Op: protocol.OpSet, Key: []byte("k"), Value: value}, {Op: protocol.OpGet, Key: []byte("k")}} {
		if msg, err = protocol.Append(msg, protocol.G6, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4+8+len(value))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("PING, GET replies: %v", err)
	}
	if !bytes.Equal(got[12:], value) {
		t.Fatalf("GET returned %d bytes, not the value set", len(got)-12)
	}
}
