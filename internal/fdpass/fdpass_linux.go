// Package fdpass passes packets and descriptors between storeguard's processes over a unix
// SOCK_SEQPACKET socket pair: an upgrade's old and new process, a keeper and its worker.
package fdpass

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

const (
	maxPacket  = 60 << 10
	blobPacket = maxPacket - 1
	maxFds     = 253 // SCM_MAX_FD: the most descriptors a packet carries (a keeper's M batch: 200)
)

// Conn is one end of a SOCK_SEQPACKET socket pair: packets of a kind byte and a JSON body, with
// descriptors (SCM_RIGHTS). Calls block; one goroutine sends and one receives at a time.
type Conn struct{ fd int }

// Pair is a connected pair of sockets: a process keeps the first and gives the second to a
// process it starts (exec.Cmd.ExtraFiles).
func Pair() (mine, theirs *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, os.NewSyscallError("socketpair", err)
	}
	return os.NewFile(uintptr(fds[0]), "handover"), os.NewFile(uintptr(fds[1]), "handover-peer"), nil
}

// New is a Conn on a duplicate of f's descriptor (f may be closed then).
func New(f *os.File) (*Conn, error) {
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		return nil, os.NewSyscallError("dup", err)
	}
	unix.CloseOnExec(fd)
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Conn{fd: fd}, nil
}

// Close closes the socket.
func (h *Conn) Close() { unix.Close(h.fd) }

// SetSendTimeout bounds how long a send waits for the other process to read (0: no limit): a
// process that stops reading, without exiting, then fails the send instead of holding it.
func (h *Conn) SetSendTimeout(d time.Duration) error {
	tv := unix.NsecToTimeval(d.Nanoseconds())
	return os.NewSyscallError("setsockopt", unix.SetsockoptTimeval(h.fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv))
}

// Hungup reports whether the other process closed its end (it exited, or gave up), without
// reading anything.
func (h *Conn) Hungup() bool {
	fds := []unix.PollFd{{Fd: int32(h.fd), Events: unix.POLLRDHUP}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR) != 0
}

// Send writes one packet: kind, then v as JSON, with fds (which stay the caller's).
func (h *Conn) Send(kind byte, v any, fds ...int) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(body)+1 > maxPacket {
		return fmt.Errorf("fdpass: %c packet of %d bytes", kind, len(body)+1)
	}
	return h.sendRaw(append([]byte{kind}, body...), fds)
}

func (h *Conn) sendRaw(p []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	for {
		err := unix.Sendmsg(h.fd, p, oob, nil, 0)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return errors.New("fdpass: the other process did not read in time")
		}
		if err != nil {
			return os.NewSyscallError("sendmsg", err)
		}
		return nil
	}
}

// SendBlob writes b in B packets.
func (h *Conn) SendBlob(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), blobPacket)
		if err := h.sendRaw(append([]byte{'B'}, b[:n]...), nil); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// Recv reads one packet, waiting at most timeout (0: no limit); fds are the caller's to close.
func (h *Conn) Recv(timeout time.Duration) (kind byte, body []byte, fds []int, err error) {
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	unix.SetsockoptTimeval(h.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, maxPacket)
	oob := make([]byte, unix.CmsgSpace(4*maxFds))
	var n, oobn, flags int
	for {
		n, oobn, flags, _, err = unix.Recvmsg(h.fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.EAGAIN {
		return 0, nil, nil, fmt.Errorf("fdpass: no word from the other process within %s", timeout)
	}
	if err != nil {
		return 0, nil, nil, os.NewSyscallError("recvmsg", err)
	}
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr == nil {
			for _, m := range msgs {
				if rights, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, rights...)
				}
			}
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 { // the kernel dropped the rest: never act on a part
		CloseFds(fds)
		return 0, nil, nil, fmt.Errorf("fdpass: a %c packet cut short (over %d bytes or %d descriptors)", buf[0], maxPacket, maxFds)
	}
	if n == 0 {
		CloseFds(fds)
		return 0, nil, nil, errors.New("fdpass: the other process closed the hand-over socket")
	}
	return buf[0], buf[1:n], fds, nil
}

// Expect reads a packet of kind k into v (v nil: its body is not read). An X packet is the other
// side giving up, with why.
func (h *Conn) Expect(k byte, timeout time.Duration, v any) ([]int, error) {
	kind, body, fds, err := h.Recv(timeout)
	if err != nil {
		return nil, err
	}
	if kind == 'X' {
		CloseFds(fds)
		var why string
		json.Unmarshal(body, &why)
		return nil, fmt.Errorf("fdpass: the other process gave up: %s", why)
	}
	if kind != k {
		CloseFds(fds)
		return nil, fmt.Errorf("fdpass: expected a %c packet, got %c", k, kind)
	}
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			CloseFds(fds)
			return nil, fmt.Errorf("fdpass: %c packet: %w", k, err)
		}
	}
	return fds, nil
}

// ReadBlob reads n bytes of B packets, waiting at most timeout for each.
func (h *Conn) ReadBlob(n int, timeout time.Duration) ([]byte, error) {
	b := make([]byte, 0, n)
	for len(b) < n {
		kind, body, fds, err := h.Recv(timeout)
		CloseFds(fds)
		if err != nil {
			return nil, err
		}
		if kind != 'B' || len(b)+len(body) > n {
			return nil, fmt.Errorf("fdpass: connection bytes expected, got a %c packet of %d", kind, len(body))
		}
		b = append(b, body...)
	}
	return b, nil
}

// CloseFds closes descriptors received.
func CloseFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
