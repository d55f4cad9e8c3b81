//go:build !linux

package nftset

import (
	"context"
	"errors"
	"os"
)

// Netlink is the Runner that speaks netlink to nf_tables: Linux only.
type Netlink struct{ NetNS *os.File }

var errNotLinux = errors.New("nftables is a Linux firewall")

// Check fails: there is no nftables here.
func (Netlink) Check(context.Context, Spec) error { return errNotLinux }

// Apply fails: there is no nftables here.
func (Netlink) Apply(context.Context, Txn) error { return errNotLinux }
