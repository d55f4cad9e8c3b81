package admission

import (
	"bufio"
	"os"
	"path"
	"strconv"
	"strings"
)

// MemoryLimit is the least memory limit of this process's cgroup and its parents (v2 memory.max,
// v1 memory.limit_in_bytes), 0 when there is none or it cannot be read.
func MemoryLimit() int64 { return memoryLimit("/proc/self/cgroup", "/sys/fs/cgroup") }

func memoryLimit(cgroupFile, root string) int64 {
	f, err := os.Open(cgroupFile)
	if err != nil {
		return 0
	}
	defer f.Close()
	var least int64
	for sc := bufio.NewScanner(f); sc.Scan(); {
		// "0::/path" (v2), "4:memory:/path" (v1)
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var base, file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			base, file = root, "memory.max"
		case strings.Contains(","+parts[1]+",", ",memory,"):
			base, file = path.Join(root, "memory"), "memory.limit_in_bytes"
		default:
			continue
		}
		for d := path.Clean("/" + parts[2]); ; d = path.Dir(d) {
			b, err := os.ReadFile(path.Join(base, d, file))
			n, perr := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			if err == nil && perr == nil && n > 0 && n < 1<<60 && (least == 0 || n < least) {
				least = n
			}
			if d == "/" {
				break
			}
		}
	}
	return least
}
