package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/storeguard/storeguard/config"
)

func runConfigCommand(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := newConfigCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "storeguard.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCheckCommand(t *testing.T) {
	t.Setenv("STOREGUARD_MODE", "monitor") // check applies the environment, as serve does
	good := writeFile(t, "limits:\n  max-keys: 42\n")
	out, _, err := runConfigCommand(t, "check", good)
	if err != nil {
		t.Fatalf("check %s: %v", good, err)
	}
	got, err := config.Load(config.Options{File: writeFile(t, out), Env: []string{}})
	if err != nil {
		t.Fatalf("printed config does not load: %v\n%s", err, out)
	}
	want := config.Default()
	want.Limits.MaxKeys, want.Mode = 42, config.ModeMonitor
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("printed config loads to %+v\nwant %+v\n%s", got, want, out)
	}

	bad := writeFile(t, "limits:\n  max-keys: 0\n  max-key-byte: 1\n")
	out, stderr, err := runConfigCommand(t, "check", bad)
	if err == nil || out != "" {
		t.Fatalf("check of a bad file: err %v, stdout %q", err, out)
	}
	for _, want := range []string{"limits.max-keys: must be between 1 and", "limits.max-key-byte: unknown key; did you mean limits.max-key-bytes?"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(stderr, "Usage:") {
		t.Error("a bad config printed usage")
	}

	if _, _, err := runConfigCommand(t, "check"); err == nil {
		t.Error("check with no FILE succeeded")
	}
}

func TestCheckCommandNotesNearMisses(t *testing.T) {
	t.Setenv("STOREGUARD_LIMITS_MAX_KEY_BYTE", "1")
	_, stderr, err := runConfigCommand(t, "check", writeFile(t, ""))
	if err != nil || !strings.Contains(stderr, "note: STOREGUARD_LIMITS_MAX_KEY_BYTE is not a setting and is ignored; did you mean STOREGUARD_LIMITS_MAX_KEY_BYTES?") {
		t.Fatalf("err %v, stderr %q", err, stderr)
	}
}

func TestDefaultCommand(t *testing.T) {
	out, _, err := runConfigCommand(t, "default")
	if err != nil || out != string(config.DefaultYAML()) {
		t.Fatalf("config default: err %v, output differs from default.yaml", err)
	}
	kit, err := os.ReadFile("../../configs/storeguard.yaml")
	if err != nil || out != string(kit) {
		t.Fatalf("config default differs from configs/storeguard.yaml (%v)", err)
	}
}
