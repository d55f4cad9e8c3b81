// Command storeguard is a guard proxy for PyTorch's TCPStore.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command line and returns its exit status.
func run(args []string, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:           "storeguard",
		Short:         "A guard proxy for PyTorch's TCPStore (MASTER_PORT)",
		SilenceErrors: true,
		Version:       version.String(),
	}
	root.AddCommand(newServeCommand(), newConnectCommand(), newConfigCommand(), newAuditCommand(), newProbeCommand(), newBenchCommand(), newReplayCommand(), newPolicyCommand(), newIdentifyCommand(),
		newUpgradeCommand(), newInstallCommand(), newFirewallCommand())
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(stderr, "storeguard:", err)
		return exitCode(err)
	}
	return 0
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
