// Package nftset keeps addresses in a pair of nftables sets (IPv4 and IPv6) with timeouts, by
// netlink (no nft binary): the firewall's view of which hosts proved who they are.
//
// A set is named by "family table set" (tls.peer-set: "inet storeguard_peers peers"); its IPv6
// twin is the same name with "6" appended. Both are declared with "flags timeout" by the
// operator's ruleset (configs/nftables/storeguard-peers.nft), which also says what an address in
// them may reach (storeguard firewall install peers loads it). Each Refresh re-adds every address
// it is given with a full timeout in one netlink transaction (add, delete, add: an element that is already there gets its timeout back, one that
// is not is made), so an address nobody refreshes any longer leaves the set by itself.
package nftset

import (
	"context"
	"fmt"
	"net/netip"
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

// Check fails when either set is missing, is not a set of addresses with timeouts, or r may not
// read them.
func (sp Spec) Check(ctx context.Context, r Runner) error { return r.Check(ctx, sp) }

// Refresh applies RefreshTxn(addrs, timeout) with r, as one transaction; nothing when addrs is
// empty.
func (sp Spec) Refresh(ctx context.Context, r Runner, addrs []netip.Addr, timeout time.Duration) error {
	return apply(ctx, r, sp.RefreshTxn(addrs, timeout))
}

// Remove applies RemoveTxn(addrs) with r, as one transaction; nothing when addrs is empty.
func (sp Spec) Remove(ctx context.Context, r Runner, addrs []netip.Addr) error {
	return apply(ctx, r, sp.RemoveTxn(addrs))
}

func apply(ctx context.Context, r Runner, t Txn) error {
	if len(t.Ops) == 0 {
		return nil
	}
	return r.Apply(ctx, t)
}

// Txn is a transaction on a Spec's sets: its ops are applied together or not at all.
type Txn struct {
	Spec Spec
	Ops  []Op
}

// Op adds (with Timeout, when not zero) or deletes Addrs in one set (Spec.Set, or Spec.Set+"6").
type Op struct {
	Delete  bool
	Set     string
	Addrs   []netip.Addr
	Timeout time.Duration
}

// String is the transaction in nft's syntax, one line an op (what `nft -f` would be given).
func (t Txn) String() string {
	var b strings.Builder
	for _, op := range t.Ops {
		verb := "add"
		if op.Delete {
			verb = "delete"
		}
		elems := make([]string, len(op.Addrs))
		for i, a := range op.Addrs {
			elems[i] = a.String()
			if op.Timeout > 0 {
				elems[i] += fmt.Sprintf(" timeout %ds", int64((op.Timeout+time.Second-1)/time.Second))
			}
		}
		fmt.Fprintf(&b, "%s element %s %s %s { %s }\n", verb, t.Spec.Family, t.Spec.Table, op.Set, strings.Join(elems, ", "))
	}
	return b.String()
}

// RefreshTxn is the transaction that gives each of addrs a full timeout in its set (IPv4 or
// IPv6; a v4-mapped address counts as IPv4): add, delete, add, so that an element already there
// gets its timeout back and one that is not (expired, flushed by hand) is made. No ops when addrs
// is empty.
func (sp Spec) RefreshTxn(addrs []netip.Addr, timeout time.Duration) Txn {
	t := Txn{Spec: sp}
	timeout = (timeout + time.Second - 1).Truncate(time.Second)
	for i, fam := range families(addrs) {
		if len(fam) == 0 {
			continue
		}
		set := sp.sets()[i]
		t.Ops = append(t.Ops, Op{Set: set, Addrs: fam, Timeout: timeout}, Op{Delete: true, Set: set, Addrs: fam},
			Op{Set: set, Addrs: fam, Timeout: timeout})
	}
	return t
}

// RemoveTxn is the transaction that takes each of addrs out of its set, whether it is there or
// not: an element is added with a second's timeout first, so that the delete always finds it. No
// ops when addrs is empty.
func (sp Spec) RemoveTxn(addrs []netip.Addr) Txn {
	t := Txn{Spec: sp}
	for i, fam := range families(addrs) {
		if len(fam) == 0 {
			continue
		}
		set := sp.sets()[i]
		t.Ops = append(t.Ops, Op{Set: set, Addrs: fam, Timeout: time.Second}, Op{Delete: true, Set: set, Addrs: fam})
	}
	return t
}

// sets are the IPv4 set's and the IPv6 set's names.
func (sp Spec) sets() [2]string { return [2]string{sp.Set, sp.Set + "6"} }

// families splits addrs into IPv4 (a v4-mapped address counts as IPv4) and IPv6, as the sets
// hold them.
func families(addrs []netip.Addr) [2][]netip.Addr {
	var fam [2][]netip.Addr
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if !a.IsValid() {
			continue
		}
		i := 0
		if a.Is6() {
			i = 1
		}
		fam[i] = append(fam[i], a)
	}
	return fam
}

// Runner reads and changes the sets: Netlink, or a stand-in in tests.
type Runner interface {
	// Check fails unless both of sp's sets exist as sets of addresses with timeouts.
	Check(ctx context.Context, sp Spec) error
	// Apply applies t's ops in one transaction.
	Apply(ctx context.Context, t Txn) error
}
