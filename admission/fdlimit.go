package admission

// fdReserve is what caps.max-connections: auto keeps of the guard's descriptors for everything but
// proxied connections: its listeners, the metrics server's connections, the audit and flow logs,
// the keeper's socket, an upgrade's hand-over.
const fdReserve = 256

// unknownFileLimit is caps.max-connections: auto where the guard cannot read its descriptor limit:
// the embedded default before auto.
const unknownFileLimit = 20000

// ConnectionsFor is caps.max-connections: auto for a guard whose RLIMIT_NOFILE is limit (0: it
// could not be read; -1: unlimited). A proxied connection holds two descriptors, the client's and
// the store's, so half of what the reserve leaves: past that the guard's accepts would fail with
// EMFILE instead of refusing at the cap, counted and named. A cluster's node gives a process
// 524,288 (systemd's hard limit) or 1,048,576 (containerd's): 262,016 and 524,160 connections,
// above the 98,304 ranks torch's libuv store was built for. Go raises the soft limit to the hard
// one when a program starts, so the guard's limit is its hard one.
func ConnectionsFor(limit int64) int {
	switch {
	case limit == 0:
		return unknownFileLimit
	case limit < 0 || limit > 1<<24:
		return 1 << 23
	}
	return max(int(limit-fdReserve)/2, 64)
}

// connectionMemory is what caps.max-connections: auto counts a connection to cost in memory: about
// 4 KB of heap measured on an event loop (a heap profile of 32,000 ended connections: 115 MB), two
// or three goroutine stacks while it is on goroutines, its sockets' buffers (a cgroup charges them).
const connectionMemory = 16 << 10

// ConnectionsInMemory is caps.max-connections: auto under a memory limit (a cgroup's memory.max,
// 0: none known) of which reserved is spoken for (the buffer budget, the runtime): past it the
// kernel would kill the guard, and every rank with it. 0 when there is no limit.
func ConnectionsInMemory(limit, reserved int64) int {
	if limit <= 0 {
		return 0
	}
	return max(int((limit-reserved)/connectionMemory), 64)
}

// PrefixConnectionsFor is caps.per-prefix-connections: auto: half of caps.max-connections, so
// that no one network (an IPv6 /64 has 2^64 addresses) holds them all, while a job whose hosts
// share one /64 may grow to half of what the guard holds.
func PrefixConnectionsFor(maxConnections int) int {
	return max(maxConnections/2, 1)
}
