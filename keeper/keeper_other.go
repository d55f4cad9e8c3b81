//go:build !linux

package keeper

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"time"
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

// Link is a worker's end of its link to a keeper (Linux only): never made here, and a nil Link does
// nothing.
type Link struct{}

// Dial fails: a keeper needs Linux.
func Dial(*os.File, *slog.Logger) (*Link, error) { return nil, errors.New("keeper: needs Linux") }

func (*Link) Opened(uint64, netip.AddrPort, netip.AddrPort, int)                              {}
func (*Link) Connected(uint64, int)                                                           {}
func (*Link) Ended(uint64)                                                                    {}
func (*Link) Listen(Listeners, ...int)                                                        {}
func (*Link) TookOver()                                                                       {}
func (*Link) AskUpgrade()                                                                     {}
func (*Link) Sync(time.Duration) bool                                                         { return false }
func (*Link) StopNext(time.Duration) bool                                                     { return false }
func (*Link) Serve(func(*os.File), func(error))                                               {}
func (*Link) OpenedWith(uint64, netip.AddrPort, netip.AddrPort, int, json.RawMessage, ...int) {}
func (*Link) Restore(func(Listeners, []int) error, func(Conn, int, int, []int)) error {
	return errors.New("keeper: needs Linux")
}
