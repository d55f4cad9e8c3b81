package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"time"

	"github.com/storeguard/storeguard/config"
)

// WatchReload reloads the configuration with load on every signal from hup and whenever the
// file at path changes (polled by content hash, as CoreDNS does: viper's own watcher races). A
// failed load or reload keeps the running configuration.
func (s *Server) WatchReload(ctx context.Context, load func() (*config.Parsed, error), path string, hup <-chan os.Signal) {
	sum := func() []byte {
		if path == "" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		h := sha256.Sum256(b)
		return h[:]
	}
	last := sum()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		case <-tick.C:
			cur := sum()
			if cur == nil || bytes.Equal(cur, last) {
				continue
			}
			last = cur
		}
		cfg, err := load()
		if err != nil {
			s.m.reloads.WithLabelValues("failed").Inc()
			s.log.Error("config reload failed; keeping the running config", "err", err)
			continue
		}
		s.Reload(cfg)
	}
}
