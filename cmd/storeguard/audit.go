package main

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/audit"
)

// newAuditCommand returns `audit FILE...`, which summarizes audit logs.
func newAuditCommand() *cobra.Command {
	var (
		since, until, source string
		f                    audit.Filter
		format               string
		top                  int
		rotated              bool
	)
	cmd := &cobra.Command{
		Use:   "audit FILE...",
		Short: "Summarize blocked probes from audit logs (plain or gzip)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			now := time.Now()
			var err error
			if f.Since, err = parseTime(since, now); err != nil {
				return fmt.Errorf("--since: %w", err)
			}
			if f.Until, err = parseTime(until, now); err != nil {
				return fmt.Errorf("--until: %w", err)
			}
			if f.Source, err = parseSource(source); err != nil {
				return fmt.Errorf("--source: %w", err)
			}
			if !slices.Contains([]string{"table", "json", "csv"}, format) {
				return fmt.Errorf("--format: want table, json or csv, got %q", format)
			}
			paths, err := audit.ExpandFiles(args, rotated)
			if err != nil {
				return err
			}
			s, err := audit.Summarize(paths, f)
			if err != nil {
				return err
			}
			return s.Top(top).Write(cmd.OutOrStdout(), format)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&since, "since", "", "only events at or after this time (RFC3339, YYYY-MM-DD, or a duration ago such as 24h)")
	fl.StringVar(&until, "until", "", "only events before this time (same forms as --since)")
	fl.StringVar(&source, "source", "", "only sources in this CIDR (or this IP)")
	fl.StringVar(&f.Rule, "rule", "", "only events with this rule id (event.reason)")
	fl.StringVar(&format, "format", "table", "output format: table, json or csv")
	fl.IntVar(&top, "top", 20, "sources listed, most events first (0 = all)")
	fl.BoolVar(&rotated, "rotated", true, "also read each FILE's rotated backups (FILE.N, FILE.N.gz)")
	return cmd
}

// parseTime reads --since and --until: RFC3339, a date, or a duration before
// now; "" is no bound.
func parseTime(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is not RFC3339, YYYY-MM-DD or a duration", s)
}

// parseSource reads --source: a CIDR, or one address; "" is every source.
func parseSource(s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, nil
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		ip = ip.Unmap()
		return netip.PrefixFrom(ip, ip.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	return p.Masked(), err
}
