//go:build !linux

package main

import (
	"errors"
	"log/slog"

	"github.com/storeguard/storeguard/proxy"
)

type upgrader struct{}

func newUpgrader(*slog.Logger) *upgrader { return &upgrader{} }

func (*upgrader) upgrade(*proxy.Server) error { return errors.New("upgrade in place needs Linux") }
