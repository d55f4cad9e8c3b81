package proxy

import (
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/storeguard/storeguard/keeper"
	"github.com/storeguard/storeguard/tlsrelay"
)

// continuity is what a server keeps for an upgrade in place (upgrade_linux.go, package upgrade)
// and its keeper (keeper_linux.go, package keeper).
type continuity struct {
	lnFd, metricsFd int // the listening sockets' own descriptors, kept to hand over (-1: none)
	frz             freezer
	freezeTimeout   time.Duration // for every connection to park; a test shortens it
	accepting       atomic.Int64  // accepts not yet tracked: a freeze waits for them
	handedOver      chan struct{} // closed once the next process took everything: Serve returns, no drain
	handOnce        sync.Once
	upgradeMu       sync.Mutex // one upgrade at a time
	adopted         *adoption  // what a previous process handed over, until Serve starts it
	handovers       atomic.Uint64
	kp              *keeper.Link     // nil: no keeper
	ledger          *tlsrelay.Ledger // with a keeper: the TLS relays' state, shared with it
	failed          func(error)      // Options.UpgradeFailed
	// keptEnds: the process an upgrade hands over to takes kept Ends from their slots
	// (upgrade.Ready.KeptEnds); socketHolds: it takes a hold left in a client's socket as its own
	// (upgrade.Ready.SocketHolds). Set for the hand-over, under upgradeMu.
	keptEnds, socketHolds bool
}

// sockFd runs f with tc's descriptor, valid for the call (-1 when it has none).
func sockFd(tc syscall.Conn, f func(fd int)) {
	rc, err := tc.SyscallConn()
	if err != nil || rc.Control(func(fd uintptr) { f(int(fd)) }) != nil {
		f(-1)
	}
}

func (c *continuity) init() {
	c.lnFd, c.metricsFd = -1, -1
	c.handedOver = make(chan struct{})
	c.frz.init()
	c.freezeTimeout = 5 * time.Second
}
