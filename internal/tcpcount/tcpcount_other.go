//go:build !linux

// Package tcpcount reads how far a TCP socket's two byte streams stand (Linux only).
package tcpcount

import "errors"

var errLinux = errors.New("tcpcount: needs Linux (TCP_INFO)")

// Counts needs Linux.
func Counts(int, bool) (read, written uint64, err error) { return 0, 0, errLinux }

// Discard needs Linux.
func Discard(int, uint64) error { return errLinux }

// PeerOpen needs Linux: false.
func PeerOpen(int) bool { return false }
