//go:build !linux

package connect

import (
	"context"
	"os"

	"github.com/storeguard/storeguard/upgrade"
)

// HandOver needs Linux (descriptors passed between processes).
func (c *Client) HandOver(*os.File, <-chan struct{}) (int, error) { return 0, upgrade.ErrNeedsLinux }

// TakeOver needs Linux.
func TakeOver(Options, *os.File) (*Client, error) { return nil, upgrade.ErrNeedsLinux }

func (c *Client) awaitThaw(context.Context) bool { return true }
