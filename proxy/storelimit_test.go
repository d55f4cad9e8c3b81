package proxy

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/storeguard/storeguard/config"
)

// With caps.max-store-connections auto and the store on this host, the server keeps the cap at
// the store process's soft limit less a reserve (storeinfo.Limiter; the recorder runs in this
// test's process, which holds few files).
func TestAutoCapFromTheStoreProcess(t *testing.T) {
	h := start(t, goroutineMode, func(c *config.Config) { c.Caps.MaxStoreConnections = config.AutoCount{Auto: true} })
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	// The reserve is at least 128, or what the store holds besides the guard's connections and a
	// margin of 64; the process's open descriptors vary a little between the reading at start-up
	// and this one, as the sockets of earlier tests close.
	soft := float64(rl.Cur)
	most, least := soft-128, soft-max(128, float64(len(entries)+64))-256
	var got float64
	eventually(t, fmt.Sprintf("a cap from the soft limit %d with %d files open (%.0f to %.0f)", rl.Cur, len(entries), least, most), func() bool {
		var err error
		got, err = strconv.ParseFloat(h.metric("storeguard_store_connections_limit"), 64)
		return err == nil && got <= most && got >= least
	})
}
