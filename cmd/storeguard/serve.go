package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/proxy"
)

func newServeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Guard a TCPStore: listen on MASTER_PORT and forward only valid messages upstream",
		Args:  cobra.NoArgs,
	}
	addServeFlags(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		opts := loadOptions(cmd.Flags())
		cfg, err := config.Load(opts)
		if err != nil {
			cmd.SilenceUsage = true
			return fmt.Errorf("bad configuration:\n%w", err)
		}
		return serve(cmd.Context(), cfg, func() (config.Config, error) { return config.Load(opts) }, opts.Path())
	}
	return cmd
}

func serve(ctx context.Context, cfg config.Config, load func() (config.Config, error), path string) error {
	log := newLogger(cfg.Log)
	var aw *audit.Writer
	aopts := audit.Options{MaxBytes: cfg.Audit.MaxBytes, MaxBackups: cfg.Audit.MaxBackups,
		SampleFirst: cfg.Audit.SampleFirst, SampleEvery: cfg.Audit.SampleEvery, SampleWindow: cfg.Audit.SampleWindow}
	if cfg.AuditLog != "" {
		var err error
		if aw, err = audit.Open(cfg.AuditLog, aopts); err != nil {
			return fmt.Errorf("audit-log: %w", err)
		}
	} else {
		aw = audit.New(os.Stderr, aopts)
	}
	defer aw.Close()

	srv, err := proxy.New(cfg, proxy.Options{Logger: log, Audit: aw})
	if err != nil {
		return err
	}
	if err := srv.Listen(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
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

func newLogger(c config.Log) *slog.Logger {
	o := &slog.HandlerOptions{Level: c.Level}
	if c.Format == config.LogText {
		return slog.New(slog.NewTextHandler(os.Stderr, o))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, o))
}
