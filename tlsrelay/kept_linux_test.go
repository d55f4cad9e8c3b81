package tlsrelay

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestKeptEndLosesNothingAtAnyStep: a crypto/tls client sends framed messages, each in two or
// three writes (so records split messages), through a kept End to an echoing store, and reads
// the echoes. The End's owner, as the proxy does, forwards whole messages only, settles the
// rest as held, peeks the store's replies and consumes them once written. It is "killed" at
// random at every step of both sides (its goroutines stop where they are and nothing more runs
// of it) and made again from its slot and its two sockets (RestoreEnd), its replies written in
// parts of 700 bytes: every message comes back once, in order, and each step was crashed at.
// It fails when a restart does not skip the plaintext the store already had, or does not finish
// the record under way.
func TestKeptEndLosesNothingAtAnyStep(t *testing.T) {
	writeCap = 700
	defer func() { writeCap = 0 }()
	client, tlsSide, e := newEnd(t)
	ledger := NewLedger(2)
	if err := e.Keep(ledger, 7); err != nil {
		t.Fatal(err)
	}
	storeSide, storePeer, err := LoopbackPair()
	if err != nil {
		t.Fatal(err)
	}
	defer storePeer.Close()
	go io.Copy(storePeer, storePeer) // the store answers each byte with itself, in order

	var sent bytes.Buffer
	for i := 0; i < 1500; i++ {
		n, _ := rand.Int(rand.Reader, big.NewInt(3000))
		m := make([]byte, 4+1+n.Int64())
		binary.BigEndian.PutUint32(m, uint32(len(m)-4))
		rand.Read(m[4:])
		sent.Write(m)
	}
	go func() {
		for p := sent.Bytes(); len(p) > 0; {
			n, _ := rand.Int(rand.Reader, big.NewInt(2500))
			q := p[:min(len(p), 1+int(n.Int64()))]
			client.Write(q)
			p = p[len(q):]
		}
	}()
	echoed := make(chan []byte)
	go func() {
		got := make([]byte, sent.Len())
		_, err := io.ReadFull(client, got)
		if err != nil {
			t.Error(err)
		}
		echoed <- got
	}()

	var armed atomic.Bool
	crashes := map[string]int{}
	var cmu sync.Mutex
	crashPoint = func(at string) {
		if !armed.Load() {
			return
		}
		cmu.Lock()
		odds := int64(60)
		if crashes[at] < 4 { // the rarer steps get their crashes too
			odds = 6
		}
		n, _ := rand.Int(rand.Reader, big.NewInt(odds))
		if n.Int64() == 0 {
			crashes[at]++
		}
		cmu.Unlock()
		if n.Int64() == 0 {
			panic(errKilled)
		}
	}
	defer func() { crashPoint = func(string) {} }()

	tlsSock, store := Sock(tlsSide), Sock(storeSide)
	for round := 0; ; round++ {
		armed.Store(round < 400)
		done := make(chan error, 2)
		go func() { done <- owner(func() error { return forward(e, store) }) }()
		go func() { done <- owner(func() error { return reply(e, store) }) }()
		var got []byte
		select {
		case err = <-done:
		case got = <-echoed:
		}
		if got != nil {
			tlsSock.SetDeadline(time.Unix(1, 0))
			store.SetDeadline(time.Unix(1, 0))
			if !bytes.Equal(got, sent.Bytes()) {
				t.Fatalf("the echo came back different after %d restarts", round)
			}
			break
		}
		if !errors.Is(err, errKilled) {
			t.Fatalf("round %d: %v", round, err)
		}
		armed.Store(false)
		tlsSock.SetDeadline(time.Unix(1, 0)) // the other goroutine stops where it is too
		store.SetDeadline(time.Unix(1, 0))
		<-done
		// A new process: the slot is free in its ledger, and the sockets are its own copies.
		ix := e.Slot()
		ledger.free(ix)
		tfd, sfd := dupFd(t, tlsSock), dupFd(t, store)
		tlsSock.Close() // the socket lives on in tfd
		store.Close()
		if e, err = RestoreEnd(ledger, ix, 7, tfd, sfd); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		tlsSock, store = fdSock(t, tfd), fdSock(t, sfd)
		e.Attach(tlsSock)
	}
	for _, at := range []string{"kept-read", "kept-settled", "kept-intent", "kept-written", "end-wrote-part",
		"forwarded", "replied"} {
		if crashes[at] == 0 {
			t.Errorf("no crash at %s (%v)", at, crashes)
		}
	}
	t.Logf("crashes: %v", crashes)
}

// errKilled stops a goroutine of the End's owner where it is, as a kill would.
var errKilled = errors.New("killed")

// owner runs one goroutine of the End's owner, and says why it stopped.
func owner(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = r.(error)
		}
	}()
	return f()
}

// forward is the owner's reader: whole messages go to the store, the rest is held (Settle).
func forward(e *End, store Sock) error {
	var carry []byte
	for {
		p, err := e.Next()
		if err != nil {
			return err
		}
		carry = append(carry, p...)
		whole := 0
		for len(carry)-whole >= 4 {
			n := 4 + int(binary.BigEndian.Uint32(carry[whole:]))
			if len(carry)-whole < n {
				break
			}
			whole += n
		}
		if whole > 0 {
			if _, err := store.Write(carry[:whole]); err != nil {
				return err
			}
			crashPoint("forwarded")
			carry = carry[:copy(carry, carry[whole:])]
		}
		e.Settle(len(carry))
	}
}

// reply is the owner's writer: it peeks the store's replies and consumes what the End wrote.
func reply(e *End, store Sock) error {
	buf := make([]byte, 16<<10)
	for {
		n, _, err := peek(store, buf, 1)
		if err != nil {
			return err
		}
		w, err := e.Write(buf[:n])
		if w > 0 {
			crashPoint("replied")
			if err := consume(store, w); err != nil {
				return err
			}
		}
		if err != nil {
			return err
		}
	}
}

func dupFd(t *testing.T, s Sock) int {
	t.Helper()
	fd, err := unix.Dup(sockFd(t, s))
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// fdSock is a Sock on the socket fd, which it takes.
func fdSock(t *testing.T, fd int) Sock {
	t.Helper()
	f := os.NewFile(uintptr(fd), "")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.TCPConn)
}
