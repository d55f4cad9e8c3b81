package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/bench"
	"github.com/storeguard/storeguard/protocol"
)

func newBenchCommand() *cobra.Command {
	var (
		cfg    bench.Config
		op     string
		gen    string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Closed-loop TCPStore load generator (any generation), for a store or a proxy in front of it",
		Long: "Runs one workload against ADDR and reports ops/s, latency percentiles and errors.\n" +
			"SET and MULTI_SET have no reply: each is written with a GETNUMKEYS and timed until its reply.\n" +
			"Ops: " + opNames() + ".",
		Args: cobra.NoArgs,
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "addr", "127.0.0.1:29500", "store or proxy address")
	f.IntVar(&cfg.Conns, "conns", 1, "concurrent connections (clients)")
	f.DurationVar(&cfg.Duration, "duration", 5*time.Second, "measured run time (rendezvous runs once)")
	f.DurationVar(&cfg.Warmup, "warmup", 0, "closed-loop ops: unmeasured run time before measuring")
	f.StringVar(&op, "op", "get", "workload: "+opNames())
	f.StringVar(&gen, "generation", "G3", "protocol generation the clients speak: G0..G6 or a torch release MAJOR.MINOR")
	f.IntVar(&cfg.ValueSize, "value-size", 64, "bytes per value")
	f.IntVar(&cfg.Keys, "keys", 1000, "distinct keys the closed-loop ops cycle through")
	f.IntVar(&cfg.Batch, "batch", 8, "keys per check, multi_get and multi_set")
	f.IntVar(&cfg.DialConc, "dial-concurrency", 256, "connections dialed at once")
	f.IntVar(&cfg.PerHost, "per-host", 0, "clients per loopback source address (127.10.0.1, 127.10.0.2, ...); 0: the system's")
	f.DurationVar(&cfg.DialTimout, "dial-timeout", 30*time.Second, "per connection, retries included")
	f.DurationVar(&cfg.Timeout, "timeout", 2*time.Minute, "per request; rendezvous: the whole rendezvous")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.IntSliceVar(&cfg.WatchPIDs, "watch-pid", nil,
		"report this process's CPU time over the measured interval, with the machine's (repeatable; Linux)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cmd.SilenceUsage = true
		g, err := protocol.ParseGeneration(gen)
		if err != nil {
			return err
		}
		if g.Auto {
			return fmt.Errorf("--generation: the bench speaks one generation; give G0..%s or a release", protocol.LatestGeneration)
		}
		cfg.Gen, cfg.Op = g.Gen, bench.Op(op)
		cfg.OnReady = func(n int) { fmt.Fprintf(cmd.ErrOrStderr(), "ready %d connections\n", n) }
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		res, runErr := bench.Run(ctx, cfg)
		if res != nil {
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(res); err != nil {
					return err
				}
			} else {
				printResult(cmd, res)
			}
		}
		return runErr
	}
	cmd.AddCommand(newFakeStoreCommand())
	return cmd
}

func opNames() string {
	var s []string
	for _, o := range bench.Ops() {
		s = append(s, string(o))
	}
	return strings.Join(s, ", ")
}

func printResult(cmd *cobra.Command, r *bench.Result) {
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "%s %s x%d -> %s: %d ops in %.2fs = %.0f ops/s, %d errors\n",
		r.Op, r.Generation, r.Conns, r.Addr, r.Ops, r.DurationS, r.OpsPerSec, r.Errors)
	l := r.Latency
	fmt.Fprintf(w, "latency us: p50 %.1f  p90 %.1f  p99 %.1f  p999 %.1f  mean %.1f  max %.1f\n",
		l.P50, l.P90, l.P99, l.P999, l.Mean, l.Max)
	c := r.Connect
	fmt.Fprintf(w, "connect: %d ok, %d failed, %d retries, %.2fs; p50 %.0f us p99 %.0f us\n",
		c.OK, c.Failed, c.Retries, c.Seconds, c.Latency.P50, c.Latency.P99)
	if rv := r.Rendezvous; rv != nil {
		fmt.Fprintf(w, "rendezvous: %d/%d clients released in %.3fs\n", rv.Completed, rv.Clients, rv.TotalS)
	}
	if c := r.CPU; c != nil {
		fmt.Fprintf(w, "cpu: cores busy %.2fs of %d x %.2fs", c.CoresBusyS, c.Cores, r.DurationS)
		for _, p := range c.Processes {
			fmt.Fprintf(w, "; %s[%d] %.2fs", p.Name, p.PID, p.CPUS)
		}
		fmt.Fprintln(w)
	}
	for _, e := range r.ErrorSamples {
		fmt.Fprintln(w, "error:", e)
	}
}

func newFakeStoreCommand() *cobra.Command {
	var listen, gen string
	cmd := &cobra.Command{
		Use:   "fake-store",
		Short: "Serve a small in-memory TCPStore (tests, connection sink for memory measurements)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SilenceUsage = true
			g, err := protocol.ParseGeneration(gen)
			if err != nil || g.Auto {
				return fmt.Errorf("--generation: want G0..%s or a release", protocol.LatestGeneration)
			}
			limit, _ := bench.RaiseFileLimit(1 << 20)
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			s := bench.NewFakeStore(ln, g.Gen)
			fmt.Fprintf(cmd.OutOrStdout(), "fake store %s on %s (file limit %d)\n", g.Gen, s.Addr(), limit)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			return s.Close()
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "address to listen on")
	cmd.Flags().StringVar(&gen, "generation", "G3", "generation to serve")
	return cmd
}
