//go:build !linux

package proxy

import (
	"errors"
	"net"
)

// Event loops (epoll) need Linux. Elsewhere every connection is forwarded by its goroutines:
// enough to develop and test storeguard on a laptop, not to deploy it.

var errNoLoops = errors.New("event loops need Linux (epoll)")

type loop struct{}

// loopTransport holds what a connection's loop would: its descriptors stay -1.
type loopTransport struct {
	lp       *loop
	cfd, ufd int32
}

type loops struct{}

func startLoops(*Server, int) (*loops, error)    { return nil, errNoLoops }
func (*loops) pick() *loop                       { return nil }
func (*loops) stop()                             {}
func (*loops) acceptFrom(*net.TCPListener) error { return errNoLoops }
func (*loops) stopAccepting()                    {}
func (*loop) requestClose(*conn)                 {}

func (*loops) restart(*Server) {}

func (c *conn) loopable() bool { return false }

func (c *conn) toLoop() (took, live bool) {
	c.startReplies()
	return false, true
}

func (c *conn) fromLoop(leftover) bool { return false }
