package keeper

import (
	"os"
	"slices"
	"testing"
)

// A process the keeper or an upgrade starts gets this one's environment less the descriptors
// passed to this one: those name descriptors it does not have, and the caller sets its own.
func TestChildEnvDropsThePassedDescriptors(t *testing.T) {
	for _, name := range []string{Env, RestoreEnv, HandoverEnv} {
		t.Setenv(name, "3")
	}
	kept := map[string]string{
		"KEEPER_TEST_KEPT":  "a=b=c", // an '=' in the value
		Env + "_NOT":        "4",     // a longer name that starts with one dropped
		"X_" + HandoverEnv:  "5",
		"KEEPER_TEST_EMPTY": "",
		RestoreEnv + "_":    "1",
	}
	for name, v := range kept {
		t.Setenv(name, v)
	}
	env := ChildEnv()
	for _, name := range []string{Env, RestoreEnv, HandoverEnv} {
		if slices.Contains(env, name+"=3") {
			t.Errorf("ChildEnv passes %s on", name)
		}
	}
	for name, v := range kept {
		if !slices.Contains(env, name+"="+v) {
			t.Errorf("ChildEnv dropped %s=%s", name, v)
		}
	}
	if want := len(os.Environ()) - 3; len(env) != want {
		t.Errorf("ChildEnv has %d variables, want %d (all but the 3)", len(env), want)
	}
}
