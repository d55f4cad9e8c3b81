package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/internal/progress"
	"github.com/storeguard/storeguard/replay"
)

func newReplayCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "replay [flags] FILE...",
		Short: "Run the guard over recorded traffic (pcap, pcapng, gzip) and report each TCPStore stream",
		Long: "Reassembles the TCP streams to the store's port(s) in each capture and runs every\n" +
			"client-to-server stream through serve's decoder, limits and message deadlines (on capture\n" +
			"time). Prints one row per stream, or with --json one JSON object per line.\n\n" +
			"Verdicts: pass, reject (serve would have blocked it; a stream that ended, by either side's\n" +
			"FIN or RST, inside a message is reject by truncated_message), incomplete (midstream: the\n" +
			"capture has no SYN; gap/snaplen: bytes are missing), refused (serve's admission, run on\n" +
			"capture time with the config's access, caps and ban settings, would have refused it at\n" +
			"its accept, the client's ACK that completes the handshake; the reason: banned,\n" +
			"ban_throttled, denied, not_allowed, max_connections, prefix_connections,\n" +
			"source_connections, source_rate, source_table_full),\n" +
			"half_open (the handshake never completed: a SYN scan, a closed port, or no ACK before\n" +
			"the capture ended; serve never sees these, so nothing is admitted or judged, but the scan\n" +
			"detector counts them). A source is banned as serve bans it: ban.violations\n" +
			"violations (enforce mode, not truncated_message) within ban.window, unless it is in\n" +
			"ban.exempt (an IPv6 one's /64 when they come from 2+ of its addresses); while it has\n" +
			"another stream open that completed a valid message, ban.serving-rate new streams a\n" +
			"second are still admitted (ban_throttled beyond). A refused stream is\n" +
			"not decoded; a banned source's first bytes (up to 64, read for ban.peek) are judged as\n" +
			"serve's refused flow judges them (--json: judged). --json adds each stream's flow verdict\n" +
			"(passed, empty, truncated, blocked, would_block, incomplete, refused, half_open, open);\n" +
			"--audit gets serve's flow records (as --flows selects them; passed ones in FILE.flows, as\n" +
			"serve keeps them), denied and banned events and scan notices too. With generation auto, a stream that does not start with VALIDATE is read as G0; use\n" +
			"--generation 2.1 for torch 2.1 clients.\n\n" +
			"Exit status: 0 no violation, 1 violations found, 2 error (results so far are printed).",
		Args:         cobra.MinimumNArgs(1),
		SilenceUsage: true,
	}
	d := config.Default()
	fs := cmd.Flags()
	fs.String("config", "", "YAML config file (also $STOREGUARD_CONFIG): limits, timeouts, mode, access, caps, ban, audit, replay.ports")
	fs.String("generation", d.Generation, "store generation: auto | G0..G6 | torch release MAJOR.MINOR")
	fs.IntSlice("port", nil, "TCPStore server port (repeatable; default: config replay.ports, 29500)")
	fs.Bool("json", false, "one JSON object per line per stream")
	fs.String("audit", "", "write the audit events serve would have written (mode replay) to this file")
	fs.String("flows", string(d.Flows), "flow records in the audit files: all | suspicious | off")
	cmd.RunE = func(cmd *cobra.Command, files []string) error {
		cfg, err := config.Load(loadOptions(fs))
		if err != nil {
			return fmt.Errorf("bad configuration:\n%w", err)
		}
		var opts replay.Options
		ports, _ := fs.GetIntSlice("port")
		for _, p := range ports {
			if p < 1 || p > 65535 {
				return fmt.Errorf("--port %d: must be between 1 and 65535", p)
			}
			opts.Ports = append(opts.Ports, uint16(p))
		}
		opts.AuditFile, _ = fs.GetString("audit")
		opts.Observer = observer("sensor", false) // the traffic is the capture's, not this host's
		out := bufio.NewWriterSize(cmd.OutOrStdout(), 64<<10)
		asJSON, _ := fs.GetBool("json")
		if asJSON {
			opts.OnStream = replay.NewJSONWriter(out).Write
		} else {
			tw := replay.NewTableWriter(out)
			if err := tw.Header(); err != nil {
				return err
			}
			opts.OnStream = tw.Write
		}
		sum, err := replayFiles(cmd, cfg, files, opts)
		if !asJSON {
			fmt.Fprintln(out, sum)
		}
		if ferr := out.Flush(); err == nil {
			err = ferr
		}
		if err != nil {
			return exitError{2, err}
		}
		if sum.Reject > 0 {
			return exitError{1, errors.New(sum.String())}
		}
		return nil
	}
	return cmd
}

// replayFiles replays files in order, as replay.Replay does, showing each one's progress on a
// terminal (stderr).
func replayFiles(cmd *cobra.Command, cfg config.Config, files []string, opts replay.Options) (replay.Summary, error) {
	r, err := replay.New(cfg, opts)
	if err != nil {
		return replay.Summary{}, err
	}
	bar := progress.New(cmd.ErrOrStderr(), 0)
	var readErr error
	for i, name := range files {
		if readErr = replayFile(cmd.Context(), r, bar, name, fmt.Sprintf("replaying %s (%d of %d)", name, i+1, len(files))); readErr != nil {
			break
		}
	}
	bar.Done()
	return r.Summary(), errors.Join(readErr, r.Close())
}

func replayFile(ctx context.Context, r *replay.Replayer, bar *progress.Printer, name, label string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	return r.ReadCapture(ctx, name, bar.StartFile(label, f))
}
