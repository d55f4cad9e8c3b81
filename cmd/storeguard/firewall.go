package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/firewall"
)

// newFirewallCommand returns `firewall install|check|remove RULESET`: the kit's nftables rulesets
// (configs/nftables, configs/explicit), loaded by netlink with no nft binary.
func newFirewallCommand() *cobra.Command {
	d := firewall.Defaults()
	var masterPorts, freePorts, mark string
	v := d
	cmd := &cobra.Command{
		Use:   "firewall",
		Short: "Install, check or remove storeguard's nftables rules (by netlink; no nft binary): " + strings.Join(firewall.Rulesets, ", "),
		Long: `Install, check or remove one of storeguard's nftables rulesets, rule for rule the kit's files
(configs/nftables/storeguard.nft, storeguard-connect.nft, storeguard-peers.nft and
configs/explicit/storeguard-explicit.nft), in the network namespace it runs in. It needs CAP_NET_ADMIN.

  sidecar   table inet storeguard: other hosts' connections to --store-port go to the guard on --proxy-port;
            what bypassed the redirect is dropped (the transparent master)
  explicit  table inet storeguard: --private-port, the store's own, is loopback-only
  connect   table inet storeguard_connect: a worker's connections to --master-ports go to storeguard
            connect on --connect-port, but for --guard-uid's and --guard-mark's own
  peers     table inet storeguard_peers: this host's --free-ports are dropped for every host not in the
            sets serve keeps (tls.peer-set "inet storeguard_peers peers"); a reinstall keeps their addresses

install replaces the table in one transaction (peers: only its chain's rules); check fails, naming
what differs, unless the loaded table is what install loads; remove deletes the table.`,
	}
	parse := func() error {
		var err error
		if v.MasterPorts, err = firewall.ParsePorts(masterPorts); err != nil {
			return fmt.Errorf("--master-ports: %w", err)
		}
		r, err := firewall.ParsePorts(freePorts)
		if err == nil && len(r) != 2 {
			err = fmt.Errorf("want a range, such as 32768-60999")
		}
		if err != nil {
			return fmt.Errorf("--free-ports: %w", err)
		}
		v.FreePorts = [2]uint16{r[0], r[1]}
		m, err := strconv.ParseUint(mark, 0, 32)
		if err != nil {
			return fmt.Errorf("--guard-mark: %q is not a 32-bit mark", mark)
		}
		v.GuardMark = uint32(m)
		return nil
	}
	f := cmd.PersistentFlags()
	f.Uint16Var(&v.StorePort, "store-port", d.StorePort, "sidecar: MASTER_PORT, where the real store listens")
	f.Uint16Var(&v.ProxyPort, "proxy-port", d.ProxyPort, "sidecar: where storeguard serve listens")
	f.Uint16Var(&v.PrivatePort, "private-port", d.PrivatePort, "explicit: the store's private port")
	f.StringVar(&masterPorts, "master-ports", "29500", "connect: the master's store ports (MASTER_PORT, and the c10d rendezvous port if it differs), comma-separated")
	f.Uint16Var(&v.ConnectPort, "connect-port", d.ConnectPort, "connect: where storeguard connect --transparent listens")
	f.Uint32Var(&v.GuardUID, "guard-uid", d.GuardUID, "connect: the uid storeguard connect runs as (its connections are not redirected)")
	f.StringVar(&mark, "guard-mark", fmt.Sprintf("%#x", d.GuardMark), "connect: storeguard connect --mark (its connections are not redirected)")
	f.StringVar(&freePorts, "free-ports", fmt.Sprintf("%d-%d", d.FreePorts[0], d.FreePorts[1]), "peers: this host's ephemeral ports (default: net.ipv4.ip_local_port_range)")

	verb := func(use, short string, run func(cmd *cobra.Command, name string) error) *cobra.Command {
		return &cobra.Command{
			Use: use + " RULESET", Short: short, Args: cobra.ExactArgs(1), ValidArgs: firewall.Rulesets,
			RunE: func(cmd *cobra.Command, args []string) error {
				cmd.SilenceUsage = true
				if err := parse(); err != nil {
					return err
				}
				if err := run(cmd, args[0]); err != nil {
					return err
				}
				table, _ := firewall.Table(args[0])
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s: table inet %s\n", use, args[0], table)
				return nil
			},
		}
	}
	cmd.AddCommand(
		verb("install", "Load the ruleset in one transaction (idempotent)", func(_ *cobra.Command, n string) error {
			return firewall.Install(firewall.Target{}, n, v)
		}),
		verb("check", "Fail unless the loaded table is what install loads; print what its rules counted", func(cmd *cobra.Command, n string) error {
			counts, err := firewall.Check(firewall.Target{}, n, v)
			for _, c := range counts {
				fmt.Fprintf(cmd.OutOrStdout(), "  chain %s: %d packets, %d bytes: %s\n", c.Chain, c.Packets, c.Bytes, c.Comment)
			}
			return err
		}),
		verb("remove", "Delete the ruleset's table (nothing when there is none)", func(_ *cobra.Command, n string) error {
			return firewall.Remove(firewall.Target{}, n)
		}),
	)
	return cmd
}
