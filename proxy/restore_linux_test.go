package proxy

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A guard's two sockets as a worker that died left them: client is the rank, store the store; cfd
// and ufd the guard's own ends (accepted from the client, dialed to the store).
type restoreRig struct {
	client, store, guardC, guardU net.Conn
	cfd, ufd                      int
}

func newRestoreRig(t *testing.T) *restoreRig {
	t.Helper()
	pair := func(dial bool) (peer, mine net.Conn) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		d, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		a, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close(); a.Close() })
		if dial {
			return a, d
		}
		return d, a
	}
	r := &restoreRig{}
	r.client, r.guardC = pair(false)
	r.store, r.guardU = pair(true)
	r.cfd, r.ufd = rawFd(t, r.guardC), rawFd(t, r.guardU)
	return r
}

func rawFd(t *testing.T, c net.Conn) int {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// arrive waits until fd has n bytes to read.
func arrive(t *testing.T, fd, n int) {
	t.Helper()
	for end := time.Now().Add(patience); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if q, _ := unix.IoctlGetInt(fd, unix.SIOCINQ); q >= n {
			return
		}
	}
	t.Fatalf("%d bytes did not arrive", n)
}

// pass moves n bytes from one guard socket to the other as a worker does: peeked, written, and
// consumed only when consume.
func pass(t *testing.T, from, to, n int, peek, consume bool) {
	t.Helper()
	arrive(t, from, n)
	buf := make([]byte, n)
	if peek {
		if m, _, err := unix.Recvfrom(from, buf, unix.MSG_PEEK|unix.MSG_DONTWAIT); err != nil || m != n {
			t.Fatalf("peek: %d, %v", m, err)
		}
	}
	if consume {
		if m, err := unix.Read(from, buf); err != nil || m != n {
			t.Fatalf("read: %d, %v", m, err)
		}
	}
	if to >= 0 {
		if m, err := unix.Write(to, buf); err != nil || m != n {
			t.Fatalf("write: %d, %v", m, err)
		}
	}
}

func readAll(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(patience))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReconcileGoesOnFromTheCounts: after a crash between passing bytes on and consuming them,
// in either direction, reconcile consumes exactly those bytes; bytes the worker consumed and did
// not pass on make it close the connection; and a connection the worker left between messages
// goes on untouched.
func TestReconcileGoesOnFromTheCounts(t *testing.T) {
	t.Run("between messages", func(t *testing.T) {
		r := newRestoreRig(t)
		r.client.Write([]byte("req1"))
		pass(t, r.cfd, r.ufd, 4, true, true)
		r.store.Write([]byte("rep1"))
		pass(t, r.ufd, r.cfd, 4, true, true)
		r.client.Write([]byte("next")) // arrived, not read yet: the next worker's
		arrive(t, r.cfd, 4)
		if lost, err := reconcile(r.cfd, r.ufd); lost != "" || err != nil {
			t.Fatalf("lost %q, %v", lost, err)
		}
		if q, _ := unix.IoctlGetInt(r.cfd, unix.SIOCINQ); q != 4 {
			t.Fatalf("%d bytes wait from the client, not the 4 not read yet", q)
		}
	})
	t.Run("request written, not consumed", func(t *testing.T) {
		r := newRestoreRig(t)
		r.client.Write([]byte("req1"))
		pass(t, r.cfd, r.ufd, 4, true, true)
		r.client.Write([]byte("req2!"))
		pass(t, r.cfd, r.ufd, 5, true, false) // died here
		if lost, err := reconcile(r.cfd, r.ufd); lost != "" || err != nil {
			t.Fatalf("lost %q, %v", lost, err)
		}
		r.client.Write([]byte("req3"))
		pass(t, r.cfd, r.ufd, 4, false, true) // the next worker reads on from the next message
		if got := readAll(t, r.store, 13); !bytes.Equal(got, []byte("req1req2!req3")) {
			t.Fatalf("the store got %q", got)
		}
	})
	t.Run("reply written, not consumed", func(t *testing.T) {
		r := newRestoreRig(t)
		r.client.Write([]byte("req1"))
		pass(t, r.cfd, r.ufd, 4, true, true)
		r.store.Write([]byte("rep1"))
		pass(t, r.ufd, r.cfd, 4, true, false) // died here
		if lost, err := reconcile(r.cfd, r.ufd); lost != "" || err != nil {
			t.Fatalf("lost %q, %v", lost, err)
		}
		if q, _ := unix.IoctlGetInt(r.ufd, unix.SIOCINQ); q != 0 {
			t.Fatalf("%d bytes of the reply passed on still wait from the store", q)
		}
		r.store.Write([]byte("rep2"))
		pass(t, r.ufd, r.cfd, 4, false, true)
		if got := readAll(t, r.client, 8); !bytes.Equal(got, []byte("rep1rep2")) {
			t.Fatalf("the client got %q", got)
		}
	})
	t.Run("request consumed, not written", func(t *testing.T) {
		r := newRestoreRig(t)
		r.client.Write([]byte("the start of a m"))
		pass(t, r.cfd, -1, 16, false, true) // held by the worker, which died
		if lost, _ := reconcile(r.cfd, r.ufd); lost != lostRequest {
			t.Fatalf("lost %q, not %q", lost, lostRequest)
		}
	})
	t.Run("reply consumed, not written", func(t *testing.T) {
		r := newRestoreRig(t)
		r.client.Write([]byte("req1"))
		pass(t, r.cfd, r.ufd, 4, true, true)
		r.store.Write([]byte("rep1"))
		pass(t, r.ufd, -1, 4, false, true)
		if lost, _ := reconcile(r.cfd, r.ufd); lost != lostReply {
			t.Fatalf("lost %q, not %q", lost, lostReply)
		}
	})
	t.Run("no store yet", func(t *testing.T) {
		r := newRestoreRig(t)
		if lost, err := reconcile(r.cfd, -1); lost != "" || err != nil {
			t.Fatalf("lost %q, %v", lost, err)
		}
		r.client.Write([]byte("first"))
		pass(t, r.cfd, -1, 5, false, true)
		if lost, _ := reconcile(r.cfd, -1); lost != lostRequest {
			t.Fatalf("lost %q, not %q", lost, lostRequest)
		}
	})
}
