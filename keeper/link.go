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
	// Ledger: the last descriptor is the worker's shared memory for its TLS relays' state
	// (tlsrelay.NewSharedLedger), which the keeper holds as it holds sockets.
	Ledger bool   `json:",omitempty"`
	NextID uint64 // S only: the next connection id to use
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
	HasUp    bool // C only: a second descriptor, the store's, follows the client's
	// Extra descriptors of the connection's own (a TLS relay's two sockets) follow the client's
	// in O, and the client's and the store's in C.
	Extra int `json:",omitempty"`
	// Data is the worker's own record of the connection, kept and given back as it is (a TLS
	// relay's slot in the ledger, the peer's identity).
	Data json.RawMessage `json:",omitempty"`
}
