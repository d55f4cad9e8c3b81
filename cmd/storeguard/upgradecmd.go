package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/internal/atomicfile"
	"github.com/storeguard/storeguard/internal/pidfile"
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

// storeguard upgrade: the upgrade in place, step by step for an operator: check that the pid file
// names the storeguard that wrote it, optionally install this binary, send SIGUSR2, and wait for
// the outcome: the pid file naming the new process, or the old one's record saying why it failed.
func newUpgradeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Upgrade a running storeguard in place: its connections move to the new process (SIGUSR2)",
		Long: `Sends SIGUSR2 to a running storeguard (serve, or its keeper), which starts the binary at the path it
was started from; the new process takes the listening sockets and every connection over, and the old one
exits. With --install, this binary is first copied to that path.

With --pid-file (serve's own), the process is signalled only if it is the storeguard that wrote the file
(or its keeper): the record beside it (PIDFILE.json) names its executable and start time, so a stale pid
file whose PID another process has taken is refused. It then waits: exit status 0 when the pid file names
the new process; 1, with the reason, as soon as the old process records that the upgrade failed (it goes
on serving). With --pid alone the process is signalled unchecked and nothing is awaited.`,
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
		out := cmd.OutOrStdout()
		if *pidFile == "" {
			if err := installAndSignal(*install, *pid); err != nil {
				return err
			}
			fmt.Fprintf(out, "sent SIGUSR2 to pid %d; its log says when the new process took over\n", *pid)
			return nil
		}
		old, err := pidfile.ReadPID(*pidFile)
		if err != nil {
			return err
		}
		target := cmp.Or(*pid, old)
		if err := pidfile.Check(*pidFile, target); err != nil {
			return fmt.Errorf("not signalling pid %d: %w", target, err)
		}
		failed := 0
		if rec, _ := pidfile.ReadRecord(*pidFile); rec != nil && rec.PID == old {
			failed = rec.UpgradesFailed
		}
		if err := installAndSignal(*install, target); err != nil {
			return err
		}
		return awaitUpgrade(out, *pidFile, old, failed, *timeout)
	}
	return cmd
}

func installAndSignal(install string, pid int) error {
	if install != "" {
		if err := installSelf(install); err != nil {
			return err
		}
	}
	if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
		return fmt.Errorf("signalling pid %d: %w", pid, err)
	}
	return nil
}

// awaitUpgrade waits until the pid file at path names a process other than old that runs (nil),
// or old's record counts more than failed failed upgrades (the reason it recorded).
func awaitUpgrade(out io.Writer, path string, old, failed int, timeout time.Duration) error {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if p, err := pidfile.ReadPID(path); err == nil && p != old && syscall.Kill(p, 0) == nil {
			fmt.Fprintf(out, "upgraded: pid %d took over from pid %d\n", p, old)
			return nil
		}
		if rec, _ := pidfile.ReadRecord(path); rec != nil && rec.PID == old && rec.UpgradesFailed > failed {
			return fmt.Errorf("upgrade failed; pid %d goes on serving: %s", old, rec.Failure)
		}
	}
	return fmt.Errorf("no new process in %s: pid %d goes on serving (see its log)", timeout, old)
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
	err = atomicfile.Write(path, func(f *os.File) error {
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
