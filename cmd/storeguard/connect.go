package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/connect"
	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/internal/pidfile"
	"github.com/storeguard/storeguard/keeper"
)

func newConnectCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "connect",
		Short: "Client guard: carry this host's ranks' store connections to the master's guard over mutual TLS",
		Long: `connect takes the ranks' plaintext connections to MASTER_ADDR:MASTER_PORT (on --listen, or
transparently: an OUTPUT rule redirects them here, configs/nftables/storeguard-connect.nft) and carries
each to the master's storeguard serve (tls.mode on) over mutual TLS 1.3. torch, torchrun and their
environment stay unchanged.`,
		Args: cobra.NoArgs,
	}
	fs := cmd.Flags()
	listen := fs.String("listen", "127.0.0.1:15001", "where the ranks' connections arrive")
	server := fs.String("server", "", "the master guard's address; with --transparent and none, where each rank was connecting")
	transparent := fs.Bool("transparent", false, "take connections an OUTPUT rule redirected (SO_ORIGINAL_DST)")
	mark := fs.String("mark", "0", "SO_MARK on connections to the master, which the redirect rule skips (0x5347 in configs/; needs CAP_NET_ADMIN); 0 = none")
	fs.Int("master-port", 29500, "MASTER_PORT the redirect rule catches (informational: the rule decides)")
	metrics := fs.String("metrics-listen", "", `Prometheus /metrics and /healthz address; "" disables`)
	handshake := fs.Duration("tls-handshake-timeout", 5*time.Second, "a handshake with the master's guard must complete within this")
	drain := fs.Duration("drain", 10*time.Second, "at SIGTERM, how long relays under way may take to end")
	pidFile := fs.String("pid-file", "", "write this process's PID here")
	logLevel := fs.String("log-level", "info", "debug | info | warn | error")
	logFormat := fs.String("log-format", "json", "json | text")
	useKeeper := fs.Bool("keeper", false, "run under a keeper: a parent that holds every relay's sockets and state and restarts the forwarding process with them if it dies (docs/design.md, Zero downtime)")
	addTLSFlags(fs)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cmd.SilenceUsage = true
		lc, err := logConfig(*logLevel, *logFormat)
		if err != nil {
			return err
		}
		if *useKeeper && os.Getenv(keeper.Env) == "" {
			return runKeeper(lc)
		}
		collectLess()
		kf, err := inheritedFile(keeper.Env) // run by a keeper (--keeper)
		if err != nil {
			return err
		}
		restore := os.Getenv(keeper.RestoreEnv) != "" // the previous process died: the keeper has everything
		os.Unsetenv(keeper.RestoreEnv)
		log, sink := newLogger(lc, os.Stderr)
		defer sink.Close(sinkWait)
		m, err := connect.ParseMark(*mark)
		if err != nil {
			return fmt.Errorf("--mark: %w", err)
		}
		t := config.TLS{Mode: "on", CertFile: flagString(cmd, "tls-cert"), KeyFile: flagString(cmd, "tls-key"),
			CAFile: flagString(cmd, "tls-ca"), SPIFFESocket: flagString(cmd, "tls-spiffe-socket")}
		allowList, _ := fs.GetStringSlice("tls-allow")
		allow, err := identity.ParseAllow(allowList)
		if err != nil {
			return fmt.Errorf("--tls-allow: %w", err)
		}
		groupList, _ := fs.GetStringSlice("tls-key-exchange")
		groups, err := identity.ParseGroups(groupList)
		if err != nil {
			return fmt.Errorf("--tls-key-exchange: %w", err)
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
		defer stop()
		ids, err := identitySource(ctx, t, log)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		if ids == nil {
			return fmt.Errorf("connect needs an identity: --tls-cert, --tls-key and --tls-ca, or --tls-spiffe-socket")
		}
		defer ids.Close()
		opt := connect.Options{Listen: *listen, Server: *server, Transparent: *transparent, Mark: m,
			Identity: ids, Allow: allow, KeyExchange: groups, Resumption: flagBool(cmd, "tls-resumption"),
			HandshakeTimeout: *handshake, Log: log}
		peer, err := inheritedFile(keeper.HandoverEnv) // started by an upgrade: take over instead of listening
		if err != nil {
			return err
		}
		pids := pidfile.NewWriter(*pidFile)
		failed := upgradeFailed(pids, log)
		if kf != nil {
			opt.Keeper, err = keeper.Dial(kf, log)
			kf.Close()
			if err != nil {
				return fmt.Errorf("keeper: %w", err)
			}
		}
		var c *connect.Client
		switch {
		case peer != nil:
			c, err = connect.TakeOver(opt, peer)
			peer.Close()
		case restore && opt.Keeper != nil:
			c, err = connect.Restore(opt)
		default:
			c, err = connect.New(opt)
		}
		if err != nil {
			return err
		}
		if err := c.KeeperListeners(peer != nil, failed); err != nil {
			return fmt.Errorf("keeper: %w", err)
		}
		usr2 := make(chan os.Signal, 1)
		signal.Notify(usr2, syscall.SIGUSR2)
		defer signal.Stop(usr2)
		up := newUpgrader(log)
		var upgrading sync.Mutex // held by an upgrade: one that handed over logs its end before the log closes
		go func() {
			for range usr2 {
				if c.AskUpgrade() { // the keeper starts the new process
					continue
				}
				upgrading.Lock()
				if err := up.upgrade(c); err != nil {
					log.Error("upgrade failed; this process goes on", "err", err)
				}
				upgrading.Unlock()
			}
		}()
		defer upgrading.Lock()
		if *metrics != "" {
			if err := serveConnectMetrics(ctx, *metrics, c, peer != nil); err != nil {
				return fmt.Errorf("metrics-listen: %w", err)
			}
		}
		if err := writePid(pids, opt.Keeper != nil); err != nil {
			return fmt.Errorf("pid-file: %w", err)
		}
		log.Info("storeguard connect listening", "listen", c.Addr().String(), "server", *server,
			"transparent", *transparent, "allow", allow.String())
		return c.Serve(ctx, *drain)
	}
	return cmd
}

