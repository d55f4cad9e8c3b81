package nftset

import (
	"net/netip"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	sp, err := Parse(" inet  storeguard_peers peers ")
	if err != nil || sp != (Spec{"inet", "storeguard_peers", "peers"}) {
		t.Fatalf("Parse: %+v, %v", sp, err)
	}
	for _, bad := range []string{"", "inet peers", "inet t s x", "ipx t s", "inet t;flush s", "inet t s}"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) took it", bad)
		}
	}
}

func TestRefreshTxnSplitsFamilies(t *testing.T) {
	sp := Spec{"inet", "t", "p"}
	got := sp.RefreshTxn([]netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("::ffff:10.0.0.3"),
		netip.MustParseAddr("fd00::1")}, 1500*time.Millisecond).String()
	want := "add element inet t p { 10.0.0.2 timeout 2s, 10.0.0.3 timeout 2s }\n" +
		"delete element inet t p { 10.0.0.2, 10.0.0.3 }\n" +
		"add element inet t p { 10.0.0.2 timeout 2s, 10.0.0.3 timeout 2s }\n" +
		"add element inet t p6 { fd00::1 timeout 2s }\n" +
		"delete element inet t p6 { fd00::1 }\n" +
		"add element inet t p6 { fd00::1 timeout 2s }\n"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if txn := sp.RefreshTxn(nil, time.Minute); len(txn.Ops) != 0 {
		t.Fatalf("no addresses: %q", txn)
	}
}

// RemoveTxn takes addresses out of both families' sets, present or not (add with a second's
// timeout, then delete: one transaction that cannot fail on an address that is not there).
func TestRemoveTxn(t *testing.T) {
	sp, err := Parse("inet sg peers")
	if err != nil {
		t.Fatal(err)
	}
	got := sp.RemoveTxn([]netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("::ffff:10.0.0.2"), netip.MustParseAddr("fd00::1")}).String()
	want := "add element inet sg peers { 10.0.0.1 timeout 1s, 10.0.0.2 timeout 1s }\n" +
		"delete element inet sg peers { 10.0.0.1, 10.0.0.2 }\n" +
		"add element inet sg peers6 { fd00::1 timeout 1s }\n" +
		"delete element inet sg peers6 { fd00::1 }\n"
	if got != want {
		t.Errorf("RemoveTxn:\n%s\nwant\n%s", got, want)
	}
	if len(sp.RemoveTxn(nil).Ops) != 0 {
		t.Error("a script for no address")
	}
}
