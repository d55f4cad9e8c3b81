//go:build !linux

package storeinfo

import "errors"

// diagListeners: sock_diag is Linux's.
func diagListeners() ([]procListener, error) { return nil, errors.New("no sock_diag") }
