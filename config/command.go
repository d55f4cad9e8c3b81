package config

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// AddServeFlags registers the flags that override config keys: --config
// (the file) and one flag per top-level key of the same name, plus
// --log-level and --log-format. Defaults shown in help are the built-in
// ones; a flag only overrides the file and env when it is given.
func AddServeFlags(fs *pflag.FlagSet) {
	d := Default()
	level, _ := levelName(d.Log.Level)
	fs.String("config", "", "YAML config file (also $"+envConfig+"); flags override it")
	fs.String("listen", d.Listen, "address clients connect to")
	fs.String("upstream", d.Upstream, "address of the real TCPStore")
	fs.String("metrics-listen", d.MetricsListen, `Prometheus /metrics address; "" disables`)
	fs.String("audit-log", d.AuditLog, `audit JSONL file; "" sends audit events to the log`)
	fs.String("generation", d.Generation, "store generation: auto | G0..G6 | torch release MAJOR.MINOR")
	fs.String("backend", string(d.Backend), "store backend: auto | legacy | libuv")
	fs.String("mode", string(d.Mode), "enforce | monitor")
	fs.Int("event-loops", d.EventLoops, "event loops accepting and forwarding connections: 0 = one per CPU, -1 = none")
	fs.String("log-level", level, "debug | info | warn | error")
	fs.String("log-format", string(d.Log.Format), "json | text")
}

// NewCommand returns `config`, holding `check` and `default`.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Check or print storeguard configuration",
	}
	cmd.AddCommand(NewCheckCommand(), newDefaultCommand())
	return cmd
}

// NewCheckCommand returns `check FILE`: load FILE over the defaults with the
// STOREGUARD_* environment applied, print the effective configuration, or
// fail listing every problem by key.
func NewCheckCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a config file and print the effective configuration",
		Long: "Loads FILE over the built-in defaults, applies STOREGUARD_* environment variables as\n" +
			"serve would, and prints the effective configuration. Every problem is reported by key.",
		Args:         cobra.ExactArgs(1),
		SilenceUsage: true, // a bad config is not a usage mistake
		RunE: func(cmd *cobra.Command, args []string) error {
			env := os.Environ()
			for _, note := range envNearMisses(env) {
				fmt.Fprintln(cmd.ErrOrStderr(), "note:", note)
			}
			c, err := Load(Options{File: args[0], Env: env})
			if err != nil {
				return fmt.Errorf("%s is not valid:\n%w", args[0], err)
			}
			out, err := c.YAML()
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
}

func newDefaultCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "default",
		Short: "Print the built-in default configuration, every key with a comment",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := cmd.OutOrStdout().Write(defaultYAML)
			return err
		},
	}
}
