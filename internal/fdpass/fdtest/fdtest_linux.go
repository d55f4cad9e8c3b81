// Package fdtest helps tests of descriptor passing: sockets to pass, a check that a descriptor
// received is the socket sent, and a count of the descriptors open to find leaks.
package fdtest

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Sockets are n connected stream socket pairs, closed when the test ends: the first of each is
// the one to pass, the second the one to check it through (Same).
func Sockets(t *testing.T, n int) (pass, peer []*os.File) {
	t.Helper()
	for i := range n {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		a, b := os.NewFile(uintptr(fds[0]), fmt.Sprint("pass", i)), os.NewFile(uintptr(fds[1]), fmt.Sprint("peer", i))
		t.Cleanup(func() { a.Close(); b.Close() })
		pass, peer = append(pass, a), append(peer, b)
	}
	return pass, peer
}

// Fds are the files' descriptors.
func Fds(files ...*os.File) []int {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return fds
}

// Same checks that fd, received, is the socket passed whose peer is peer: what is written
// through it arrives there.
func Same(t *testing.T, fd int, peer *os.File) {
	t.Helper()
	msg := fmt.Sprintf("through %d to %s", fd, peer.Name())
	if _, err := unix.Write(fd, []byte(msg)); err != nil {
		t.Fatalf("write through descriptor %d: %v", fd, err)
	}
	buf := make([]byte, 64)
	n, err := peer.Read(buf)
	if err != nil || string(buf[:n]) != msg {
		t.Fatalf("descriptor %d: %s read %q, %v; want %q", fd, peer.Name(), buf[:n], err, msg)
	}
}

// Count is how many descriptors this process has open.
func Count(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// NoLeak checks, when the test ends (after the cleanups registered after it), that the test left
// no descriptor open: call it first.
func NoLeak(t *testing.T) {
	t.Helper()
	before := Count(t)
	t.Cleanup(func() {
		if after := Count(t); after != before {
			t.Errorf("%d descriptors open before the test, %d after: leaked", before, after)
		}
	})
}
