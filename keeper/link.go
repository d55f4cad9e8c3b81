package keeper

import "net/netip"

// The bodies of the packets between a worker and its keeper (keeper_linux.go lists them).

// Listeners is the L and S packets' body.
type Listeners struct {
	Listen        string
	MetricsListen string // "" when there is no metrics listener (one descriptor)
	NextID        uint64 // S only: the next connection id to use
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
}
