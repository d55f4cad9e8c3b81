// Package firewall installs, checks and removes storeguard's nftables tables by netlink, with no
// nft binary: the rulesets of configs/nftables and configs/explicit, rule for rule, built from
// the same values as those files' defines (`storeguard firewall install|check|remove`).
//
// Each ruleset is one table, written in one netlink transaction:
//   - sidecar (configs/nftables/storeguard.nft, table inet storeguard): remote connections to the
//     store port are redirected to the guard, and what bypassed the redirect is dropped;
//   - explicit (configs/explicit/storeguard-explicit.nft, table inet storeguard): the store's
//     private port is loopback-only;
//   - connect (configs/nftables/storeguard-connect.nft, table inet storeguard_connect): a worker's
//     connections to the master's store ports go to its client guard;
//   - peers (configs/nftables/storeguard-peers.nft, table inet storeguard_peers): a master's free
//     ports are kept from every host that did not prove who it is (the sets the guard keeps, see
//     nftset).
//
// sidecar, explicit and connect replace their table whole (create, delete, create: as the files
// do, there is no moment with the redirect gone); peers keeps its table and sets, and so the
// addresses in them, and replaces only its chain's rules.
package firewall

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Values are the rulesets' parameters: the files' defines.
type Values struct {
	StorePort   uint16    // sidecar: MASTER_PORT, where the real store listens (store_port)
	ProxyPort   uint16    // sidecar: where storeguard serve listens (proxy_port)
	PrivatePort uint16    // explicit: the store's private port (private_port)
	MasterPorts []uint16  // connect: the master's store ports (master_ports)
	ConnectPort uint16    // connect: where storeguard connect listens (connect_port)
	GuardUID    uint32    // connect: the uid storeguard connect runs as (guard_uid)
	GuardMark   uint32    // connect: storeguard connect --mark (guard_mark)
	FreePorts   [2]uint16 // peers: this host's ephemeral port range (free_ports)
}

// Defaults are the files' defines, but for FreePorts, which is this host's
// net.ipv4.ip_local_port_range when it can be read (the file's 32768-60999 otherwise).
func Defaults() Values {
	v := Values{StorePort: 29500, ProxyPort: 29499, PrivatePort: 29501, MasterPorts: []uint16{29500},
		ConnectPort: 15001, GuardUID: 65533, GuardMark: 0x5347, FreePorts: [2]uint16{32768, 60999}}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if r, err := ParsePorts(strings.Join(strings.Fields(string(b)), "-")); err == nil && len(r) == 2 {
			v.FreePorts = [2]uint16{r[0], r[1]}
		}
	}
	return v
}

// Rulesets are the names Install, Check and Remove take.
var Rulesets = []string{"sidecar", "explicit", "connect", "peers"}

// Table is the table a ruleset owns.
func Table(ruleset string) (string, error) {
	switch ruleset {
	case "sidecar", "explicit":
		return "storeguard", nil
	case "connect":
		return "storeguard_connect", nil
	case "peers":
		return "storeguard_peers", nil
	}
	return "", fmt.Errorf("no ruleset %q (one of %s)", ruleset, strings.Join(Rulesets, ", "))
}

// Validate says which value a ruleset cannot be built with.
func (v Values) Validate(ruleset string) error {
	if _, err := Table(ruleset); err != nil {
		return err
	}
	zero := func(name string, p uint16) error {
		if p == 0 {
			return fmt.Errorf("%s: a port from 1 to 65535 is needed", name)
		}
		return nil
	}
	switch ruleset {
	case "sidecar":
		if err := zero("store-port", v.StorePort); err != nil {
			return err
		}
		if err := zero("proxy-port", v.ProxyPort); err != nil {
			return err
		}
		if v.StorePort == v.ProxyPort {
			return fmt.Errorf("proxy-port: %d is the store port: the guard must listen on another", v.ProxyPort)
		}
	case "explicit":
		return zero("private-port", v.PrivatePort)
	case "connect":
		if len(v.MasterPorts) == 0 {
			return fmt.Errorf("master-ports: at least one port is needed")
		}
		for _, p := range v.MasterPorts {
			if err := zero("master-ports", p); err != nil {
				return err
			}
			if p == v.ConnectPort {
				return fmt.Errorf("connect-port: %d is a master port", p)
			}
		}
		return zero("connect-port", v.ConnectPort)
	case "peers":
		if v.FreePorts[0] == 0 || v.FreePorts[0] > v.FreePorts[1] {
			return fmt.Errorf("free-ports: %d-%d is not a range of ports", v.FreePorts[0], v.FreePorts[1])
		}
	}
	return nil
}

// ParsePorts reads "29500", "29500,29400" or "32768-60999" (a range gives its two ends).
func ParsePorts(s string) ([]uint16, error) {
	one := func(t string) (uint16, error) {
		n, err := strconv.ParseUint(strings.TrimSpace(t), 10, 16)
		if err != nil || n == 0 {
			return 0, fmt.Errorf("%q is not a port (1 to 65535)", t)
		}
		return uint16(n), nil
	}
	if lo, hi, ok := strings.Cut(s, "-"); ok {
		a, err := one(lo)
		if err != nil {
			return nil, err
		}
		b, err := one(hi)
		if err != nil {
			return nil, err
		}
		if a > b {
			return nil, fmt.Errorf("%q: the range ends before it starts", s)
		}
		return []uint16{a, b}, nil
	}
	var out []uint16
	seen := map[uint16]bool{}
	for _, t := range strings.Split(s, ",") {
		p, err := one(t)
		if err != nil {
			return nil, err
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}
