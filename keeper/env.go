package keeper

import (
	"os"
	"strings"
)

// The descriptors storeguard's processes pass each other through the environment: Env, a worker's
// socket to its keeper; RestoreEnv, set for a worker that takes over from one that died (it asks
// the keeper for everything); HandoverEnv, a new process's hand-over socket to the one it takes
// over from (upgrade in place).
const (
	Env         = "STOREGUARD_KEEPER_FD"
	RestoreEnv  = "STOREGUARD_KEEPER_RESTORE"
	HandoverEnv = "STOREGUARD_HANDOVER_FD"
)

// ChildEnv is this process's environment for a storeguard process it starts, without the
// variables above: the caller sets those it passes.
func ChildEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name != Env && name != RestoreEnv && name != HandoverEnv {
			env = append(env, kv)
		}
	}
	return env
}
