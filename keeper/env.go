package keeper

// Env names the worker's descriptor of its keeper's socket; RestoreEnv is set for a worker that
// takes over from one that died (it asks the keeper for everything).
const (
	Env        = "STOREGUARD_KEEPER_FD"
	RestoreEnv = "STOREGUARD_KEEPER_RESTORE"
)
