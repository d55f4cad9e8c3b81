package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// storeguard install PATH: this binary, copied to PATH whole (a temporary file renamed over it), so
// that a running storeguard started from PATH upgrades to it (the Kubernetes sidecar's init
// container, and an upgrade's ephemeral container, use it: their images have no shell).
func newInstallCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "install PATH",
		Short: "Copy this storeguard binary to PATH, replacing what is there whole (for an upgrade in place)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.SilenceUsage = true
			if err := installSelf(args[0]); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "installed", args[0])
			return nil
		},
	}
}

// storeguard upgrade: the upgrade in place, step by step for an operator: optionally install this
// binary, send SIGUSR2, and wait for the pid file to name the new process.
func newUpgradeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Upgrade a running storeguard in place: its connections move to the new process (SIGUSR2)",
		Long: `Sends SIGUSR2 to a running storeguard (serve, or its keeper), which starts the binary at the path it
was started from; the new process takes the listening sockets and every connection over, and the old one
exits. With --install, this binary is first copied to that path. With --pid-file (serve's own), it waits
until the file names a new process that runs: exit status 0 means the new process serves; otherwise the
old one goes on serving and its log says why.`,
		Args: cobra.NoArgs,
	}
	pidFile := cmd.Flags().String("pid-file", "", "serve's --pid-file: the process to upgrade, and where the new one is seen")
	pid := cmd.Flags().Int("pid", 0, "the process to signal (a keeper's, or serve's) instead of the pid file's")
	install := cmd.Flags().String("install", "", "first copy this binary to PATH (the running storeguard's own path)")
	timeout := cmd.Flags().Duration("timeout", 90*time.Second, "how long to wait for the new process")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cmd.SilenceUsage = true
		if *pidFile == "" && *pid == 0 {
			return errors.New("--pid-file or --pid is required")
		}
		old := 0
		if *pidFile != "" {
			p, err := readPid(*pidFile)
			if err != nil {
				return err
			}
			old = p
		}
		target := *pid
		if target == 0 {
			target = old
		}
		if *install != "" {
			if err := installSelf(*install); err != nil {
				return err
			}
		}
		if err := syscall.Kill(target, syscall.SIGUSR2); err != nil {
			return fmt.Errorf("signalling pid %d: %w", target, err)
		}
		out := cmd.OutOrStdout()
		if *pidFile == "" {
			fmt.Fprintf(out, "sent SIGUSR2 to pid %d; its log says when the new process took over\n", target)
			return nil
		}
		for end := time.Now().Add(*timeout); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			p, err := readPid(*pidFile)
			if err == nil && p != old && syscall.Kill(p, 0) == nil {
				fmt.Fprintf(out, "upgraded: pid %d took over from pid %d\n", p, old)
				return nil
			}
		}
		return fmt.Errorf("no new process in %s: pid %d goes on serving (see its log)", *timeout, old)
	}
	return cmd
}

func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("pid-file: %w", err)
	}
	p, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || p <= 0 {
		return 0, fmt.Errorf("pid-file %s: %q is not a pid", path, strings.TrimSpace(string(b)))
	}
	return p, nil
}

// installSelf copies this process's binary to path: a temporary file beside it, renamed over it, so
// that a process starting path sees the old binary or the new one, never half of one.
func installSelf(path string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	src, err := os.Open(self)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	err = replaceFile(path, func(f *os.File) error {
		if _, err := io.Copy(f, src); err != nil {
			return err
		}
		return f.Chmod(0o755)
	})
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	return nil
}
