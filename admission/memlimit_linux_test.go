package admission

import (
	"os"
	"path/filepath"
	"testing"
)

// The memory limit is the least of the process's cgroup and its parents', v2 or v1; "max" and v1's
// huge "no limit" are none.
func TestMemoryLimit(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("cgroup-v2", "0::/system.slice/storeguard.service\n")
	write("fs/system.slice/storeguard.service/memory.max", "max\n")
	write("fs/system.slice/memory.max", "671088640\n")
	write("fs/memory.max", "1073741824\n")
	if got := memoryLimit(filepath.Join(root, "cgroup-v2"), filepath.Join(root, "fs")); got != 671088640 {
		t.Errorf("v2: %d, want the parent's 671088640", got)
	}
	write("cgroup-v1", "5:devices:/x\n4:memory:/kubepods/pod1/c1\n0::/\n")
	write("fs/memory/kubepods/pod1/c1/memory.limit_in_bytes", "536870912\n")
	write("fs/memory/memory.limit_in_bytes", "9223372036854771712\n")
	if got := memoryLimit(filepath.Join(root, "cgroup-v1"), filepath.Join(root, "fs")); got != 536870912 {
		t.Errorf("v1: %d, want 536870912", got)
	}
	write("cgroup-none", "0::/\n")
	os.Remove(filepath.Join(root, "fs/memory.max"))
	if got := memoryLimit(filepath.Join(root, "cgroup-none"), filepath.Join(root, "fs")); got != 0 {
		t.Errorf("no limit: %d", got)
	}
	// A sidecar limited to 512 MiB with the default 256 MiB budget: 12,288 connections, not the
	// 524,160 its descriptors would allow.
	if got := ConnectionsInMemory(512<<20, 256<<20+64<<20); got != 12288 {
		t.Errorf("ConnectionsInMemory: %d", got)
	}
}