func flagString(cmd *cobra.Command, name string) string {
	v, _ := cmd.Flags().GetString(name)
	return v
}

func flagBool(cmd *cobra.Command, name string) bool {
	v, _ := cmd.Flags().GetBool(name)
	return v
}

// logConfig is a log section from connect's flags.
func logConfig(level, format string) (config.Log, error) {
	c := config.Default().Log
	if err := c.Level.UnmarshalText([]byte(level)); err != nil {
		return c, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	switch config.LogFormat(format) {
	case config.LogJSON, config.LogText:
		c.Format = config.LogFormat(format)
	default:
		return c, fmt.Errorf("--log-format %q: want json or text", format)
	}
	return c, nil
}

// serveConnectMetrics serves /metrics and /healthz for a client guard.
// After an upgrade the previous process holds the address until it exits: the listener is then
// retried for a while.
func serveConnectMetrics(ctx context.Context, addr string, c *connect.Client, takeOver bool) error {
	reg := prometheus.NewRegistry()
	counter := func(name, help string, f func() uint64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "storeguard", Subsystem: "connect",
			Name: name, Help: help}, func() float64 { return float64(f()) }))
	}
	counter("accepted_total", "Ranks' connections accepted.", c.Stats.Accepted.Load)
	counter("relayed_total", "Connections carried to the master's guard over mutual TLS.", c.Stats.Relayed.Load)
	counter("resumed_total", "Of them, those whose handshake resumed a session (--tls-resumption).", c.Stats.Resumed.Load)
	counter("refused_total", "Connections refused (not redirected in transparent mode).", c.Stats.Refused.Load)
	counter("handshake_failures_total", "Mutual TLS handshakes with the master's guard that failed.", c.Stats.HandshakeFailed.Load)
	counter("dial_failures_total", "Connections to the master's guard that failed.", c.Stats.DialFailed.Load)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "storeguard", Subsystem: "connect",
		Name: "relays_active", Help: "Relays open now."}, func() float64 { return float64(c.Stats.Active.Load()) }))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	context.AfterFunc(ctx, func() { srv.Close() })
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		go srv.Serve(ln)
		return nil
	}
	if !takeOver {
		return err
	}
	go func() {
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end) && ctx.Err() == nil; {
			time.Sleep(100 * time.Millisecond)
			if ln, err := net.Listen("tcp", addr); err == nil {
				srv.Serve(ln)
				return
			}
		}
	}()
	return nil
}
