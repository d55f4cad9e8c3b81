package proxy

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/storeguard/storeguard/internal/tcpcount"
)

// A connection its keeper holds is read with MSG_PEEK, and its bytes are consumed only once passed
// on (keeper_linux.go). The start of a message still in progress is not passed on yet: were it
// consumed, a worker that died before the rest came would take it with it, and its successor
// could only close the connection (restart_lost_request). torch 1.13's client sends a message's
// opcode with a send of its own, so a crash can find one half received. So that start, up to
// holdMax bytes, stays in the socket as well as in carry (the hold): the guard judges only what
// comes after it, and the socket's low-water mark (SO_RCVLOWAT) is one byte past it, so that
// neither epoll nor Go's poller reports the socket until something new is there. A worker that
// dies meanwhile leaves the message whole in the socket, consumed up to its first byte: its
// successor starts between messages and reads it again. An upgrade hands the hold on: its bytes go
// to the next process in Refeed, as the carry they are, and stay in the socket (upgrade.Conn.
// InSocket), which the next process holds as its own (hold.take), so that its crash before the
// message completes loses nothing either; to a build from before that, the freeze consumes them.
// A start larger than holdMax is consumed as before.

// holdMax is the largest start of a message left in the socket: each read peeks it again.
const holdMax = readSize / 2

// hold is the start of the message in progress left in the client's socket.
type hold struct {
	n     int // bytes at the head of the socket, judged and in carry
	lowat int // the socket's SO_RCVLOWAT as set (0: the system's default, 1)
}

// settle consumes, of the n bytes peeked from fd's head, those passed on, leaving in the socket
// the start of a message in progress (carry bytes long) when it can be held there: all of it was
// peeked this time or held before, it is small, and nothing judged waits to be written (left).
func (h *hold) settle(fd, n, carry int, left *leftover) {
	keep := carry
	if keep > n || keep > holdMax || left.unfinished() {
		keep = 0
	}
	if keep > 0 && !h.setLowat(fd, keep+1) {
		keep = 0
	}
	tcpcount.Discard(fd, uint64(n-keep)) // one that fails leaves them for the next read to fail too
	h.n = keep
	if keep == 0 {
		h.setLowat(fd, 1)
	}
}

// take takes the n bytes at the head of fd, the start of a message the previous process held there
// and handed on in Refeed too (refeed bytes long; upgrade.Conn.InSocket), as this process's hold:
// its reads skip them, and a crash before the message completes leaves them in the socket. When
// it cannot hold them (peeked: false, a connection it does not read by peeking; or a hand-over that
// does not add up) it consumes them, as a process that knows no socket hold would have had them.
func (h *hold) take(fd, n, refeed int, peeked bool) {
	if peeked && n <= refeed && n <= holdMax && h.setLowat(fd, n+1) {
		h.n = n
		return
	}
	tcpcount.Discard(fd, uint64(n))
	h.setLowat(fd, 1)
}

// drop consumes the hold (its bytes are in carry) and lets fd's reads wake for any byte: the peer's
// end of stream or a reset came after it, or a freeze hands the connection on.
func (h *hold) drop(fd int) {
	if h.n > 0 {
		tcpcount.Discard(fd, uint64(h.n))
		h.n = 0
	}
	h.setLowat(fd, 1)
}

// setLowat sets fd's SO_RCVLOWAT to v unless it is so already, and reports whether it is.
func (h *hold) setLowat(fd, v int) bool {
	if h.lowat == v || h.lowat == 0 && v == 1 {
		return true
	}
	if setRcvLowat(fd, v) != nil {
		return false
	}
	h.lowat = v
	return true
}

// setRcvLowat sets fd's SO_RCVLOWAT: reads and polls wake once v bytes wait.
func setRcvLowat(fd, v int) error {
	return os.NewSyscallError("setsockopt SO_RCVLOWAT", unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT, v))
}
