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

// exitCoder lets a command choose its exit status (replay: 1 = violations found, 2 = error).
type exitCoder interface{ ExitCode() int }

func exitCode(err error) int {
	if ec, ok := err.(exitCoder); ok {
		return ec.ExitCode()
	}
	return 2
}
