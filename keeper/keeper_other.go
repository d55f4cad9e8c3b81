//go:build !linux

package keeper

import (
	"log/slog"
	"os"
)

// Keeper needs Linux (descriptors passed between processes).
type Keeper struct{ log *slog.Logger }

func New(_ string, _ []string, log *slog.Logger) *Keeper { return &Keeper{log: log} }

// Run reports that a keeper cannot run here.
func (k *Keeper) Run() int {
	k.log.Error("keeper: needs Linux")
	os.Stderr.WriteString("storeguard: --keeper needs Linux\n")
	return 2
}
