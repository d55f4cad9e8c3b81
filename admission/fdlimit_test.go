package admission

import "testing"

// caps.max-connections: auto holds half of what the reserve leaves of the guard's descriptors (a
// proxied connection holds two): a node's usual hard limits admit far more than the 98,304 ranks
// torch's libuv store was built for; an unknown limit keeps the number auto replaced; a tiny one
// still admits a job's host.
func TestConnectionsForFollowsTheDescriptorLimit(t *testing.T) {
	for _, c := range []struct {
		limit int64
		want  int
	}{
		{1024, 384}, {1000, 372}, {20000, 9872}, {524288, 262016}, {1048576, 524160},
		{0, 20000}, {-1, 1 << 23}, {1 << 40, 1 << 23}, {200, 64},
	} {
		if got := ConnectionsFor(c.limit); got != c.want {
			t.Errorf("ConnectionsFor(%d) = %d, want %d", c.limit, got, c.want)
		}
	}
	if got := PrefixConnectionsFor(262016); got != 131008 {
		t.Errorf("PrefixConnectionsFor(262016) = %d, want 131008", got)
	}
	if FileLimit() == 0 {
		t.Error("FileLimit could not read this process's RLIMIT_NOFILE")
	}
}
