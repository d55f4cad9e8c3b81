package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"testing"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/storeinfo"
)

// With caps.max-store-connections auto, the server keeps the cap that storeinfo.Limiter finds for
// its settings (the store's process here is this test's, which holds the recorder).
func TestAutoCapFromTheStoreProcess(t *testing.T) {
	h := start(t, goroutineMode, func(c *config.Config) { c.Caps.MaxStoreConnections = config.AutoCount{Auto: true} })
	slots := admission.NewStoreSlots(0, 0)
	stopped, cancel := context.WithCancel(context.Background())
	cancel() // Run reads the store's limit once, then returns
	storeinfo.NewLimiter(slots, func() config.Config { return h.srv.set.Load().cfg }, slog.New(slog.DiscardHandler)).Run(stopped)
	// The process's open descriptors vary a little between the server's reading and this one, as
	// the sockets of earlier tests close.
	want := float64(slots.Limit())
	var got float64
	eventually(t, fmt.Sprintf("a cap of about %.0f", want), func() bool {
		var err error
		got, err = strconv.ParseFloat(h.metric("storeguard_store_connections_limit"), 64)
		return err == nil && got <= want+256 && got >= want-256
	})
}
