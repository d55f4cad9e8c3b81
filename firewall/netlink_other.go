//go:build !linux

package firewall

import (
	"errors"
	"os"
)

// Target is the network namespace to work in: the process's own when NetNS is nil.
type Target struct{ NetNS *os.File }

var errNotLinux = errors.New("nftables is a Linux firewall")

// Install loads the ruleset: Linux only.
func Install(Target, string, Values) error { return errNotLinux }

// Remove deletes the ruleset's table: Linux only.
func Remove(Target, string) error { return errNotLinux }

// Check compares the loaded table with the ruleset: Linux only.
func Check(Target, string, Values) ([]Count, error) { return nil, errNotLinux }

// Count is what a rule with a counter counted.
type Count struct {
	Chain, Comment string
	Packets, Bytes uint64
}
