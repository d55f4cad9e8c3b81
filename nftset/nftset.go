// Package nftset keeps addresses in a pair of nftables sets (IPv4 and IPv6) with timeouts,
// through the nft command: the firewall's view of which hosts proved who they are.
//
// A set is named by "family table set" (tls.peer-set: "inet storeguard_peers peers"); its IPv6
// twin is the same name with "6" appended. Both are declared with "flags timeout" by the
// operator's ruleset (configs/nftables/storeguard-peers.nft), which also says what an address in
// them may reach. Each Refresh re-adds every address it is given with a full timeout in one nft
// transaction (add, delete, add: an element that is already there gets its timeout back, one that
// is not is made), so an address nobody refreshes any longer leaves the set by itself.
package nftset

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// Spec names the IPv4 set; the IPv6 one is Set + "6".
type Spec struct{ Family, Table, Set string }

var name = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]{0,62}$`)

// Parse reads "family table set".
func Parse(s string) (Spec, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return Spec{}, fmt.Errorf("want \"family table set\" (e.g. \"inet storeguard_peers peers\"), got %q", s)
	}
	sp := Spec{Family: f[0], Table: f[1], Set: f[2]}
	switch sp.Family {
	case "inet", "ip", "ip6", "bridge", "netdev":
	default:
		return Spec{}, fmt.Errorf("family %q is not an nftables family (inet, ip, ip6, bridge, netdev)", sp.Family)
	}
	for _, n := range []string{sp.Table, sp.Set} {
		if !name.MatchString(n) {
			return Spec{}, fmt.Errorf("%q is not an nftables table or set name", n)
		}
	}
	return sp, nil
}

// sets are the IPv4 set's and the IPv6 set's full names.
func (sp Spec) sets() [2]string {
	p := sp.Family + " " + sp.Table + " "
	return [2]string{p + sp.Set, p + sp.Set + "6"}
}

// Check lists both sets with run: it fails when either is missing, or nft may not read them.
// (Two commands: nft 1.0.6 fails the first "list set" of a script given with -f.)
func (sp Spec) Check(ctx context.Context, run Runner) error {
	for _, set := range sp.sets() {
		if err := run(ctx, "", append([]string{"list", "set"}, strings.Fields(set)...)...); err != nil {
			return err
		}
	}
	return nil
}

// Refresh runs RefreshScript(addrs, timeout) with run, as one transaction; nothing when addrs is
// empty.
func (sp Spec) Refresh(ctx context.Context, run Runner, addrs []netip.Addr, timeout time.Duration) error {
	script := sp.RefreshScript(addrs, timeout)
	if script == "" {
		return nil
	}
	return run(ctx, script, "-f", "-")
}

// RefreshScript is the transaction that gives each of addrs a full timeout in its set (IPv4 or
// IPv6; a v4-mapped address counts as IPv4). Empty when addrs is.
func (sp Spec) RefreshScript(addrs []netip.Addr, timeout time.Duration) string {
	fam := families(addrs)
	secs := int64((timeout + time.Second - 1) / time.Second)
	var b strings.Builder
	for i, set := range sp.sets() {
		if len(fam[i]) == 0 {
			continue
		}
		timed := make([]string, len(fam[i]))
		for j, a := range fam[i] {
			timed[j] = fmt.Sprintf("%s timeout %ds", a, secs)
		}
		fmt.Fprintf(&b, "add element %s { %s }\n", set, strings.Join(timed, ", "))
		fmt.Fprintf(&b, "delete element %s { %s }\n", set, strings.Join(fam[i], ", "))
		fmt.Fprintf(&b, "add element %s { %s }\n", set, strings.Join(timed, ", "))
	}
	return b.String()
}

// Remove runs RemoveScript(addrs) with run, as one transaction; nothing when addrs is empty.
func (sp Spec) Remove(ctx context.Context, run Runner, addrs []netip.Addr) error {
	script := sp.RemoveScript(addrs)
	if script == "" {
		return nil
	}
	return run(ctx, script, "-f", "-")
}

// RemoveScript is the transaction that takes each of addrs out of its set, whether it is there
// or not: an element is added with a second's timeout first, so that the delete always finds it.
// Empty when addrs is.
func (sp Spec) RemoveScript(addrs []netip.Addr) string {
	var b strings.Builder
	for i, set := range sp.sets() {
		fam := families(addrs)[i]
		if len(fam) == 0 {
			continue
		}
		timed := make([]string, len(fam))
		for j, a := range fam {
			timed[j] = a + " timeout 1s"
		}
		fmt.Fprintf(&b, "add element %s { %s }\n", set, strings.Join(timed, ", "))
		fmt.Fprintf(&b, "delete element %s { %s }\n", set, strings.Join(fam, ", "))
	}
	return b.String()
}

// families splits addrs into IPv4 (a v4-mapped address counts as IPv4) and IPv6, as the sets
// hold them.
func families(addrs []netip.Addr) [2][]string {
	var fam [2][]string
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() {
			continue
		}
		i := 0
		if a.Is6() {
			i = 1
		}
		fam[i] = append(fam[i], a.WithZone("").String())
	}
	return fam
}

// Runner runs nft with args, and stdin as its standard input.
type Runner func(ctx context.Context, stdin string, args ...string) error

// Nft runs the nft command (it needs CAP_NET_ADMIN in the network namespace of the sets). Its
// error carries nft's first line of output.
func Nft(ctx context.Context, stdin string, args ...string) error {
	cmd := exec.CommandContext(ctx, "nft", args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(bytes.SplitN(out, []byte("\n"), 2)[0]))
		if errors.Is(err, exec.ErrNotFound) || msg == "" {
			return fmt.Errorf("nft: %w", err)
		}
		return fmt.Errorf("nft: %s (%w)", msg, err)
	}
	return nil
}
