package tcpcount_test

import (
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/storeguard/storeguard/internal/tcpcount"
	"github.com/storeguard/storeguard/tlsrelay"
)

// Discard drops exactly the bytes asked for, leaving the rest to be read, counts them as
// consumed, and fails (dropping what was there) when fewer wait.
func TestDiscard(t *testing.T) {
	w, c, fd := pair(t)
	w.Write([]byte("dropped!kept"))
	for deadline := time.Now().Add(5 * time.Second); ; {
		if read, _, _ := tcpcount.Counts(fd, false); read == 0 && waiting(t, fd) == 12 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the bytes never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	if err := tcpcount.Discard(fd, 8); err != nil {
		t.Fatal(err)
	}
	if read, _, err := tcpcount.Counts(fd, false); read != 8 || err != nil {
		t.Fatalf("consumed %d, %v; want 8", read, err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "kept" {
		t.Fatalf("read %q, %v after the discard", got, err)
	}
	w.Write([]byte("ab"))
	for waiting(t, fd) != 2 {
		time.Sleep(time.Millisecond)
	}
	if err := tcpcount.Discard(fd, 3); err == nil {
		t.Fatal("discarded 3 bytes of 2")
	}
}

func waiting(t *testing.T, fd int) int {
	t.Helper()
	n, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// PeerOpen is true while the peer may send, with bytes unread or not, and false once its FIN came,
// even with bytes still unread before it.
func TestPeerOpen(t *testing.T) {
	w, _, fd := pair(t)
	if !tcpcount.PeerOpen(fd) {
		t.Fatal("not open before a byte moved")
	}
	w.Write([]byte("unread"))
	for waiting(t, fd) != 6 {
		time.Sleep(time.Millisecond)
	}
	if !tcpcount.PeerOpen(fd) {
		t.Fatal("not open with bytes unread")
	}
	w.CloseWrite()
	for deadline := time.Now().Add(5 * time.Second); tcpcount.PeerOpen(fd); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("still open 5 s after the peer's FIN")
		}
	}
	if waiting(t, fd) != 6 {
		t.Fatal("the unread bytes went")
	}
}

// pair is a connected pair of loopback sockets, closed when the test ends, and c's descriptor.
func pair(t *testing.T) (w, c *net.TCPConn, fd int) {
	t.Helper()
	w, c, err := tlsrelay.LoopbackPair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(); c.Close() })
	rc, _ := c.SyscallConn()
	rc.Control(func(f uintptr) { fd = int(f) })
	return w, c, fd
}
