package storeinfo

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
)

// WarnExposure warns when the upstream store's port is bound to a non-loopback address, which
// torch always does: then anyone who can reach that address bypasses the guard unless a firewall
// drops them (configs/ has the rules).
func WarnExposure(log *slog.Logger, upstream string) {
	_, portStr, err := net.SplitHostPort(upstream)
	if err != nil {
		return
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return
	}
	for _, addr := range listeningOn(port) {
		log.Warn(fmt.Sprintf("the upstream store listens on %s, not only on loopback: clients that reach it "+
			"there bypass storeguard unless a firewall drops them (see configs/)", addr), "upstream", upstream)
	}
}

// listeningOn returns the non-loopback local addresses with a TCP socket listening on port.
func listeningOn(port int) []string {
	var out []string
	for _, l := range procListeners() {
		if int(l.addr.Port()) != port || l.addr.Addr().IsLoopback() {
			continue
		}
		out = append(out, l.addr.String())
	}
	return out
}
