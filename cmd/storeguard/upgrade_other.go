//go:build !linux

package main

import (
	"log/slog"
	"os"

	"github.com/storeguard/storeguard/upgrade"
)

type upgrader struct{}

type handOverer interface {
	HandOver(peer *os.File, exited <-chan struct{}) (int, error)
}

func newUpgrader(*slog.Logger) *upgrader { return &upgrader{} }

func (*upgrader) upgrade(handOverer) error { return upgrade.ErrNeedsLinux }
