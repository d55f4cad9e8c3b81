package nftset

import (
	"context"
	"fmt"
	"os"

	"github.com/google/nftables"
)

// Netlink is the Runner that speaks netlink to nf_tables (CAP_NET_ADMIN in the sets' network
// namespace), in NetNS, or the process's own namespace when it is nil.
type Netlink struct{ NetNS *os.File }

var tableFamilies = map[string]nftables.TableFamily{
	"inet": nftables.TableFamilyINet, "ip": nftables.TableFamilyIPv4, "ip6": nftables.TableFamilyIPv6,
	"bridge": nftables.TableFamilyBridge, "netdev": nftables.TableFamilyNetdev,
}

// Open opens a netlink connection to nf_tables in the network namespace ns (nil: the process's
// own); it needs CAP_NET_ADMIN there. Package firewall opens its connections with it too.
func Open(ns *os.File) (*nftables.Conn, error) {
	var opts []nftables.ConnOption
	if ns != nil {
		opts = append(opts, nftables.WithNetNSFd(int(ns.Fd())))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w (nftables needs CAP_NET_ADMIN)", err)
	}
	return c, nil
}

func (n Netlink) open(sp Spec) (*nftables.Conn, *nftables.Table, error) {
	c, err := Open(n.NetNS)
	if err != nil {
		return nil, nil, err
	}
	return c, &nftables.Table{Family: tableFamilies[sp.Family], Name: sp.Table}, nil
}

// Check fails unless both sets exist as sets of addresses with timeouts.
func (n Netlink) Check(ctx context.Context, sp Spec) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, t, err := n.open(sp)
	if err != nil {
		return err
	}
	for i, name := range sp.sets() {
		s, err := c.GetSetByName(t, name)
		if err != nil {
			return fmt.Errorf("set %s %s %s: %w", sp.Family, sp.Table, name, err)
		}
		want := [2]string{"ipv4_addr", "ipv6_addr"}[i]
		if s.KeyType.Name != want || !s.HasTimeout {
			return fmt.Errorf("set %s %s %s: not a set of %s with flags timeout", sp.Family, sp.Table, name, want)
		}
	}
	return nil
}

// Apply sends t's ops in one netlink batch: the kernel applies them all or none.
func (n Netlink) Apply(ctx context.Context, t Txn) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, table, err := n.open(t.Spec)
	if err != nil {
		return err
	}
	sets := map[string]*nftables.Set{}
	for _, op := range t.Ops {
		s := sets[op.Set]
		if s == nil {
			if s, err = c.GetSetByName(table, op.Set); err != nil {
				return fmt.Errorf("set %s %s %s: %w", t.Spec.Family, t.Spec.Table, op.Set, err)
			}
			sets[op.Set] = s
		}
		elems := make([]nftables.SetElement, len(op.Addrs))
		for i, a := range op.Addrs {
			elems[i] = nftables.SetElement{Key: a.AsSlice(), Timeout: op.Timeout}
		}
		if op.Delete {
			err = c.SetDeleteElements(s, elems)
		} else {
			err = c.SetAddElements(s, elems)
		}
		if err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	return nil
}
