package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/identity"
)

// identityPoll is how often certificate files are checked for a change.
const identityPoll = 2 * time.Second

// identitySource is where this guard's certificate and its peers' roots come from (tls.*): the
// SPIFFE Workload API, or files re-read as they change. Nil with TLS off.
func identitySource(ctx context.Context, t config.TLS, log *slog.Logger) (identity.Source, error) {
	if t.SPIFFESocket != "" {
		return identity.Workload(ctx, t.SPIFFESocket, log)
	}
	if t.CertFile == "" && t.KeyFile == "" && t.CAFile == "" {
		return nil, nil
	}
	return identity.Files(t.CertFile, t.KeyFile, t.CAFile, identity.FileOptions{Poll: identityPoll, Log: log})
}
