package proxy

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

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
