//go:build !linux

package tlsrelay

import "errors"

// NewSharedLedger needs Linux (memfd); elsewhere relays keep their state in plain memory.
func NewSharedLedger(int) (*Ledger, error) {
	return nil, errors.New("tlsrelay: a shared ledger needs Linux")
}

// OpenLedger needs Linux.
func OpenLedger(int) (*Ledger, error) {
	return nil, errors.New("tlsrelay: a shared ledger needs Linux")
}
