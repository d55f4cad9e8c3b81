package proxy

import (
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/verdict"
)

// A banned source's connection is refused, but its first bytes (admission.PeekBytes) are read for
// ban.peek, never forwarded (the store is not connected), and judged by a decoder of their own for
// the flow record.

// refuseConn refuses tc, whose source admission turned away for reason, and accounts for it.
func (s *Server) refuseConn(tc *net.TCPConn, src, dst netip.AddrPort, reason admission.Reason) {
	start := s.now()
	s.ev.refused(src, dst, reason)
	if st := s.peekable(reason); st != nil {
		s.peekThenClose(tc, src, dst, reason, start, st)
		return
	}
	tc.Close()
	s.ev.refusedFlow(src, dst, string(reason), start, nil, nil)
}

// refuseFd is refuseConn for a socket an event loop accepted; it closes fd.
func (s *Server) refuseFd(fd int, src, dst netip.AddrPort, reason admission.Reason) {
	start := s.now()
	s.ev.refused(src, dst, reason)
	if st := s.peekable(reason); st != nil {
		f := os.NewFile(uintptr(fd), "")
		nc, err := net.FileConn(f) // a duplicate
		f.Close()                  // fd itself
		if tc, ok := nc.(*net.TCPConn); err == nil && ok {
			s.peekThenClose(tc, src, dst, reason, start, st)
			return
		}
		if nc != nil {
			nc.Close()
		}
		s.peeks.Done()
	} else {
		unix.Close(fd)
	}
	s.ev.refusedFlow(src, dst, string(reason), start, nil, nil)
}

// peekable takes one of admission.MaxPeeks for a connection refused for reason, if it is to be read: a
// banned source's (throttled too), with ban.peek set. nil: close it at once.
func (s *Server) peekable(reason admission.Reason) *settings {
	st := s.set.Load()
	if !verdict.Peeked(reason, st.cfg.Ban.Peek) || s.draining.on.Load() {
		return nil
	}
	if !s.peeks.Take() {
		s.m.peeks.WithLabelValues("skipped").Inc()
		return nil
	}
	s.m.peeks.WithLabelValues("read").Inc()
	return st
}

// peekThenClose reads tc's first bytes for ban.peek on a goroutine of its own, then closes it and
// writes its flow record.
func (s *Server) peekThenClose(tc *net.TCPConn, src, dst netip.AddrPort, reason admission.Reason, start time.Time,
	st *settings) {
	s.handlers.Add(1)
	go func() {
		defer s.handlers.Done()
		defer s.peeks.Done()
		first := peek(tc, st.cfg.Ban.Peek)
		tc.Close()
		s.ev.refusedFlow(src, dst, string(reason), start, first, s.judgeFirst(st, first))
	}()
}

// peek reads what c sends within d, as verdict.Peek says.
func peek(c *net.TCPConn, d time.Duration) []byte {
	p := verdict.NewPeek(time.Now(), d)
	c.SetReadDeadline(p.Until())
	for !p.Full() {
		m, err := c.Read(p.Room())
		if p.Took(m, time.Now()) {
			c.SetReadDeadline(p.Until())
		}
		if err != nil {
			break
		}
	}
	return p.Bytes()
}

// judgeFirst is the violation, if any, that first would have been as a connection's first bytes,
// decoded as the store reads them (auto: once its generation is known).
func (s *Server) judgeFirst(st *settings, first []byte) *protocol.Violation {
	if len(first) == 0 {
		return nil
	}
	dc := st.dec
	if dc.Gen.Auto {
		info, known := s.store.Get()
		if !known {
			return nil
		}
		dc = st.decoderFor(info)
	}
	return protocol.FirstViolation(dc, first)
}
