package main

import (
	"os"
	"runtime/debug"
)

// gcPercent is the forwarding processes' GOGC: the heap grows to five times what is live between
// collections, not twice. Each new mutual-TLS connection allocates its handshake's garbage, and a
// collection that runs during a connection's set-up delays it: through both guards on the 2-core
// bench machine (torch 2.6 libuv store, one client making connections one after another, 3
// interleaved rounds), the set-up's p99 went from 4.2 to 5.0 ms to 3.4 to 4.0 ms. serve's heap stays
// under its memory limit (the buffer budget and its overhead, docs/design.md "Memory"), which bounds
// it whatever GOGC is.
const gcPercent = 400

// collectLess sets gcPercent, unless GOGC is set.
func collectLess() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}
