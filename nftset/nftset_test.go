package nftset

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
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

func TestRefreshScriptSplitsFamilies(t *testing.T) {
	sp := Spec{"inet", "t", "p"}
	got := sp.RefreshScript([]netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("::ffff:10.0.0.3"),
		netip.MustParseAddr("fd00::1")}, 1500*time.Millisecond)
	want := "add element inet t p { 10.0.0.2 timeout 2s, 10.0.0.3 timeout 2s }\n" +
		"delete element inet t p { 10.0.0.2, 10.0.0.3 }\n" +
		"add element inet t p { 10.0.0.2 timeout 2s, 10.0.0.3 timeout 2s }\n" +
		"add element inet t p6 { fd00::1 timeout 2s }\n" +
		"delete element inet t p6 { fd00::1 }\n" +
		"add element inet t p6 { fd00::1 timeout 2s }\n"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if s := sp.RefreshScript(nil, time.Minute); s != "" {
		t.Fatalf("no addresses: %q", s)
	}
}

// TestRefreshAgainstRealNft runs the scripts through nft in a network namespace of its own: the
// sets take the addresses, a refresh gives an element its full timeout back, and an element that
// was not there (expired, or flushed by hand) is made again without failing the transaction.
func TestRefreshAgainstRealNft(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	for _, tool := range []string{"nft", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	ns := fmt.Sprintf("sgnftset%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	in := func(ctx context.Context, stdin string, args ...string) error {
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, "nft"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	ctx := context.Background()
	sp, _ := Parse("inet sgtest peers")
	if err := sp.Check(ctx, in); err == nil {
		t.Fatal("the check passed with no sets")
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(in(ctx, "table inet sgtest {\n\tset peers {\n\t\ttype ipv4_addr\n\t\tflags timeout\n\t}\n"+
		"\tset peers6 {\n\t\ttype ipv6_addr\n\t\tflags timeout\n\t}\n}\n", "-f", "-"))
	must(sp.Check(ctx, in))
	a, b, c := netip.MustParseAddr("10.9.0.2"), netip.MustParseAddr("10.9.0.3"), netip.MustParseAddr("fd00::7")
	must(sp.Refresh(ctx, in, []netip.Addr{a}, 30*time.Second))
	time.Sleep(2100 * time.Millisecond)
	must(sp.Refresh(ctx, in, []netip.Addr{a, b, c}, 30*time.Second))
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "inet", "sgtest").CombinedOutput()
	if err != nil {
		t.Fatal(err, string(out))
	}
	for _, addr := range []netip.Addr{a, b, c} {
		m := regexp.MustCompile(regexp.QuoteMeta(addr.String()) + ` timeout 30s expires (\d+)s`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("%s not in the sets:\n%s", addr, out)
		}
		if string(m[1]) != "29" && string(m[1]) != "30" {
			t.Errorf("%s expires in %ss after its refresh, want its full 30 s back:\n%s", addr, m[1], out)
		}
	}
}

// RemoveScript takes addresses out of both families' sets, present or not (add with a second's
// timeout, then delete: one transaction that cannot fail on an address that is not there).
func TestRemoveScript(t *testing.T) {
	sp, err := Parse("inet sg peers")
	if err != nil {
		t.Fatal(err)
	}
	got := sp.RemoveScript([]netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("::ffff:10.0.0.2"), netip.MustParseAddr("fd00::1")})
	want := "add element inet sg peers { 10.0.0.1 timeout 1s, 10.0.0.2 timeout 1s }\n" +
		"delete element inet sg peers { 10.0.0.1, 10.0.0.2 }\n" +
		"add element inet sg peers6 { fd00::1 timeout 1s }\n" +
		"delete element inet sg peers6 { fd00::1 }\n"
	if got != want {
		t.Errorf("RemoveScript:\n%s\nwant\n%s", got, want)
	}
	if sp.RemoveScript(nil) != "" {
		t.Error("a script for no address")
	}
}
