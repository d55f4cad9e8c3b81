//go:build !linux

package tlsrelay

import (
	"errors"
	"net"
)

var errLinux = errors.New("tlsrelay: relays need Linux (TCP_INFO, MSG_PEEK)")

func counts(Sock) (read, written uint64, err error)       { return 0, 0, errLinux }
func peek(Sock, []byte, int) (n int, eof bool, err error) { return 0, false, errLinux }
func consume(Sock, int) error                             { return errLinux }
func write(Sock, []byte) (int, error)                     { return 0, errLinux }

func drainPair(int, int) (toGuard, toRelay []byte, err error) { return nil, nil, errLinux }
func readQueue(int, bool) ([]byte, error)                     { return nil, errLinux }

func sockAddrs(int) (local, remote net.Addr, err error) { return nil, nil, errLinux }

func pairHolds(int, int) (int, error) { return 0, errLinux }
