//go:build !linux

package proxy

import (
	"net"
	"net/netip"
	"os"
	"syscall"

	"github.com/storeguard/storeguard/upgrade"
)

// Upgrade in place (package upgrade) and a keeper (package keeper) pass descriptors between
// processes: Linux only.

func (s *Server) TakeOver(*os.File) error                         { return upgrade.ErrNeedsLinux }
func (s *Server) HandOver(*os.File, <-chan struct{}) (int, error) { return 0, upgrade.ErrNeedsLinux }
func (s *Server) UseKeeper(*os.File) error                        { return upgrade.ErrNeedsLinux }
func (s *Server) KeeperListeners(bool)                            {}
func (s *Server) AskUpgrade() bool                                { return false }
func (s *Server) RestoreFromKeeper() error                        { return upgrade.ErrNeedsLinux }

type adoption struct{}

func (s *Server) startAdopted() {}

func (s *Server) keepListenerFds() error { return nil }

func (s *Server) closeKeptFds() {}

func (cl *client) keepSock(uint64, netip.AddrPort, netip.AddrPort, syscall.Conn) {}

func listenerFromFd(int) (*net.TCPListener, error) { return nil, upgrade.ErrNeedsLinux }
