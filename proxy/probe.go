package proxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// probeLegacyGeneration learns whether the store speaks G0 or G1, which auto cannot tell from a
// client's bytes (0x07 and 0x08 mean different things in each). It sends the store one byte,
// 0x0B: CANCEL_WAIT to a G1 store, which answers 01; an unknown opcode to a G0 store, which closes
// the connection. A G2+ store closes (or ignores) it too; its clients send VALIDATE, so the
// answer does not matter there. Nothing else is sent: in particular never VALIDATE, which a
// G0/G1 store would read as a SET with a 5 TB key.
func (s *Server) probeLegacyGeneration(ctx context.Context, upstream string, dialTimeout time.Duration) {
	for backoff := 100 * time.Millisecond; ctx.Err() == nil; backoff = min(2*backoff, 10*time.Second) {
		g, err := ProbeLegacyGeneration(upstream, dialTimeout)
		if err == nil {
			s.legacyGen.Store(uint32(g))
			s.log.Info("auto: connections without VALIDATE are read as "+g.String(), "upstream", upstream)
			return
		}
		s.log.Debug("legacy generation probe failed; retrying", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
	}
}

// ProbeLegacyGeneration asks the store at addr whether it speaks G1 (else G0); see
// probeLegacyGeneration. It fails only when the store cannot be reached.
func ProbeLegacyGeneration(addr string, dialTimeout time.Duration) (protocol.Generation, error) {
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte{0x0B}); err != nil {
		return protocol.G0, nil
	}
	var b [1]byte
	if n, _ := c.Read(b[:]); n == 1 && b[0] == 0x01 {
		return protocol.G1, nil
	}
	return protocol.G0, nil
}

// warnExposure warns when the upstream store's port is bound to a non-loopback address, which
// torch always does: then anyone who can reach that address bypasses the guard unless a firewall
// drops them (configs/ has the rules).
func (s *Server) warnExposure(upstream string) {
	_, portStr, err := net.SplitHostPort(upstream)
	if err != nil {
		return
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return
	}
	for _, addr := range listeningOn(port) {
		s.log.Warn(fmt.Sprintf("the upstream store listens on %s, not only on loopback: clients that reach it "+
			"there bypass storeguard unless a firewall drops them (see configs/)", addr), "upstream", upstream)
	}
}

// listeningOn returns the non-loopback local addresses with a TCP socket listening on port,
// read from /proc/net/tcp and tcp6.
func listeningOn(port int) []string {
	var out []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] != "0A" { // 0A: LISTEN
				continue
			}
			hexAddr, hexPort, ok := strings.Cut(fields[1], ":")
			if !ok {
				continue
			}
			if p, err := strconv.ParseUint(hexPort, 16, 16); err != nil || int(p) != port {
				continue
			}
			ip := procIP(hexAddr)
			if ip == nil || ip.IsLoopback() {
				continue
			}
			out = append(out, net.JoinHostPort(ip.String(), strconv.Itoa(port)))
		}
		fh.Close()
	}
	return out
}

// procIP decodes an address of /proc/net/tcp*: 32-bit words in host (little-endian) order.
func procIP(h string) net.IP {
	if len(h) != 8 && len(h) != 32 {
		return nil
	}
	ip := make(net.IP, len(h)/2)
	for w := 0; w < len(h)/8; w++ {
		v, err := strconv.ParseUint(h[8*w:8*w+8], 16, 32)
		if err != nil {
			return nil
		}
		for i := range 4 {
			ip[4*w+i] = byte(v >> (8 * i))
		}
	}
	return ip
}
