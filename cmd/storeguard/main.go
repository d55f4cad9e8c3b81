// Command storeguard is a guard proxy for PyTorch's TCPStore.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/proxy"
)

func main() {
	root := &cobra.Command{
		Use:           "storeguard",
		Short:         "A guard proxy for PyTorch's TCPStore (MASTER_PORT)",
		SilenceErrors: true,
		Version:       proxy.Version(),
	}
	root.AddCommand(newServeCommand(), config.NewCommand(), audit.NewCommand(), newProbeCommand(), newBenchCommand(), newReplayCommand())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "storeguard:", err)
		os.Exit(exitCode(err))
	}
}

// exitCoder lets a command choose its exit status (replay, probe: 1 = violations found or
// exposed, 2 = error).
type exitCoder interface{ ExitCode() int }

// exitError carries a command's exit status to main.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }
func (e exitError) ExitCode() int { return e.code }

func exitCode(err error) int {
	if ec, ok := err.(exitCoder); ok {
		return ec.ExitCode()
	}
	return 2
}
