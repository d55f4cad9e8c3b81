package config

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func runCommand(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := NewCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

func TestCheckCommand(t *testing.T) {
	t.Setenv("STOREGUARD_MODE", "monitor") // check applies the environment, as serve does
	good := writeFile(t, "limits:\n  max-keys: 42\n")
	out, _, err := runCommand(t, "check", good)
	if err != nil {
		t.Fatalf("check %s: %v", good, err)
	}
	got := mustLoad(t, out, nil)
	want := Default()
	want.Limits.MaxKeys, want.Mode = 42, ModeMonitor
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("printed config loads to %+v\nwant %+v\n%s", got, want, out)
	}

	bad := writeFile(t, "limits:\n  max-keys: 0\n  max-key-byte: 1\n")
	out, stderr, err := runCommand(t, "check", bad)
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

	if _, _, err := runCommand(t, "check"); err == nil {
		t.Error("check with no FILE succeeded")
	}
}

func TestDefaultCommand(t *testing.T) {
	out, _, err := runCommand(t, "default")
	if err != nil || out != string(defaultYAML) {
		t.Fatalf("config default: err %v, output differs from default.yaml", err)
	}
}

func TestServeFlagsShowDefaults(t *testing.T) {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	AddServeFlags(fs)
	for name, want := range map[string]string{
		"listen": ":29500", "upstream": "127.0.0.1:29501", "metrics-listen": "127.0.0.1:9529", "audit-log": "",
		"generation": "auto", "mode": "enforce", "backend": "auto", "log-level": "info", "log-format": "json", "config": "", "event-loops": "0",
	} {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("no --%s", name)
			continue
		}
		if f.DefValue != want {
			t.Errorf("--%s default %q, want %q", name, f.DefValue, want)
		}
		if name != "config" && flagKey(name) == "" {
			t.Errorf("--%s maps to no key", name)
		}
	}
}
