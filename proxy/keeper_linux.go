package proxy

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/storeguard/storeguard/guard"
	"github.com/storeguard/storeguard/internal/fdpass"
	"github.com/storeguard/storeguard/internal/tcpcount"
	"github.com/storeguard/storeguard/keeper"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/tlsrelay"
	"github.com/storeguard/storeguard/upgrade"
)

// A worker's link to its keeper is package keeper's Link: every socket the server accepts or
// connects to the store goes to it (Opened, Connected), and every end (Ended). This file starts
// the link, answers the keeper's requests and takes everything back from it after a crash.

// UseKeeper links the server to the keeper at the other end of f (keeper.Env).
func (s *Server) UseKeeper(f *os.File) error {
	l, err := keeper.Dial(f, s.log)
	if err != nil {
		return err
	}
	s.cont.kp = l
	return nil
}

// ledgerSlots is how many TLS relays a shared ledger holds (20.5 KiB each, allocated as used); a
// relay beyond them still runs, with its state in this process only (a crash closes it).
const ledgerSlots = 4096

// KeeperListeners gives the keeper the listening sockets, and says the worker took over when it was
// started for an upgrade (TakeOver): call it once the server has its listeners.
func (s *Server) KeeperListeners(tookOver bool) {
	k := s.cont.kp
	if k == nil {
		return
	}
	if tookOver {
		k.TookOver()
	}
	if s.ids != nil && s.cont.ledger == nil { // a restart took the keeper's
		var err error
		if s.cont.ledger, err = tlsrelay.NewSharedLedger(ledgerSlots); err != nil {
			s.log.Error("keeper: no shared ledger for the TLS relays; a crash of this process closes its TLS connections", "err", err)
		}
	}
	ln := keeper.Listeners{Listen: s.listeners.clients.Addr().String()}
	fds := []int{s.cont.lnFd}
	if s.cont.metricsFd >= 0 {
		ln.MetricsListen = s.listeners.metrics.Addr().String()
		fds = append(fds, s.cont.metricsFd)
	}
	if s.cont.ledger != nil {
		ln.Ledger = true
		fds = append(fds, s.cont.ledger.Fd())
	}
	k.Listen(ln, fds...)
	go k.Serve(s.handOverForKeeper, s.cont.failed)
}

// AskUpgrade asks the keeper for an upgrade in place; false when there is no keeper.
func (s *Server) AskUpgrade() bool {
	if s.cont.kp == nil {
		return false
	}
	s.cont.kp.AskUpgrade()
	return true
}

// handOverForKeeper hands over to the worker the keeper started for an upgrade.
func (s *Server) handOverForKeeper(peer *os.File) {
	defer peer.Close()
	n, err := s.HandOver(peer, nil)
	if err == nil {
		s.log.Info("upgrade: the new worker serves; exiting", "connections", n)
		return
	}
	if upgrade.MayHaveTaken(err) && !s.cont.kp.StopNext(10*time.Second) {
		s.log.Error("upgrade: the keeper did not stop the new worker in time; going on")
	}
	upgrade.Thaw(err)
	s.log.Error("upgrade failed; this process goes on serving", "err", err)
	if !errors.Is(err, upgrade.ErrUnderWay) {
		s.cont.failed(err)
	}
}

// RestoreFromKeeper takes everything the keeper holds, in place of Listen, after the previous
// worker died: the listening sockets and every connection, each rebuilt between messages.
func (s *Server) RestoreFromKeeper() error {
	a := &adoption{reason: "restart"}
	err := s.cont.kp.Restore(func(ln keeper.Listeners, fds []int) error {
		if ln.Ledger && len(fds) > 1 {
			ledger, err := tlsrelay.OpenLedger(fds[len(fds)-1])
			fds = fds[:len(fds)-1]
			if err != nil {
				fdpass.CloseFds(fds)
				return fmt.Errorf("TLS relays' ledger: %w", err)
			}
			s.cont.ledger = ledger
		}
		if err := s.takeListeners(upgrade.ServerState{Listen: ln.Listen, MetricsListen: ln.MetricsListen}, fds, a); err != nil {
			return err
		}
		s.nextID.Store(ln.NextID)
		return nil
	}, func(kc keeper.Conn, cfd, ufd int, extra []int) {
		ac := adoptedConn{rebuild: true, c: s.newConn(kc.ID, kc.Src, kc.Dst, s.now()),
			st: upgrade.Conn{ClientFd: cfd, StoreFd: ufd}}
		if err := s.restoreTLS(&ac, kc.Data, extra); err != nil {
			s.log.Warn("restart: a TLS connection cannot go on; closing it", "conn", kc.ID, "err", err)
			s.cont.kp.Ended(kc.ID)
			ac.closeFds()
			return
		}
		a.conns = append(a.conns, ac)
	})
	if err != nil {
		return err
	}
	s.cont.adopted = a
	return nil
}

