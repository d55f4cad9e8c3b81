package main

import (
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/storeguard/storeguard/config"
)

func TestServeFlagsShowDefaults(t *testing.T) {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	addServeFlags(fs)
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

// loadServe loads the configuration serve would from exactly env and the
// serve flags parsed from args, with file (if any) in a config file.
func loadServe(t *testing.T, file string, env []string, args ...string) (config.Config, error) {
	t.Helper()
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	addServeFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	opts := loadOptions(fs)
	if file != "" {
		opts.File = writeFile(t, file)
	}
	opts.Env = env
	return config.Load(opts)
}

func TestFlagsWin(t *testing.T) {
	file := "listen: \"127.0.0.1:1000\"\nmode: monitor\nlog:\n  level: debug\n"
	env := []string{"STOREGUARD_LISTEN=127.0.0.1:2000", "STOREGUARD_UPSTREAM=127.0.0.1:3000"}
	tests := []struct {
		name string
		args []string
		want func(*config.Config)
	}{
		{"no flags: env over file", nil, func(c *config.Config) {
			c.Listen, c.Upstream, c.Mode, c.Log.Level = "127.0.0.1:2000", "127.0.0.1:3000", config.ModeMonitor, slog.LevelDebug
		}},
		{"flag over env and file", []string{"--listen", "127.0.0.1:4000", "--mode=enforce"}, func(c *config.Config) {
			c.Listen, c.Upstream, c.Log.Level = "127.0.0.1:4000", "127.0.0.1:3000", slog.LevelDebug
		}},
		// Given explicitly, a flag wins even when it repeats the built-in default.
		{"flag equal to the default still wins", []string{"--log-level", "info", "--mode", "enforce"}, func(c *config.Config) {
			c.Listen, c.Upstream = "127.0.0.1:2000", "127.0.0.1:3000"
		}},
		{"aliases and empty values", []string{"--log-format=text", "--metrics-listen="}, func(c *config.Config) {
			c.Listen, c.Upstream, c.Mode, c.Log.Level = "127.0.0.1:2000", "127.0.0.1:3000", config.ModeMonitor, slog.LevelDebug
			c.Log.Format, c.MetricsListen = config.LogText, ""
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := config.Default()
			tt.want(&want)
			got, err := loadServe(t, file, env, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestConfigFlag(t *testing.T) {
	path := writeFile(t, "mode: monitor\n")
	c, err := loadServe(t, "", []string{"STOREGUARD_CONFIG=/nonexistent.yaml"}, "--config", path)
	if err != nil || c.Mode != config.ModeMonitor {
		t.Fatalf("--config over $STOREGUARD_CONFIG: mode %q, err %v", c.Mode, err)
	}
	_, err = loadServe(t, "", []string{}, "--mode", "off")
	if err == nil || !strings.Contains(err.Error(), `mode: "off" is not one of enforce, monitor (flag --mode)`) {
		t.Fatalf("a bad flag value: %v, want it named with its flag", err)
	}
}

// Flags registered elsewhere (probe, replay) bind by key name, whatever their type.
func TestTypedFlags(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Int("limits.max-keys", 0, "")
	fs.Bool("limits.reject-zero-count", false, "")
	fs.Duration("timeouts.idle", 0, "")
	fs.StringSlice("access.allow", nil, "")
	fs.IntSlice("replay.ports", nil, "")
	fs.Int("unrelated", 0, "")
	fs.String("audit", "", "") // a section, not a setting: replay's --audit FILE
	if err := fs.Parse([]string{"--limits.max-keys=7", "--limits.reject-zero-count", "--timeouts.idle=3m", "--access.allow=10.0.0.0/8,10.1.0.0/16",
		"--replay.ports=1", "--replay.ports=2", "--unrelated=3", "--audit=x.jsonl"}); err != nil {
		t.Fatal(err)
	}
	opts := loadOptions(fs)
	opts.Env = []string{}
	got, err := config.Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Default()
	want.Limits.MaxKeys, want.Limits.RejectZeroCount, want.Timeouts.Idle = 7, true, 3*time.Minute
	want.Access.Allow = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.0.0/16")}
	want.Replay.Ports = []uint16{1, 2}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}
