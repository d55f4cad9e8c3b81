package connect

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/keeper"
	"github.com/storeguard/storeguard/tlsrelay"
	"github.com/storeguard/storeguard/upgrade"
)

// Under a keeper (connect --keeper), each relay's state is a slot of a ledger in shared memory
// (tlsrelay.NewSharedLedger), which the keeper holds with the listening socket, and each relay's
// two sockets go to the keeper as it starts (the rank's as the client's, the master's as the
// connection's own), with its slot and the master's identity. When this process dies, the keeper starts
// another with them all, and each relay goes on from its slot and its sockets' byte counts
// (tlsrelay.Restore): the rank's connection and its TLS session stay open.

// ledgerSlots is how many relays a shared ledger holds (20.5 KiB each, allocated as used); a
// relay beyond them still runs, with its state in this process only (a crash closes it).
const ledgerSlots = 4096

// keptRelay is what the keeper keeps of a relay for its next process (keeper.Conn.Data).
type keptRelay struct {
	Slot int
	Peer string
}

// shareLedger gives the client a ledger shared with its keeper, if it has one.
func (c *Client) shareLedger() error {
	if c.opt.Keeper == nil || c.ledger != nil {
		return nil
	}
	l, err := tlsrelay.NewSharedLedger(ledgerSlots)
	if err != nil {
		return err
	}
	c.ledger = l
	return nil
}

// keep gives the keeper a relay's sockets and where its state is. Under c.mu.
func (c *Client) keep(r *tlsrelay.Relay, info relayInfo) {
	if c.opt.Keeper == nil || r.Slot() < 0 {
		return
	}
	data, _ := json.Marshal(keptRelay{Slot: r.Slot(), Peer: info.peer})
	tlsFd, plainFd, err := r.Fds()
	if err != nil {
		return
	}
	c.opt.Keeper.OpenedWith(info.id, info.src, info.dst, plainFd, data, tlsFd)
}

// KeeperListeners gives the keeper the listening socket and the ledger, says the process took
// over when it was started for an upgrade, and serves the keeper's requests. Call it once the
// client has its listener (New, TakeOver or Restore).
func (c *Client) KeeperListeners(tookOver bool, failed func(error)) error {
	k := c.opt.Keeper
	if k == nil {
		return nil
	}
	lnFd, err := fdOf(c.ln)
	if err != nil {
		return err
	}
	if tookOver {
		k.TookOver()
	}
	k.Listen(keeper.Listeners{Listen: c.ln.Addr().String(), Ledger: true}, lnFd, c.ledger.Fd())
	go k.Serve(func(peer *os.File) { c.handOverForKeeper(peer, failed) }, failed)
	return nil
}

// AskUpgrade asks the keeper for an upgrade in place; false without a keeper.
func (c *Client) AskUpgrade() bool {
	if c.opt.Keeper == nil {
		return false
	}
	c.opt.Keeper.AskUpgrade()
	return true
}

// handOverForKeeper hands over to the process the keeper started for an upgrade.
func (c *Client) handOverForKeeper(peer *os.File, failed func(error)) {
	defer peer.Close()
	n, err := c.HandOver(peer, nil)
	if err == nil {
		c.opt.Log.Info("upgrade: the new process serves; exiting", "relays", n)
		return
	}
	if upgrade.MayHaveTaken(err) && !c.opt.Keeper.StopNext(10*time.Second) {
		c.opt.Log.Error("upgrade: the keeper did not stop the new process in time; going on")
	}
	upgrade.Thaw(err)
	c.opt.Log.Error("upgrade failed; this process goes on", "err", err)
	if failed != nil && !errors.Is(err, upgrade.ErrUnderWay) {
		failed(err)
	}
}

// Restore makes a client guard from what opt.Keeper holds, after the previous process died: its
// listening socket, its ledger and every relay, each going on where its slot and its sockets
// say it stood. A relay that cannot (its slot was given back as it ended) is closed.
func Restore(opt Options) (*Client, error) {
	var c *Client
	var bad error
	n := 0
	err := opt.Keeper.Restore(func(ln keeper.Listeners, fds []int) error {
		if len(fds) < 2 || !ln.Ledger {
			fdpass.CloseFds(fds)
			return errors.New("keeper: no listening socket and ledger")
		}
		f := os.NewFile(uintptr(fds[0]), "listener")
		l, err := net.FileListener(f)
		f.Close()
		fdpass.CloseFds(fds[1 : len(fds)-1])
		if err != nil {
			fdpass.CloseFds(fds[len(fds)-1:])
			return err
		}
		ledger, err := tlsrelay.OpenLedger(fds[len(fds)-1])
		if err != nil {
			l.Close()
			return err
		}
		c = newClient(opt, l.(*net.TCPListener))
		c.ledger = ledger
		c.nextID.Store(ln.NextID)
		return nil
	}, func(kc keeper.Conn, cfd, ufd int, extra []int) {
		r, kr, err := c.restoreRelay(kc, cfd, ufd, extra)
		if err != nil {
			bad = errors.Join(bad, err)
			opt.Keeper.Ended(kc.ID)
			return
		}
		info := relayInfo{id: kc.ID, src: kc.Src, dst: kc.Dst, peer: kr.Peer}
		c.mu.Lock()
		c.relays[r] = info
		c.run(r, kc.ID)
		c.mu.Unlock()
		n++
	})
	if err != nil {
		if c != nil {
			c.closeRelays()
			c.ln.Close()
		}
		return nil, err
	}
	if bad != nil {
		c.opt.Log.Warn("restart: relays that could not go on were closed", "err", bad)
	}
	c.opt.Log.Info("restart: took every relay back from the keeper", "relays", n)
	return c, nil
}

// restoreRelay makes the relay of kc, which the keeper gave back after a crash: the rank's socket
// cfd, the master's (the relay's one socket of its own) and its slot in the ledger. The sockets
// are closed if it cannot.
func (c *Client) restoreRelay(kc keeper.Conn, cfd, ufd int, extra []int) (*tlsrelay.Relay, keptRelay, error) {
	var kr keptRelay
	fds := append([]int{cfd}, extra...)
	if ufd >= 0 {
		fds = append(fds, ufd)
	}
	if ufd >= 0 || len(extra) != 1 {
		fdpass.CloseFds(fds)
		return nil, kr, fmt.Errorf("relay %d: %d sockets besides the rank's, not the master's alone", kc.ID, len(fds)-1)
	}
	if err := json.Unmarshal(kc.Data, &kr); err != nil {
		fdpass.CloseFds(fds)
		return nil, kr, fmt.Errorf("relay %d: %w", kc.ID, err)
	}
	tlsSock, plain, err := tlsrelay.FromFds(extra[0], cfd)
	if err != nil {
		return nil, kr, err
	}
	r, err := tlsrelay.Restore(tlsSock, plain, c.ledger, kr.Slot, kc.ID)
	return r, kr, err
}
