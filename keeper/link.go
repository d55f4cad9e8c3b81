package keeper

import (
	"encoding/json"
	"net/netip"
)

// The bodies of the packets between a worker and its keeper (keeper_linux.go lists them).

// Listeners is the L and S packets' body.
type Listeners struct {
	Listen        string
	MetricsListen string // "" when there is no metrics listener (one descriptor)
	NextID        uint64 // S only: the next connection id to use
	// Ledger: the last descriptor is the mutual-TLS relays' ledger (shared memory, tlsrelay),
	// which outlives the worker with the keeper's copy.
	Ledger bool `json:",omitempty"`
}

// Change is one entry of an M packet, which carries many O, U and D at once (their descriptors in
// order: one for each O and U): a storm of connections costs the worker one packet per batch.
type Change struct {
	Kind byte `json:"k"`
	Conn Conn `json:"c"`
}

// Conn is the O and C packets' body.
type Conn struct {
	ID       uint64
	Src, Dst netip.AddrPort
	HasUp    bool   // C only: a second descriptor, the store's, follows the client's
	Relay    *Relay `json:",omitempty"`
}

// Relay is what a mutual-TLS connection adds: its relay's slot in the ledger and the worker's own
// account of it (Meta: who the peer is). Its descriptors follow the client's (and the store's, in
// C): the TLS socket, then, when Outer, the relay's own plaintext socket (on the master, the
// other end of the client's loopback pair; a client guard's relay writes to the client's).
type Relay struct {
	Slot  int
	Outer bool            `json:",omitempty"`
	Meta  json.RawMessage `json:",omitempty"`
}

// relayFds is how many descriptors c's relay adds.
func (c Conn) relayFds() int {
	switch {
	case c.Relay == nil:
		return 0
	case c.Relay.Outer:
		return 2
	}
	return 1
}
