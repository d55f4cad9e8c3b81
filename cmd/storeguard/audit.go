package main

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/audit/report"
	"github.com/storeguard/storeguard/internal/progress"
)

// newAuditCommand returns `audit FILE...`, which reports on audit logs: who, when, with what, and
// whether anything hostile reached the store.
func newAuditCommand() *cobra.Command {
	var (
		since, until, source string
		f                    report.Filter
		format, html         string
		top                  int
		rotated, flows       bool
	)
	cmd := &cobra.Command{
		Use:   "audit FILE...",
		Short: "Report on audit logs (plain or gzip): sources, timeline, probes, rules, and whether anything got through",
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
			paths, err := report.ExpandFiles(args, rotated, flows)
			if err != nil {
				return err
			}
			z := report.NewSummarizer(f)
			bar := progress.New(cmd.ErrOrStderr(), 0)
			for i, path := range paths {
				if err := readLog(z, bar, path, fmt.Sprintf("reading %s (%d of %d)", path, i+1, len(paths))); err != nil {
					bar.Done()
					return err
				}
			}
			bar.Done()
			s := z.Summary().Top(top)
			if html != "" {
				if err := writeHTML(html, s); err != nil {
					return err
				}
			}
			return s.Write(cmd.OutOrStdout(), format)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&since, "since", "", "only events at or after this time (RFC3339, YYYY-MM-DD, or a duration ago such as 24h)")
	fl.StringVar(&until, "until", "", "only events before this time (same forms as --since)")
	fl.StringVar(&source, "source", "", "only sources in this CIDR (or this IP)")
	fl.StringVar(&f.Rule, "rule", "", "only events with this rule id (event.reason)")
	fl.StringVar(&format, "format", "table", "output format: table, json or csv")
	fl.IntVar(&top, "top", 8, "sources listed, hostile first, then most events and connections (0 = all)")
	fl.BoolVar(&rotated, "rotated", true, "also read each FILE's rotated backups (FILE.N, FILE.N.gz)")
	fl.BoolVar(&flows, "flows", true, "also read each FILE's flow records of passed connections, which serve and replay keep apart (FILE.flows)")
	fl.StringVar(&html, "html", "", "also write a self-contained HTML report to this file")
	return cmd
}

// readLog adds the log at path to z, showing its progress on bar (on a terminal only).
func readLog(z *report.Summarizer, bar *progress.Printer, path, label string) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	z.Read(path, linesRead{bar.StartFile(label, file), z, bar})
	return nil
}

// linesRead passes the lines z has read so far to bar before each read.
type linesRead struct {
	r   io.Reader
	z   *report.Summarizer
	bar *progress.Printer
}

func (l linesRead) Read(b []byte) (int, error) {
	l.bar.Items(int64(l.z.Lines()), "events")
	return l.r.Read(b)
}

func writeHTML(path string, s report.Summary) error {
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	if err := s.WriteHTML(out); err != nil {
		out.Close()
		return fmt.Errorf("--html: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	return nil
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
