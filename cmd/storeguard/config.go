package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/config"
)

// newConfigCommand returns `config`, holding `check` and `default`.
func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Check or print storeguard configuration",
	}
	cmd.AddCommand(newConfigCheckCommand(), newConfigDefaultCommand())
	return cmd
}

// newConfigCheckCommand returns `check FILE`: load FILE over the defaults with
// the STOREGUARD_* environment applied, print the effective configuration, or
// fail listing every problem by key.
func newConfigCheckCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a config file and print the effective configuration",
		Long: "Loads FILE over the built-in defaults, applies STOREGUARD_* environment variables as\n" +
			"serve would, and prints the effective configuration. Every problem is reported by key.",
		Args:         cobra.ExactArgs(1),
		SilenceUsage: true, // a bad config is not a usage mistake
		RunE: func(cmd *cobra.Command, args []string) error {
			env := os.Environ()
			for _, note := range config.EnvNearMisses(env) {
				fmt.Fprintln(cmd.ErrOrStderr(), "note:", note)
			}
			c, err := config.Load(config.Options{File: args[0], Env: env})
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

func newConfigDefaultCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "default",
		Short: "Print the built-in default configuration, every key with a comment",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := cmd.OutOrStdout().Write(config.DefaultYAML())
			return err
		},
	}
}
