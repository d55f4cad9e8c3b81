package firewall

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
)

// The rulesets as the kit's files write them, and the defines each test renders them with.
var files = map[string]string{
	"sidecar":  "../configs/nftables/storeguard.nft",
	"explicit": "../configs/explicit/storeguard-explicit.nft",
	"connect":  "../configs/nftables/storeguard-connect.nft",
	"peers":    "../configs/nftables/storeguard-peers.nft",
}

var nsSeq atomic.Int32

// netns makes a network namespace of the test's own (ip netns add) and opens it.
func netns(t *testing.T) (string, Target) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	for _, tool := range []string{"nft", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s to compare with", tool)
		}
	}
	name := fmt.Sprintf("sgfw%d-%d", os.Getpid(), nsSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	f, err := os.Open(filepath.Join("/run/netns", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return name, Target{NetNS: f}
}

// nft runs nft in ns, stdin as its input.
func nft(t *testing.T, ns, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

var counters = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// ruleset is nft's listing of everything in ns, counters zeroed.
func listing(t *testing.T, ns string) string {
	return counters.ReplaceAllString(nft(t, ns, "", "list", "ruleset"), "counter")
}

// render is a kit file with its defines set as its own comments say (sed of "define x = ...").
func render(t *testing.T, name string, defines map[string]string) string {
	t.Helper()
	b, err := os.ReadFile(files[name])
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for k, v := range defines {
		re := regexp.MustCompile(`(?m)^define ` + k + ` = (\{[^}]*\}|\S+)`)
		if !re.MatchString(s) {
			t.Fatalf("%s has no define %s", files[name], k)
		}
		s = re.ReplaceAllString(s, "define "+k+" = "+v)
	}
	return s
}

// The netlink ruleset is the file's: nft lists the same tables, sets, chains and rules (its
// listing reads the kernel's bytecode back, so equal listings are equal rules), for each
// ruleset, with the files' defines and with others.
func TestInstallLoadsWhatTheFileLoads(t *testing.T) {
	other := Defaults()
	other.StorePort, other.ProxyPort, other.PrivatePort = 29600, 29599, 29601
	other.MasterPorts, other.ConnectPort, other.GuardUID, other.GuardMark = []uint16{29400, 29500}, 15006, 1337, 0x77
	other.FreePorts = [2]uint16{40000, 50999}
	file := Defaults()
	file.FreePorts = [2]uint16{32768, 60999}
	cases := []struct {
		name    string
		v       Values
		defines map[string]string
	}{
		{"sidecar", file, nil},
		{"explicit", file, nil},
		{"connect", file, nil},
		{"peers", file, nil},
		{"sidecar", other, map[string]string{"store_port": "29600", "proxy_port": "29599"}},
		{"explicit", other, map[string]string{"private_port": "29601"}},
		{"connect", other, map[string]string{"master_ports": "{ 29500, 29400 }", "connect_port": "15006", "guard_uid": "1337", "guard_mark": "0x77"}},
		{"peers", other, map[string]string{"free_ports": "40000-50999"}},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%v", c.name, c.defines != nil), func(t *testing.T) {
			byFile, _ := netns(t)
			nft(t, byFile, render(t, c.name, c.defines), "-f", "-")
			want := listing(t, byFile)

			byNetlink, tg := netns(t)
			if err := Install(tg, c.name, c.v); err != nil {
				t.Fatal(err)
			}
			if got := listing(t, byNetlink); got != want {
				t.Fatalf("netlink loaded\n%s\nthe file loads\n%s", got, want)
			}
			if err := Install(tg, c.name, c.v); err != nil {
				t.Fatalf("a second install: %v", err)
			}
			if got := listing(t, byNetlink); got != want {
				t.Fatalf("after a second install\n%s\nwant\n%s", got, want)
			}
			// Check takes the file's table for its own, and not the file with other defines.
			fileNS, _ := os.Open(filepath.Join("/run/netns", byFile))
			defer fileNS.Close()
			if _, err := Check(Target{NetNS: fileNS}, c.name, c.v); err != nil {
				t.Fatalf("check of what the file loaded: %v", err)
			}
			if c.defines == nil {
				if _, err := Check(Target{NetNS: fileNS}, c.name, other); err == nil {
					t.Fatal("check passed a table loaded with other ports")
				}
			}
		})
	}
}

// Check finds a rule taken out or a table gone, and Remove removes only its table, twice
// without failing.
func TestCheckAndRemove(t *testing.T) {
	ns, tg := netns(t)
	v := Defaults()
	if _, err := Check(tg, "sidecar", v); err == nil || !strings.Contains(err.Error(), "not loaded") {
		t.Fatalf("check with nothing loaded: %v", err)
	}
	for _, r := range []string{"sidecar", "connect"} {
		if err := Install(tg, r, v); err != nil {
			t.Fatal(err)
		}
		if _, err := Check(tg, r, v); err != nil {
			t.Fatal(err)
		}
	}
	nft(t, ns, "", "flush", "chain", "inet", "storeguard", "input")
	if _, err := Check(tg, "sidecar", v); err == nil || !strings.Contains(err.Error(), "chain input: 0 rules, want 1") {
		t.Fatalf("check after the drop rule was flushed: %v", err)
	}
	nft(t, ns, "", "add", "rule", "inet", "storeguard", "input", "tcp", "dport", "29500", "accept", "comment", `"storeguard: store port is loopback-only"`)
	if _, err := Check(tg, "sidecar", v); err == nil || !strings.Contains(err.Error(), "is not the one storeguard loads") {
		t.Fatalf("check after the drop became an accept: %v", err)
	}
	if err := Remove(tg, "sidecar"); err != nil {
		t.Fatal(err)
	}
	if err := Remove(tg, "sidecar"); err != nil {
		t.Fatalf("a second remove: %v", err)
	}
	if got := listing(t, ns); strings.Contains(got, "table inet storeguard ") || !strings.Contains(got, "table inet storeguard_connect") {
		t.Fatalf("after removing sidecar:\n%s", got)
	}
	if _, err := Check(tg, "connect", v); err != nil {
		t.Fatal(err)
	}
}

// A reinstall of peers keeps the addresses in its sets (the guard's and the operator's), and
// brings back a rule taken out by hand.
func TestPeersReinstallKeepsAddresses(t *testing.T) {
	ns, tg := netns(t)
	v := Defaults()
	if err := Install(tg, "peers", v); err != nil {
		t.Fatal(err)
	}
	nft(t, ns, "add element inet storeguard_peers peers { 10.1.0.2 timeout 5m }\n"+
		"add element inet storeguard_peers static_peers { 192.168.50.0/24 }\n"+
		"add element inet storeguard_peers peers6 { fd00::2 timeout 5m }\n", "-f", "-")
	nft(t, ns, "", "flush", "chain", "inet", "storeguard_peers", "input")
	if err := Install(tg, "peers", v); err != nil {
		t.Fatal(err)
	}
	got := listing(t, ns)
	for _, want := range []string{"10.1.0.2 timeout 5m", "192.168.50.0/24", "fd00::2 timeout 5m"} {
		if !strings.Contains(got, want) {
			t.Errorf("%s left the sets on a reinstall:\n%s", want, got)
		}
	}
	if _, err := Check(tg, "peers", v); err != nil {
		t.Fatal(err)
	}
}

func TestValuesName(t *testing.T) {
	v := Defaults()
	v.ProxyPort = v.StorePort
	if err := v.Validate("sidecar"); err == nil || !strings.HasPrefix(err.Error(), "proxy-port:") {
		t.Errorf("proxy port = store port: %v", err)
	}
	if err := Defaults().Validate("nat"); err == nil || !strings.Contains(err.Error(), "sidecar, explicit, connect, peers") {
		t.Errorf("unknown ruleset: %v", err)
	}
	for in, want := range map[string]string{"29500": "[29500]", "29500,29400,29500": "[29400 29500]", "32768-60999": "[32768 60999]"} {
		got, err := ParsePorts(in)
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("ParsePorts(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "70000", "600-500", "29500,x"} {
		if _, err := ParsePorts(bad); err == nil {
			t.Errorf("ParsePorts(%q) passed", bad)
		}
	}
}
