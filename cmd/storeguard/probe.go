package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/probe"
)

func newProbeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "probe --target HOST:PORT --generation G",
		Short: "Check that a deployment blocks hostile TCPStore messages (exit 1 if any gets through)",
		Long: "Sends one hostile message per connection and reports whether each was blocked (closed\n" +
			"without an answer) or exposed. Oversize lengths are one over the configured ceilings (auto\n" +
			"ones: a legacy store's, the higher), so an unguarded store wastes megabytes at most, not the\n" +
			"host; --real-106294 sends the real 962 GB probe.",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
	}
	fs := cmd.Flags()
	target := fs.String("target", "", "address to probe (required)")
	fs.String("config", "", "config file whose limits set the oversize lengths")
	fs.String("generation", "", "the store's generation: G0..G6 or a torch release such as 2.6 (required)")
	asJSON := fs.Bool("json", false, "one JSON object per case")
	real := fs.Bool("real-106294", false, "send the real #106294 bytes (a 962 GB key length): only against a guarded store")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for each verdict")
	cmd.MarkFlagRequired("target")
	cmd.MarkFlagRequired("generation")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := config.Load(loadOptions(fs))
		if err != nil {
			return err
		}
		dec, err := cfg.Decoder()
		if err != nil {
			return err
		}
		if dec.Gen.Auto {
			return errors.New("--generation: probe needs the store's generation (a torch release such as 2.6), not auto")
		}
		res, err := probe.Run(*target, probe.Options{Gen: dec.Gen.Gen, Limits: cfg.LoosestLimits(), Real106294: *real, Timeout: *timeout})
		out := cmd.OutOrStdout()
		exposed := 0
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		if !*asJSON {
			fmt.Fprintln(tw, "CASE\tVERDICT\tDETAIL")
		}
		for _, r := range res {
			if r.Verdict == probe.Exposed {
				exposed++
			}
			if *asJSON {
				b, _ := json.Marshal(r)
				fmt.Fprintln(out, string(b))
			} else {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Case, r.Verdict, r.Detail)
			}
		}
		tw.Flush()
		if err != nil {
			return exitError{2, err}
		}
		if exposed > 0 {
			return exitError{1, fmt.Errorf("%d of %d hostile messages got through to %s", exposed, len(res), *target)}
		}
		return nil
	}
	return cmd
}
