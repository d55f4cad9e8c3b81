package tlsrelay

import (
	"errors"
	"io"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestEndFromASettledPair: EndFrom takes what waits in a relay's pair, in order: what the relay
// had written for the guard (the client's bytes, toStore) and what the guard had written for the
// relay (replies, ahead of those handed over); a relay that had consumed past its State is no
// End's (ErrPairBusy), and nothing is taken or closed.
func TestEndFromASettledPair(t *testing.T) {
	_, tlsSide, e := newEnd(t)
	st, relaySide, guardSide, err := e.Handover(9)
	if err != nil {
		t.Fatal(err)
	}
	defer relaySide.Close()
	defer guardSide.Close()
	relaySide.Write([]byte("request"))
	st.In.To += 7 // as a relay that passed the record's plaintext on and saved its state
	guardSide.Write([]byte("reply "))
	waitQueued(t, guardSide, 7)
	waitQueued(t, relaySide, 6)
	e2, toStore, toClient, err := EndFrom(sockFd(t, tlsSide), st, sockFd(t, relaySide), sockFd(t, guardSide), []byte("handed"))
	if err != nil || string(toStore) != "request" || string(toClient) != "reply handed" {
		t.Fatalf("EndFrom: %v; %q for the store, %q for the client", err, toStore, toClient)
	}
	if e2.Buffered() != 0 || waitQueued(t, relaySide, -1) != 0 || waitQueued(t, guardSide, -1) != 0 {
		t.Fatal("bytes left behind")
	}

	st2, relay2, guard2, err := e.Handover(9) // a relay that consumed a byte past its State
	if err != nil {
		t.Fatal(err)
	}
	defer relay2.Close()
	defer guard2.Close()
	guard2.Write([]byte("rr"))
	relay2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(relay2, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := EndFrom(sockFd(t, tlsSide), st2, sockFd(t, relay2), sockFd(t, guard2), nil); !errors.Is(err, ErrPairBusy) {
		t.Fatalf("the relay read past its State: %v, not ErrPairBusy", err)
	}
	if waitQueued(t, relay2, 1) != 1 {
		t.Fatal("EndFrom took bytes from a relay that goes on")
	}
}

// waitQueued waits until s has want bytes to read (want < 0: none), and returns how many it has.
func waitQueued(t *testing.T, s Sock, want int) int {
	t.Helper()
	fd := sockFd(t, s)
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		n, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
		if err != nil {
			t.Fatal(err)
		}
		if n == max(want, 0) || time.Now().After(end) {
			return n
		}
	}
}