// rebuild readies the guard of a connection restored after a crash: between messages, its
// store's generation, and past its first message when its store was connected (the first valid
// message connects it: VALIDATE for 2.2+ stores). A message that was half-received when the
// worker died is lost with it (docs/design.md).
func (s *Server) rebuild(ac *adoptedConn) bool {
	c := ac.c
	dc := c.st.dec
	if dc.Gen.Auto {
		info, ok := s.store.Await(c.st.cfg.Timeouts.UpstreamDial, s.draining.end)
		if !ok {
			return false
		}
		dc = c.st.decoderFor(info)
	}
	if ac.st.StoreFd < 0 {
		c.resetGuard(dc)
		return true
	}
	c.g.Restore(guard.StreamState{Start: c.start, Talked: true,
		Decoder: protocol.DecoderState{Config: dc, Gen: dc.Gen.Gen, Validated: true, Index: 1}}, &c.st.pol)
	c.attachGuard()
	return true
}

// A worker reads the connections its keeper holds with MSG_PEEK and consumes the bytes only
// once they are passed on (readPooled, peekFd): every byte it passed on was written to the other
// socket, every byte it did not is still in its socket, and the kernel's counters (tcpcount) say
// which is which after a crash. Each direction forwards its source's bytes as they are, so the
// bytes written to its destination are a prefix of those its source sent:
//   - written past what was consumed: the worker died between the write and the consume; those
//     bytes were passed on, and are consumed now;
//   - consumed past what was written: the worker had taken them into its own memory (the start of
//     a message still in progress, replies a client had not taken yet, bytes a store could not
//     take at once) and they died with it. The connection cannot go on exactly, so it is closed:
//     its client sees the connection end rather than a message that never comes.
// What no count can tell: a message the worker had written only in part when it died (a store
// that did not take it all at once). Its rest is judged as a new message and refused.

// Restore outcomes (audit, logs): why a restored connection was closed.
const (
	lostRequest = "restart_lost_request" // client bytes consumed and not passed on to the store
	lostReply   = "restart_lost_reply"   // store bytes consumed and not passed on to the client
	lostCounts  = "restart_counts_failed"
)

// reconcile brings a connection restored after a crash to where its streams stand: it consumes
// what the dead worker passed on without consuming, and reports "" or why the connection must
// close. The start of a message the dead worker held in the client's socket (client.go: hold) is
// there, unconsumed, and is read again; the socket's low-water mark it set goes back to one byte.
func reconcile(cfd, ufd int) (lost string, err error) {
	if err := setRcvLowat(cfd, 1); err != nil {
		return lostCounts, err
	}
	cRead, cWritten, err := tcpcount.Counts(cfd, false)
	if err != nil {
		return lostCounts, err
	}
	var uRead, uWritten uint64
	if ufd >= 0 {
		if uRead, uWritten, err = tcpcount.Counts(ufd, true); err != nil {
			return lostCounts, err
		}
	}
	switch {
	case uWritten < cRead:
		return lostRequest, nil
	case cWritten < uRead:
		return lostReply, nil
	}
	if err := tcpcount.Discard(cfd, uWritten-cRead); err != nil {
		return lostCounts, err
	}
	if err := tcpcount.Discard(ufd, cWritten-uRead); err != nil {
		return lostCounts, err
	}
	return "", nil
}
