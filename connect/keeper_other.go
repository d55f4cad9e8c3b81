//go:build !linux

package connect

import (
	"errors"

	"github.com/storeguard/storeguard/tlsrelay"
)

var errKeeper = errors.New("connect: --keeper needs Linux")

func (c *Client) shareLedger() error {
	if c.opt.Keeper != nil {
		return errKeeper
	}
	return nil
}

func (c *Client) keep(*tlsrelay.Relay, relayInfo) {}

// KeeperListeners needs Linux.
func (c *Client) KeeperListeners(bool, func(error)) error { return c.shareLedger() }

// AskUpgrade: no keeper here.
func (c *Client) AskUpgrade() bool { return false }

// Restore needs Linux.
func Restore(Options) (*Client, error) { return nil, errKeeper }
