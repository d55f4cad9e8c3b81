//go:build !linux

package main

import (
	"log/slog"

	"github.com/storeguard/storeguard/proxy"
	"github.com/storeguard/storeguard/upgrade"
)

type upgrader struct{}

func newUpgrader(*slog.Logger) *upgrader { return &upgrader{} }

func (*upgrader) upgrade(*proxy.Server) error { return upgrade.ErrNeedsLinux }
