package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/internal/nbwriter"
	"github.com/storeguard/storeguard/internal/pidfile"
	"github.com/storeguard/storeguard/internal/version"
	"github.com/storeguard/storeguard/keeper"
	"github.com/storeguard/storeguard/proxy"
	"github.com/storeguard/storeguard/upgrade"
)

func newServeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Guard a TCPStore: listen on MASTER_PORT and forward only valid messages upstream",
		Args:  cobra.NoArgs,
	}
	addServeFlags(cmd.Flags())
	pidFile := cmd.Flags().String("pid-file", "", "write the PID of the process that forwards here (an upgrade's new process rewrites it)")
	useKeeper := cmd.Flags().Bool("keeper", false, "run under a keeper: a parent that holds every socket and restarts the forwarding process with them if it dies (docs/design.md, Zero downtime)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		opts := loadOptions(cmd.Flags())
		p, err := config.LoadParsed(opts)
		if err != nil {
			cmd.SilenceUsage = true
			return fmt.Errorf("bad configuration:\n%w", err)
		}
		cmd.SilenceUsage = true
		if *useKeeper && os.Getenv(keeper.Env) == "" {
			return runKeeper(p.Config().Log)
		}
		return serve(cmd.Context(), p, func() (*config.Parsed, error) { return config.LoadParsed(opts) }, opts.Path(), *pidFile)
	}
	return cmd
}

// Audit events and log lines go to their sinks through bounded queues: a sink that stops taking
// them (a stderr pipe nobody reads, a full disk) costs events, counted, never forwarding. An audit
// event is about 700 bytes: the queue holds up to 3 MB.
const (
	auditQueue = 4096
	logQueue   = 1024
	sinkWait   = 2 * time.Second // at exit, for a slow sink to take what is queued
)

func serve(ctx context.Context, p *config.Parsed, load func() (*config.Parsed, error), path, pidFile string) error {
	cfg := p.Config()
	peer, err := inheritedFile(keeper.HandoverEnv) // started by an upgrade: take over instead of listening
	if err != nil {
		return err
	}
	kf, err := inheritedFile(keeper.Env) // run by a keeper (--keeper)
	if err != nil {
		return err
	}
	restore := os.Getenv(keeper.RestoreEnv) != "" // the previous worker died: the keeper has everything
	os.Unsetenv(keeper.RestoreEnv)
	collectLess()
	log, logSink := newLogger(cfg.Log, os.Stderr)
	defer logSink.Close(sinkWait)
	var aw *audit.Writer
	aopts := audit.Options{MaxBytes: cfg.Audit.MaxBytes, MaxBackups: cfg.Audit.MaxBackups,
		SeparateFlows: true, FlowsMaxBytes: cfg.Audit.FlowsMaxBytes, FlowsMaxBackups: cfg.Audit.FlowsMaxBackups,
		SampleFirst: cfg.Audit.SampleFirst, SampleEvery: cfg.Audit.SampleEvery, SampleWindow: cfg.Audit.SampleWindow,
		Observer: observer("proxy", true)}
	if cfg.AuditLog != "" {
		var err error
		if aw, err = audit.Open(cfg.AuditLog, aopts); err != nil {
			return fmt.Errorf("audit-log: %w", err)
		}
	} else {
		aw = audit.New(os.Stderr, aopts)
	}
	events := audit.NewQueue(aw, auditQueue)
	defer func() {
		if err := events.Close(sinkWait); err != nil {
			log.Error("audit log not closed cleanly", "err", err)
		}
	}()

	pids := pidfile.NewWriter(pidFile)
	failed := upgradeFailed(pids, log)
	var ids identity.Source
	if cfg.TLS.On() {
		if ids, err = identitySource(ctx, cfg.TLS, log); err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		defer ids.Close()
	}
	srv, err := proxy.New(p, proxy.Options{Logger: log, Audit: events, LogDropped: logSink.Dropped,
		AuditRotations: aw.Rotations, HoldHeap: true, UpgradeFailed: failed, Identity: ids})
	if err != nil {
		return err
	}
	// An upgrade's USR2 may come before the handler below is set: ignored until then, not fatal.
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	defer signal.Stop(usr2)
	if kf != nil {
		err = srv.UseKeeper(kf)
		kf.Close()
		if err != nil {
			return fmt.Errorf("keeper: %w", err)
		}
	}
	switch {
	case peer != nil:
		err = srv.TakeOver(peer)
		peer.Close()
		if err != nil {
			return fmt.Errorf("upgrade: taking over: %w", err)
		}
	case restore && kf != nil:
		if err := srv.RestoreFromKeeper(); err != nil {
			return fmt.Errorf("keeper: restoring the connections: %w", err)
		}
	default:
		if err := srv.Listen(); err != nil {
			return err
		}
	}
	srv.KeeperListeners(peer != nil)
	if err := writePid(pids, kf != nil); err != nil {
		log.Warn("could not write the pid file", "err", err)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	up := newUpgrader(log)
	go func() {
		for range usr2 {
			if srv.AskUpgrade() { // the keeper starts the new worker
				continue
			}
			if err := up.upgrade(srv); err != nil {
				log.Error("upgrade failed; this process goes on serving", "err", err)
				if !errors.Is(err, upgrade.ErrUnderWay) { // that one's outcome is the one to record
					failed(err)
				}
			}
		}
	}()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go srv.WatchReload(ctx, load, path, hup)
	go aw.FlushEvery(ctx, 5*time.Second) // ends sampling windows on time: suppressed counts get written
	if err := srv.Serve(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// runKeeper runs this command line, without --keeper, as a keeper's worker (package keeper).
func runKeeper(lc config.Log) error {
	log, sink := newLogger(lc, os.Stderr)
	defer sink.Close(sinkWait)
	var args []string
	for _, a := range os.Args[1:] {
		if a != "--keeper" && a != "--keeper=true" {
			args = append(args, a)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	code := keeper.New(exe, args, log).Run()
	if code != 0 {
		return exitError{code: code, err: fmt.Errorf("the worker exited with status %d", code)}
	}
	return nil
}

// newLogger logs to out through a bounded queue (sink); lines it drops are counted and, once out
// takes lines again, said in one line of the same format.
func newLogger(c config.Log, out io.Writer) (log *slog.Logger, sink *nbwriter.Writer) {
	o := &slog.HandlerOptions{Level: c.Level}
	handler := func(w io.Writer) slog.Handler {
		if c.Format == config.LogText {
			return slog.NewTextHandler(w, o)
		}
		return slog.NewJSONHandler(w, o)
	}
	direct := slog.New(handler(out)) // only from the sink's own goroutine
	sink = nbwriter.New(out, logQueue, func(n uint64) {
		direct.Warn("log lines dropped while the log sink stalled", "dropped", n)
	})
	return slog.New(handler(sink)), sink
}

// observer is this storeguard as its audit events name it (observer.*, and host.* when the
// traffic is this host's own).
func observer(kind string, host bool) *audit.Observer {
	name, _ := os.Hostname()
	return &audit.Observer{Hostname: name, Type: kind, Version: version.String(), Host: host}
}
