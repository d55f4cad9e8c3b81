//go:build !linux

package proxy

import (
	"errors"
	"net"
	"net/netip"
	"os"

	"github.com/storeguard/storeguard/upgrade"
)

// Event loops (epoll) and the transparent redirect's original destination (SO_ORIGINAL_DST) need
// Linux. Elsewhere every connection is forwarded by its goroutines, and its destination is the
// address it reached: enough to develop and test storeguard on a laptop, not to deploy it.

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

func (s *Server) keepListenerFds() error { return nil }

func listenerFromFd(int) (*net.TCPListener, error) { return nil, errNoLoops }

func (s *Server) startAdopted() {}

func (s *Server) closeKeptFds() {}

type adoption struct{}

func (c *conn) toLoop() (took, live bool) {
	c.startReplies()
	return false, true
}

func (c *conn) fromLoop() bool { return false }

func originalDstFd(_ int, local netip.AddrPort) netip.AddrPort { return local }

// Upgrade in place (package upgrade) and a keeper (package keeper) pass descriptors between
// processes: Linux only.

func (s *Server) TakeOver(*os.File) error                         { return upgrade.ErrNeedsLinux }
func (s *Server) HandOver(*os.File, <-chan struct{}) (int, error) { return 0, upgrade.ErrNeedsLinux }
func (s *Server) UseKeeper(*os.File) error                        { return upgrade.ErrNeedsLinux }
func (s *Server) KeeperListeners(bool)                            {}
func (s *Server) AskUpgrade() bool                                { return false }
func (s *Server) RestoreFromKeeper() error                        { return upgrade.ErrNeedsLinux }
