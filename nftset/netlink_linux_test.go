package nftset_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/storeguard/storeguard/firewall"
	"github.com/storeguard/storeguard/nftset"
)

// TestNetlinkKeepsTheSets runs the transactions by netlink in a network namespace of its own,
// with no nft binary: the check fails without the sets and passes once `storeguard firewall
// install peers` made them; the sets take the addresses; a refresh gives an element its full
// timeout back; an element that was not there (expired, or flushed) is made again without failing
// the transaction; a removal takes an address out whether it was there or not.
func TestNetlinkKeepsTheSets(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip")
	}
	ns := fmt.Sprintf("sgnftset%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	nl := nftset.Netlink{NetNS: f}
	ctx := context.Background()
	sp, _ := nftset.Parse("inet storeguard_peers peers")
	if err := sp.Check(ctx, nl); err == nil {
		t.Fatal("the check passed with no sets")
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(firewall.Install(firewall.Target{NetNS: f}, "peers", firewall.Defaults()))
	must(sp.Check(ctx, nl))
	other, _ := nftset.Parse("inet storeguard_peers static_peers") // an interval set, with no timeouts
	if err := other.Check(ctx, nl); err == nil {
		t.Fatal("the check took sets without timeouts")
	}
	a, b, c := netip.MustParseAddr("10.9.0.2"), netip.MustParseAddr("::ffff:10.9.0.3"), netip.MustParseAddr("fd00::7")
	must(sp.Refresh(ctx, nl, []netip.Addr{a}, 30*time.Second))
	time.Sleep(5 * time.Second) // unrenewed, a would have 25 s left; renewed, 30 s less the time to read it back
	must(sp.Refresh(ctx, nl, []netip.Addr{a, b, c}, 30*time.Second))
	got := elements(t, f, sp)
	for _, addr := range []netip.Addr{a, b.Unmap(), c} {
		left, ok := got[addr]
		if !ok {
			t.Fatalf("%s not in the sets: %v", addr, got)
		}
		if left <= 25*time.Second || left > 30*time.Second {
			t.Errorf("%s expires in %v after its refresh, want its full 30 s back", addr, left)
		}
	}
	must(sp.Remove(ctx, nl, []netip.Addr{a, c, netip.MustParseAddr("10.9.0.99")}))
	got = elements(t, f, sp)
	if _, ok := got[b.Unmap()]; len(got) != 1 || !ok {
		t.Fatalf("after removing 10.9.0.2, fd00::7 and an address never there: %v, want only 10.9.0.3", got)
	}
}

// elements reads both sets by netlink: each address and the time it has left.
func elements(t *testing.T, ns *os.File, sp nftset.Spec) map[netip.Addr]time.Duration {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]time.Duration{}
	for _, name := range []string{sp.Set, sp.Set + "6"} {
		s, err := c.GetSetByName(&nftables.Table{Family: nftables.TableFamilyINet, Name: sp.Table}, name)
		if err != nil {
			t.Fatal(err)
		}
		els, err := c.GetSetElements(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range els {
			a, _ := netip.AddrFromSlice(e.Key)
			out[a] = e.Expires
		}
	}
	return out
}
