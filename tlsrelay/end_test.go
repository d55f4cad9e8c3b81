package tlsrelay

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/storeguard/storeguard/tlsrec"
)

// echoer echoes what an End reads back through it, as the proxy does with a connection's
// requests and replies: it parks when a deadline in the past stops it (a freeze), and goes on,
// or gives up what it had not written whole, as the test says.
type echoer struct {
	e      *End
	parked chan []byte // at each park: what Write was given and had not written whole
	goOn   chan bool   // true: thawed; false: handed over (return)
	done   chan error
	held   []byte // to write first: what a previous End had been given and had not written whole
}

func (x *echoer) run() {
	held := x.held
	park := func() bool {
		x.parked <- held
		return <-x.goOn
	}
	for {
		for len(held) > 0 {
			n, err := x.e.Write(held)
			held = held[n:]
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if !park() {
					return
				}
				continue
			}
			if err != nil {
				x.done <- err
				return
			}
		}
		p, err := x.e.Next()
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if !park() {
				return
			}
		case errors.Is(err, io.EOF):
			x.done <- x.e.CloseWrite()
			return
		case err != nil:
			x.done <- err
			return
		}
		held = append(held[:0], p...)
	}
}

// TestEndEchoesThroughFreezesAndHandover: a crypto/tls client streams 8 MiB through an End that
// echoes it back, and reads only at the end, so both directions back up and writes stop part
// way through records. The End is frozen by its deadlines and thawed twice (the second time
// after a hand-over that failed: Handover, then Thaw), then handed over as a Relay (Handover,
// Resume), or made an End again from what it handed over (EndFrom), with what it had not
// written: the echo comes back byte for byte.
func TestEndEchoesThroughFreezesAndHandover(t *testing.T) {
	t.Run("as a relay", func(t *testing.T) { endEchoes(t, false) })
	t.Run("as an End again", func(t *testing.T) { endEchoes(t, true) })
}

func endEchoes(t *testing.T, again bool) {
	client, tlsSide, e := newEnd(t)
	x := &echoer{e: e, parked: make(chan []byte), goOn: make(chan bool), done: make(chan error, 1)}
	go x.run()

	want := streamFrom(client)
	freeze := func() []byte {
		time.Sleep(30 * time.Millisecond)
		e.SetDeadline(time.Unix(1, 0))
		select {
		case held := <-x.parked:
			return held
		case err := <-x.done:
			t.Fatalf("the echo ended before the freeze: %v", err)
		case <-time.After(5 * time.Second):
			t.Fatal("the End did not stop at its deadline")
		}
		return nil
	}
	underWay := false
	for i := range 2 {
		freeze()
		underWay = underWay || e.wrec != nil
		if i == 1 { // a hand-over that fails: the End goes on as it was
			_, r, g, err := e.Handover(7)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.Next(); !errors.Is(err, errHanded) {
				t.Fatalf("an End handed over read: %v", err)
			}
			r.Close()
			g.Close()
			e.Thaw()
		}
		e.SetDeadline(time.Time{})
		x.goOn <- true
	}
	held := append([]byte(nil), freeze()...)
	underWay = underWay || e.wrec != nil
	if !underWay {
		t.Log("no freeze stopped a record part way")
	}
	st, relaySide, guardSide, err := e.Handover(7)
	if err != nil {
		t.Fatal(err)
	}
	x.goOn <- false
	tlsSide.SetDeadline(time.Time{})
	if again {
		e2, toStore, toClient, err := EndFrom(sockFd(t, tlsSide), st, sockFd(t, relaySide), sockFd(t, guardSide), held)
		if err != nil || len(toStore) != 0 || !bytes.Equal(toClient, held) {
			t.Fatalf("EndFrom: %v; %d bytes for the store, %d of %d for the client", err, len(toStore), len(toClient), len(held))
		}
		relaySide.Close()
		guardSide.Close()
		e2.Attach(tlsSide)
		x2 := &echoer{e: e2, held: toClient, done: make(chan error, 1)}
		go x2.run()
		awaitEcho(t, client, want, x2.done)
		return
	}
	r, err := Resume(tlsSide, relaySide, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	r.OnEnd = func(err error) { ended <- err }
	r.Run()
	go func() { // the next owner's guard: first what the End had been given to write, then the echo
		guardSide.Write(held)
		io.Copy(guardSide, guardSide)
		guardSide.CloseWrite()
	}()
	awaitEcho(t, client, want, ended)
}

// TestEndAnswersKeyUpdate: a KeyUpdate the peer asks for is answered before the End's next
// record (the peer opens that record only under the new keys), and the End reads on under the
// peer's new keys. Between records, waiting, it holds no buffer.
func TestEndAnswersKeyUpdate(t *testing.T) {
	srvCfg, cliCfg := configs(t)
	remote, tlsSide := tcpPair(t)
	sc := make(chan *tlsrec.Session, 1)
	go func() {
		s, _, err := tlsrec.Server(tlsSide, srvCfg, time.Now().Add(5*time.Second))
		if err != nil {
			t.Error(err)
		}
		sc <- s
	}()
	cs, _, err := tlsrec.Client(remote, cliCfg, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s := <-sc
	if s == nil {
		t.FailNow()
	}
	e, err := NewEnd(tlsSide, s)
	if err != nil {
		t.Fatal(err)
	}
	remote.SetDeadline(time.Now().Add(10 * time.Second))
	c := &tlsrec.Conn{Conn: remote, S: cs}
	buf := make([]byte, tlsrec.MaxPlaintext)
	for i, msg := range []string{"before", "after"} {
		if i == 1 {
			if _, err := remote.Write(cs.RequestUpdate(nil)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		p, err := e.Next()
		if err != nil || string(p) != msg {
			t.Fatalf("the End read %q, %v", p, err)
		}
		if _, err := e.Write(append([]byte("re: "), p...)); err != nil {
			t.Fatal(err)
		}
		n, err := io.ReadAtLeast(c, buf, len(msg)+4)
		if err != nil || string(buf[:n]) != "re: "+msg {
			t.Fatalf("the client read %q, %v", buf[:n], err)
		}
	}
	if e.asked.Load() != 1 || e.answered != 1 || e.out.Seq() != 1 {
		t.Fatalf("asked %d, answered %d, next sequence number %d", e.asked.Load(), e.answered, e.out.Seq())
	}
	e.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := e.Next(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an idle End's read: %v", err)
	}
	if e.rbuf != nil || e.wbuf != nil {
		t.Fatalf("an idle End holds buffers: read %d bytes, seal %d", cap(e.rbuf), cap(e.wbuf))
	}
	e.SetReadDeadline(time.Time{})
	c.Close()
	if _, err := e.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the client's close: %v", err)
	}
}

// sockFd is s's descriptor, valid while s is open.
func sockFd(t *testing.T, s Sock) int {
	t.Helper()
	rc, err := s.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// newEnd is an End of a handshake finished with a crypto/tls client, on tlsSide.
func newEnd(t *testing.T) (client *tls.Conn, tlsSide Sock, e *End) {
	t.Helper()
	srvCfg, cliCfg := configs(t)
	remote, tlsSock := tcpPair(t)
	client, s := handshake(t, remote, tlsSock, srvCfg, cliCfg)
	e, err := NewEnd(tlsSock, s)
	if err != nil {
		t.Fatal(err)
	}
	return client, tlsSock, e
}
