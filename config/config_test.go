package config

import (
	"bytes"
	"errors"
	"github.com/storeguard/storeguard/admission"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/nftset"
	"github.com/storeguard/storeguard/protocol"
)

// load writes yaml (if any) to a file and loads it with exactly env and flags.
func load(t *testing.T, yaml string, env []string, flags ...Flag) (Config, error) {
	t.Helper()
	var path string
	if yaml != "" {
		path = writeFile(t, yaml)
	}
	if env == nil {
		env = []string{}
	}
	return Load(Options{File: path, Env: env, Flags: flags})
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "storeguard.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func mustLoad(t *testing.T, yaml string, env []string, flags ...Flag) Config {
	t.Helper()
	c, err := load(t, yaml, env, flags...)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

func TestDefaults(t *testing.T) {
	got := mustLoad(t, "", nil)
	if !reflect.DeepEqual(got, Default()) {
		t.Fatalf("Load with nothing = %+v, want Default() %+v", got, Default())
	}
	// Spot checks against docs/design.md, in case both drifted together.
	want := []struct {
		name      string
		got, want any
	}{
		{"listen", got.Listen, ":29500"},
		{"upstream", got.Upstream, "127.0.0.1:29501"},
		{"metrics-listen", got.MetricsListen, "127.0.0.1:9529"},
		{"audit-log", got.AuditLog, ""},
		{"generation", got.Generation, "auto"},
		{"backend", got.Backend, BackendAuto},
		{"mode", got.Mode, ModeEnforce},
		{"limits", got.Limits, Limits{8192, AutoLimit, 131072, AutoLimit, true, false, 2}},
		{"timeouts", got.Timeouts, Timeouts{60 * time.Second, 30 * time.Second, 0, 0, 10 * time.Second, 10 * time.Second}},
		{"access", got.Access, Access{}},
		{"caps", got.Caps, Caps{AutoCount{Auto: true}, 512, 200, 512, 0, 16, AutoCount{Auto: true}, 24, 64, AutoCount{Auto: true}, 256, 268435456, 67108864, 33554432, AutoRate{Auto: true}, 512, 250 * time.Millisecond, 10, 32}},
		{"ban", got.Ban, Ban{5, time.Minute, 10 * time.Minute,
			[]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}, 2 * time.Second, 1, 16}},
		{"scan", got.Scan, Scan{8, time.Minute}},
		{"flows", got.Flows, FlowsAll},
		{"audit", got.Audit, Audit{104857600, 5, 104857600, 2, 100, 1000, 10 * time.Minute, time.Hour}},
		{"log", got.Log, Log{slog.LevelInfo, LogJSON}},
		{"replay", got.Replay, Replay{[]uint16{29500}}},
	}
	for _, w := range want {
		if !reflect.DeepEqual(w.got, w.want) {
			t.Errorf("%s = %+v, want %+v", w.name, w.got, w.want)
		}
	}
}

func TestDefaultIsACopy(t *testing.T) {
	d := Default()
	d.Replay.Ports[0] = 1
	if Default().Replay.Ports[0] != 29500 {
		t.Fatal("Default() shares its slices")
	}
}

// The deployment kit ships configs/storeguard.yaml; it must never drift from
// the embedded default.
func TestEmbeddedDefaultMatchesDeployKit(t *testing.T) {
	kit, err := os.ReadFile("../configs/storeguard.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(kit, defaultYAML) {
		t.Fatal("configs/storeguard.yaml differs from config/default.yaml; copy one over the other")
	}
}

// docs/design.md is the contract: its key block must load to the defaults
// and list exactly the keys default.yaml has.
func TestDesignContractMatchesDefault(t *testing.T) {
	doc, err := os.ReadFile("../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "## Config keys")
	if !ok {
		t.Fatal("docs/design.md has no \"## Config keys\" section")
	}
	_, rest, _ = strings.Cut(rest, "```\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("no key block under \"## Config keys\"")
	}
	root, err := parseDoc([]byte(block))
	if err != nil {
		t.Fatal(err)
	}
	var s schemaInfo
	s.kinds, s.envs = map[string]kind{}, map[string]string{}
	s.add(root, "")
	if !reflect.DeepEqual(s.leaves, schema.leaves) {
		t.Errorf("design.md keys %v\n default.yaml keys %v", s.leaves, schema.leaves)
	}
	got := mustLoad(t, block, nil)
	if !reflect.DeepEqual(got, Default()) {
		t.Errorf("design.md defaults load to %+v\nwant %+v", got, Default())
	}
}

func TestFileOverrides(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want func(*Config)
	}{
		{"empty file", "", func(*Config) {}},
		{"comments only", "# nothing\n", func(*Config) {}},
		{"top-level keys", "listen: \"10.0.0.1:29500\"\nupstream: store:29500\nmetrics-listen: \"\"\naudit-log: /var/log/sg.jsonl\nmode: monitor\nbackend: libuv\n",
			func(c *Config) {
				c.Listen, c.Upstream, c.MetricsListen, c.AuditLog = "10.0.0.1:29500", "store:29500", "", "/var/log/sg.jsonl"
				c.Mode, c.Backend = ModeMonitor, BackendLibUV
			}},
		{"one nested key leaves its siblings alone", "limits:\n  max-key-bytes: 1024\n",
			func(c *Config) { c.Limits.MaxKeyBytes = 1024 }},
		{"byte limits as numbers", "limits:\n  max-value-bytes: 16777216\n  max-message-bytes: 50000000\n",
			func(c *Config) { c.Limits.MaxValueBytes, c.Limits.MaxMessageBytes = 16777216, 50000000 }},
		{"byte limits auto, in any case", "limits:\n  max-value-bytes: AUTO\n  max-message-bytes: Auto\n", func(*Config) {}},
		{"unquoted 2.10 is the release, not 2.1", "generation: 2.10\n",
			func(c *Config) { c.Generation = "2.10" }},
		{"generation G-name", "generation: G3\n", func(c *Config) { c.Generation = "G3" }},
		{"enums ignore case", "mode: MONITOR\nlog:\n  level: WARN\n  format: Text\n",
			func(c *Config) { c.Mode, c.Log.Level, c.Log.Format = ModeMonitor, slog.LevelWarn, LogText }},
		{"durations", "timeouts:\n  message: 1500ms\n  idle: 2h\n  first-message: 10s\nban:\n  window: 90s\n",
			func(c *Config) {
				c.Timeouts.Message, c.Timeouts.Idle, c.Timeouts.FirstMessage = 1500*time.Millisecond, 2*time.Hour, 10*time.Second
				c.Ban.Window = 90 * time.Second
			}},
		{"CIDRs, bare addresses and IPv6", "access:\n  allow: [10.0.0.0/8, 192.168.1.7, \"fd00::/8\"]\n  deny:\n    - 10.66.0.0/16\n",
			func(c *Config) {
				c.Access.Allow = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.7/32"), netip.MustParsePrefix("fd00::/8")}
				c.Access.Deny = []netip.Prefix{netip.MustParsePrefix("10.66.0.0/16")}
			}},
		{"empty list under a key", "access:\n  allow:\n", func(*Config) {}},
		{"empty section", "limits:\n", func(*Config) {}},
		{"rate as a fraction", "caps:\n  per-source-rate: 0.5\n  per-source-burst: 1\n",
			func(c *Config) { c.Caps.PerSourceRate, c.Caps.PerSourceBurst = 0.5, 1 }},
		{"a number of store connections, or auto in any case", "caps:\n  max-store-connections: 900\n  per-source-store-connections: 0\n",
			func(c *Config) { c.Caps.MaxStoreConnections, c.Caps.PerSourceStoreConnections = AutoCount{N: 900}, 0 }},
		{"store connections auto", "caps:\n  max-store-connections: AUTO\n", func(*Config) {}},
		{"store dial rates, a fraction and off", "caps:\n  store-dial-rate: 0.5\n  store-dial-burst: 1\n  per-source-store-dial-rate: 0\n",
			func(c *Config) {
				c.Caps.StoreDialRate, c.Caps.StoreDialBurst, c.Caps.PerSourceStoreDialRate = AutoRate{Rate: 0.5}, 1, 0
			}},
		{"bans off need no window", "ban:\n  violations: 0\n  window: 0s\n  duration: 0s\n",
			func(c *Config) { c.Ban.Violations, c.Ban.Window, c.Ban.Duration = 0, 0, 0 }},
		{"same port on another host is not a loop", "listen: \":29500\"\nupstream: \"10.0.0.5:29500\"\n",
			func(c *Config) { c.Upstream = "10.0.0.5:29500" }},
		{"replay ports", "replay:\n  ports: [29500, 29400]\n", func(c *Config) { c.Replay.Ports = []uint16{29500, 29400} }},
		{"anchors and aliases", "timeouts:\n  upstream-dial: &d 2s\n  drain: *d\n",
			func(c *Config) { c.Timeouts.UpstreamDial, c.Timeouts.Drain = 2*time.Second, 2*time.Second }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := Default()
			tt.want(&want)
			got := mustLoad(t, tt.yaml, nil)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestEnvOverrides(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		env  []string
		want func(*Config)
	}{
		{"nested key", "", []string{"STOREGUARD_LIMITS_MAX_KEY_BYTES=4096"},
			func(c *Config) { c.Limits.MaxKeyBytes = 4096 }},
		{"hyphenated top-level key", "", []string{"STOREGUARD_METRICS_LISTEN=0.0.0.0:9000"},
			func(c *Config) { c.MetricsListen = "0.0.0.0:9000" }},
		{"empty value is a value", "", []string{"STOREGUARD_METRICS_LISTEN="},
			func(c *Config) { c.MetricsListen = "" }},
		{"env beats file", "mode: monitor\nlimits:\n  max-keys: 10\n", []string{"STOREGUARD_MODE=enforce"},
			func(c *Config) { c.Limits.MaxKeys = 10 }},
		{"lists are comma-separated", "", []string{"STOREGUARD_ACCESS_ALLOW=10.0.0.0/8, 192.168.0.0/16", "STOREGUARD_REPLAY_PORTS=1,2"},
			func(c *Config) {
				c.Access.Allow = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16")}
				c.Replay.Ports = []uint16{1, 2}
			}},
		{"empty list", "access:\n  deny: [10.0.0.0/8]\n", []string{"STOREGUARD_ACCESS_DENY="}, func(*Config) {}},
		{"bool and duration", "", []string{"STOREGUARD_LIMITS_BLOCK_WATCH_KEY=false", "STOREGUARD_TIMEOUTS_IDLE=1h"},
			func(c *Config) { c.Limits.BlockWatchKey, c.Timeouts.Idle = false, time.Hour }},
		{"byte limit back to auto", "limits:\n  max-value-bytes: 1000\n", []string{"STOREGUARD_LIMITS_MAX_VALUE_BYTES=auto"}, func(*Config) {}},
		// Kubernetes injects these for a Service named storeguard.
		{"other STOREGUARD_ variables are ignored", "", []string{"STOREGUARD_PORT=tcp://10.0.0.1:29500", "STOREGUARD_SERVICE_HOST=10.0.0.1", "PATH=/bin"},
			func(*Config) {}},
		{"unrelated variables are ignored", "", []string{"LISTEN=:1", "storeguard_listen=:1"}, func(*Config) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := Default()
			tt.want(&want)
			got := mustLoad(t, tt.yaml, tt.env)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestConfigFileFromEnvAndFlag(t *testing.T) {
	path := writeFile(t, "mode: monitor\n")
	c, err := Load(Options{Env: []string{"STOREGUARD_CONFIG=" + path}})
	if err != nil || c.Mode != ModeMonitor {
		t.Fatalf("$STOREGUARD_CONFIG: mode %q, err %v", c.Mode, err)
	}
	c, err = Load(Options{File: path, Env: []string{"STOREGUARD_CONFIG=/nonexistent.yaml"}})
	if err != nil || c.Mode != ModeMonitor {
		t.Fatalf("File over $STOREGUARD_CONFIG: mode %q, err %v", c.Mode, err)
	}
	if _, err := Load(Options{File: filepath.Join(t.TempDir(), "missing.yaml"), Env: []string{}}); err == nil {
		t.Fatal("a missing file loaded")
	}
}

func TestFileErrors(t *testing.T) {
	for _, content := range []string{"- listen\n", "listen: [\n", "\tlisten: x\n"} {
		path := writeFile(t, content)
		_, err := LoadFile(path)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("LoadFile(%q): %v, want an error naming the file", content, err)
		}
	}
	if c, err := LoadFile(writeFile(t, "mode: monitor\n")); err != nil || c.Mode != ModeMonitor {
		t.Errorf("LoadFile: %+v, %v", c, err)
	}
}

func TestFlagsWin(t *testing.T) {
	file := "listen: \"127.0.0.1:1000\"\nmode: monitor\nlog:\n  level: debug\n"
	env := []string{"STOREGUARD_LISTEN=127.0.0.1:2000", "STOREGUARD_UPSTREAM=127.0.0.1:3000"}
	tests := []struct {
		name  string
		flags []Flag
		want  func(*Config)
	}{
		{"no flags: env over file", nil, func(c *Config) {
			c.Listen, c.Upstream, c.Mode, c.Log.Level = "127.0.0.1:2000", "127.0.0.1:3000", ModeMonitor, slog.LevelDebug
		}},
		{"flag over env and file", []Flag{{"listen", "listen", "127.0.0.1:4000"}, {"mode", "mode", "enforce"}}, func(c *Config) {
			c.Listen, c.Upstream, c.Log.Level = "127.0.0.1:4000", "127.0.0.1:3000", slog.LevelDebug
		}},
		// Given explicitly, a flag wins even when it repeats the built-in default.
		{"flag equal to the default still wins", []Flag{{"log.level", "log-level", "info"}, {"mode", "mode", "enforce"}}, func(c *Config) {
			c.Listen, c.Upstream = "127.0.0.1:2000", "127.0.0.1:3000"
		}},
		{"aliases and empty values", []Flag{{"log.format", "log-format", "text"}, {"metrics-listen", "metrics-listen", ""}}, func(c *Config) {
			c.Listen, c.Upstream, c.Mode, c.Log.Level = "127.0.0.1:2000", "127.0.0.1:3000", ModeMonitor, slog.LevelDebug
			c.Log.Format, c.MetricsListen = LogText, ""
		}},
		{"lists are comma-separated", []Flag{{"access.allow", "allow", "10.0.0.0/8, 10.1.0.0/16"}, {"replay.ports", "ports", "1,2"}}, func(c *Config) {
			c.Listen, c.Upstream, c.Mode, c.Log.Level = "127.0.0.1:2000", "127.0.0.1:3000", ModeMonitor, slog.LevelDebug
			c.Access.Allow = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.0.0/16")}
			c.Replay.Ports = []uint16{1, 2}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := Default()
			tt.want(&want)
			got := mustLoad(t, file, env, tt.flags...)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
		})
	}
	_, err := load(t, "", nil, Flag{"limits", "limits", "5"})
	if fe := findKey(err, "limits"); fe == nil || !strings.Contains(fe.Error(), "is not a setting (flag --limits)") {
		t.Errorf("a flag for a section: %v", err)
	}
}

// One case per rule: the error names the key and says what is wrong.
func TestValidationErrors(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		env     []string
		wantKey string
		wantMsg string
	}{
		// shape
		{"scalar given a list", "listen: [a, b]\n", nil, "listen", "must be a single value"},
		{"section given a scalar", "limits: 5\n", nil, "limits", "must be a mapping"},
		{"list given a scalar", "access:\n  deny: 10.0.0.0/8\n", nil, "access.deny", "must be a list"},
		{"list item not a scalar", "access:\n  deny: [[10.0.0.0/8]]\n", nil, "access.deny[0]", "must be a single value"},
		{"null scalar", "audit-log:\n", nil, "audit-log", "has no value"},
		{"duplicate key", "mode: monitor\nmode: enforce\n", nil, "mode", "appears twice"},
		// types
		{"not an integer", "limits:\n  max-keys: 8k\n", nil, "limits.max-keys", `"8k" is not an integer`},
		{"not a bool", "limits:\n  block-watch-key: yes\n", nil, "limits.block-watch-key", `"yes" is not true or false`},
		{"not a duration", "timeouts:\n  message: abc\n", nil, "timeouts.message", `"abc" is not a duration`},
		{"duration without unit", "timeouts:\n  drain: 30\n", nil, "timeouts.drain", "add a unit, such as 30s"},
		{"not a number", "caps:\n  per-source-rate: fast\n", nil, "caps.per-source-rate", `"fast" is not a number`},
		{"not auto or a count", "caps:\n  max-store-connections: lots\n", nil, "caps.max-store-connections", `"lots" is not auto or an integer`},
		{"not a CIDR", "access:\n  allow: [10.0.0.0/8, 10.0.0/8]\n", nil, "access.allow[1]", `"10.0.0/8" is not a CIDR`},
		{"not a port", "replay:\n  ports: [29500, 70000]\n", nil, "replay.ports[1]", `"70000" is not a port`},
		{"not an identity pattern", "access:\n  deny-identities: [\"spiffe://td/x\", worker-1]\n", nil, "access.deny-identities[1]",
			`"worker-1": not spiffe://, uri:, dns: or cn: followed by a name`},
		{"identity pattern from env", "", []string{"STOREGUARD_ACCESS_DENY_IDENTITIES=dns:*.x, spiffe://"}, "access.deny-identities[1]",
			"no trust domain after spiffe://"},
		{"negative identity cap", "caps:\n  per-identity-connections: -1\n", nil, "caps.per-identity-connections", "must be between 0 and"},
		{"unknown key exchange group", "tls:\n  key-exchange: [x25519, x448]\n", nil, "tls.key-exchange",
			`unknown key exchange group "x448" (want one of x25519mlkem768,`},
		{"key exchange group twice", "", []string{"STOREGUARD_TLS_KEY_EXCHANGE=X25519,x25519"}, "tls.key-exchange",
			`key exchange group "x25519" named twice`},
		{"peer set not three names", "tls:\n  peer-set: storeguard_peers\n", nil, "tls.peer-set", `want "family table set"`},
		{"peer set without TLS", "tls:\n  peer-set: inet storeguard_peers peers\n", nil, "tls.peer-set", "is set while tls.mode is off"},
		{"peer set timeout too short", "tls:\n  peer-set-timeout: 1s\n", nil, "tls.peer-set-timeout", "must be between 4s and 24h, got 1s"},
		// addresses
		{"listen not host:port", "listen: \"29500\"\n", nil, "listen", `did you mean ":29500"?`},
		{"upstream port 0", "upstream: \"127.0.0.1:0\"\n", nil, "upstream", "port must be a number between 1 and 65535"},
		{"upstream is listen", "listen: \":29500\"\nupstream: \"127.0.0.1:29500\"\n", nil, "upstream", "points back at listen"},
		{"upstream is listen via alias", "listen: &a \"127.0.0.2:29500\"\nupstream: *a\n", nil, "upstream", "points back at listen"},
		{"metrics on the listen address", "metrics-listen: \"0.0.0.0:29500\"\n", nil, "metrics-listen", "same address as listen"},
		// enums
		{"generation spelling", "generation: 2.6.x\n", nil, "generation", `"2.6.x" is not a generation`},
		{"generation too old", "generation: \"1.12\"\n", nil, "generation", "older than 1.13"},
		{"generation unknown G", "generation: G8\n", nil, "generation", "is not a generation"},
		{"backend", "backend: uv\n", nil, "backend", `"uv" is not one of auto, legacy, libuv`},
		{"mode", "mode: enforcing\n", nil, "mode", `"enforcing" is not one of enforce, monitor`},
		{"log level", "log:\n  level: verbose\n", nil, "log.level", `"verbose" is not one of debug, info, warn, error`},
		{"log format", "log:\n  format: xml\n", nil, "log.format", `"xml" is not one of json, text`},
		// ranges
		{"max-key-bytes", "limits:\n  max-key-bytes: 0\n", nil, "limits.max-key-bytes", "must be between 1 and 1073741824, got 0"},
		{"max-value-bytes zero", "limits:\n  max-value-bytes: 0\n", nil, "limits.max-value-bytes", "must be auto or a number of bytes of at least 1, got 0"},
		{"max-value-bytes negative", "limits:\n  max-value-bytes: -8\n", nil, "limits.max-value-bytes", "must be auto or a number of bytes of at least 1, got -8"},
		{"max-value-bytes too large", "limits:\n  max-value-bytes: 68719476737\n", nil, "limits.max-value-bytes",
			"must be auto or between 1 and 68719476736, got 68719476737"},
		{"max-value-bytes not a size", "limits:\n  max-value-bytes: big\n", nil, "limits.max-value-bytes", `"big" is neither auto nor a number of bytes`},
		{"max-value-bytes with a unit", "", []string{"STOREGUARD_LIMITS_MAX_VALUE_BYTES=64MiB"}, "limits.max-value-bytes",
			`"64MiB" is neither auto nor a number of bytes (env STOREGUARD_LIMITS_MAX_VALUE_BYTES)`},
		{"max-keys", "limits:\n  max-keys: -1\n", nil, "limits.max-keys", "must be between 1 and"},
		{"max-message-bytes range", "limits:\n  max-message-bytes: 0\n", nil, "limits.max-message-bytes", "must be auto or a number of bytes of at least 1"},
		{"max-message-bytes not a size", "limits:\n  max-message-bytes: lots\n", nil, "limits.max-message-bytes", `"lots" is neither auto nor a number of bytes`},
		{"max-message-bytes fits an auto value's SET", "limits:\n  max-key-bytes: 100\n  max-message-bytes: 8388712\n", nil,
			"limits.max-message-bytes", "must be at least limits.max-key-bytes + limits.max-value-bytes (auto: 8388608 for a libuv store) + 25 = 8388733"},
		{"max-message-bytes fits a SET", "limits:\n  max-key-bytes: 100\n  max-value-bytes: 1000\n  max-message-bytes: 1124\n", nil,
			"limits.max-message-bytes", "must be at least limits.max-key-bytes + limits.max-value-bytes + 25 = 1125"},
		{"upstream-dial", "timeouts:\n  upstream-dial: 0s\n", nil, "timeouts.upstream-dial", "must be positive, got 0s"},
		{"message timeout", "timeouts:\n  message: 0s\n", nil, "timeouts.message", "must be positive"},
		{"first-message", "timeouts:\n  first-message: -1s\n", nil, "timeouts.first-message", "must not be negative, got -1s"},
		{"idle", "timeouts:\n  idle: -1m\n", nil, "timeouts.idle", "must not be negative"},
		{"drain", "timeouts:\n  drain: -1s\n", nil, "timeouts.drain", "must not be negative"},
		{"host bits", "access:\n  deny: [10.1.2.3/8]\n", nil, "access.deny[0]", "has host bits set; did you mean 10.0.0.0/8?"},
		{"IPv4-mapped", "access:\n  allow: [\"::ffff:10.0.0.0/104\"]\n", nil, "access.allow[0]", "IPv4-mapped and would never match; write 10.0.0.0/8"},
		{"max-connections", "caps:\n  max-connections: 0\n", nil, "caps.max-connections", "must be between 1 and"},
		{"per-source-connections", "caps:\n  per-source-connections: -1\n", nil, "caps.per-source-connections", "must be between 0 and"},
		{"max-store-connections", "caps:\n  max-store-connections: -1\n", nil, "caps.max-store-connections", "must be between 0 and"},
		{"per-source-store-connections", "caps:\n  per-source-store-connections: -5\n", nil, "caps.per-source-store-connections", "must be between 0 and"},
		{"per-source-rate", "caps:\n  per-source-rate: -1\n", nil, "caps.per-source-rate", "must be between 0 and"},
		{"per-source-burst", "caps:\n  per-source-burst: -1\n", nil, "caps.per-source-burst", "must be between 0 and"},
		{"burst needed with a rate", "caps:\n  per-source-rate: 5\n  per-source-burst: 0\n", nil, "caps.per-source-burst", "must be at least 1 when caps.per-source-rate is set"},
		{"store-dial-rate", "caps:\n  store-dial-rate: -1\n", nil, "caps.store-dial-rate", "must be between 0 and"},
		{"store-dial-burst", "caps:\n  store-dial-burst: -1\n", nil, "caps.store-dial-burst", "must be between 0 and"},
		{"store dial burst needed with a rate", "caps:\n  store-dial-rate: 100\n  store-dial-burst: 0\n", nil, "caps.store-dial-burst", "must be at least 1 when caps.store-dial-rate is set"},
		{"per-source-store-dial-rate", "caps:\n  per-source-store-dial-rate: 1e10\n", nil, "caps.per-source-store-dial-rate", "must be between 0 and"},
		{"store-dial-rate neither auto nor a number", "caps:\n  store-dial-rate: fast\n", nil, "caps.store-dial-rate", "is not auto or a number"},
		{"store-dial-slow", "caps:\n  store-dial-slow: 5ms\n", nil, "caps.store-dial-slow", "must be between 10ms and 1m0s"},
		{"per-source store dial burst needed with a rate", "caps:\n  per-source-store-dial-burst: 0\n", nil, "caps.per-source-store-dial-burst", "must be at least 1 when caps.per-source-store-dial-rate is set"},
		{"per-source-silent", "caps:\n  per-source-silent: -1\n", nil, "caps.per-source-silent", "must be between 0 and"},
		{"per-prefix-connections", "caps:\n  per-prefix-connections: -1\n", nil, "caps.per-prefix-connections", "must be between 0 and"},
		{"ipv4-prefix", "caps:\n  ipv4-prefix: 33\n", nil, "caps.ipv4-prefix", "must be between 1 and 32"},
		{"ipv6-prefix", "caps:\n  ipv6-prefix: 0\n", nil, "caps.ipv6-prefix", "must be between 1 and 128"},
		{"serving-rate", "ban:\n  serving-rate: -2\n", nil, "ban.serving-rate", "must be between 0 and"},
		{"serving burst needed with a rate", "ban:\n  serving-burst: 0\n", nil, "ban.serving-burst", "must be at least 1 when ban.serving-rate is set"},
		{"buffer budget", "caps:\n  buffer-budget-bytes: 1000000\n", nil, "caps.buffer-budget-bytes", "must be at least limits.max-message-bytes (auto: 33554432)"},
		{"buffer budget for an explicit value", "limits:\n  max-value-bytes: 300000000\n", nil, "caps.buffer-budget-bytes", "must be at least limits.max-message-bytes (auto: 300008217)"},
		{"buffer budget for an explicit message", "limits:\n  max-message-bytes: 300000000\n", nil, "caps.buffer-budget-bytes", "must be at least limits.max-message-bytes (300000000)"},
		{"ban violations", "ban:\n  violations: -1\n", nil, "ban.violations", "must be between 0 and"},
		{"ban window", "ban:\n  window: 0s\n", nil, "ban.window", "must be positive when ban.violations is set (5)"},
		{"ban duration", "ban:\n  duration: 0s\n", nil, "ban.duration", "must be positive when ban.violations is set"},
		{"ban window negative", "ban:\n  violations: 0\n  window: -1s\n", nil, "ban.window", "must not be negative"},
		{"audit max-bytes", "audit:\n  max-bytes: 0\n", nil, "audit.max-bytes", "must be between 1 and"},
		{"audit max-backups", "audit:\n  max-backups: -1\n", nil, "audit.max-backups", "must be between 0 and 10000"},
		{"audit flows-max-bytes", "audit:\n  flows-max-bytes: 0\n", nil, "audit.flows-max-bytes", "must be between 1 and"},
		{"audit flows-max-backups", "audit:\n  flows-max-backups: 10001\n", nil, "audit.flows-max-backups", "must be between 0 and 10000"},
		{"audit sample-first", "audit:\n  sample-first: -1\n", nil, "audit.sample-first", "must be between 0 and"},
		{"audit sample-every", "audit:\n  sample-every: 0\n", nil, "audit.sample-every", "must be between 1 and"},
		{"audit sample-window", "audit:\n  sample-window: 0s\n", nil, "audit.sample-window", "must be positive"},
		{"replay needs a port", "replay:\n  ports: []\n", nil, "replay.ports", "must list at least one port"},
		// origins
		{"bad env value names the variable", "", []string{"STOREGUARD_LIMITS_MAX_KEY_BYTES=0"}, "limits.max-key-bytes",
			"got 0 (env STOREGUARD_LIMITS_MAX_KEY_BYTES)"},
		{"bad env list element names the variable", "", []string{"STOREGUARD_ACCESS_ALLOW=10.0.0.0/8,10.0.0/8"}, "access.allow[1]",
			`"10.0.0/8" is not a CIDR (env STOREGUARD_ACCESS_ALLOW)`},
		{"bad flag value names the flag", "", nil, "mode", "(flag --mode)"},
		{"bad file value names the line", "mode: monitor\nlimits:\n  max-keys: 0\n", nil, "limits.max-keys", "storeguard.yaml:3)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var flags []Flag
			if strings.Contains(tt.name, "flag") {
				flags = []Flag{{Key: "mode", Name: "mode", Value: "off"}}
			}
			c, err := load(t, tt.yaml, tt.env, flags...)
			if err == nil {
				t.Fatalf("loaded %+v, want an error for %s", c, tt.wantKey)
			}
			if !reflect.DeepEqual(c, Config{}) {
				t.Error("a failed Load returned a non-zero Config")
			}
			fe := findKey(err, tt.wantKey)
			if fe == nil {
				t.Fatalf("no error for key %s in:\n%v", tt.wantKey, err)
			}
			if !strings.HasPrefix(fe.Error(), tt.wantKey+": ") || !strings.Contains(fe.Error(), tt.wantMsg) {
				t.Fatalf("error %q, want it to name %s and contain %q", fe, tt.wantKey, tt.wantMsg)
			}
			if n := len(fieldErrors(err)); n != 1 {
				t.Errorf("%d errors, want 1 (no cascades):\n%v", n, err)
			}
		})
	}
}

func TestUnknownKeys(t *testing.T) {
	tests := []struct {
		yaml, wantKey, wantMsg string
	}{
		{"limits:\n  max-key-byte: 5\n", "limits.max-key-byte", "unknown key; did you mean limits.max-key-bytes?"},
		{"max-key-bytes: 5\n", "max-key-bytes", "did you mean limits.max-key-bytes?"},
		{"limits:\n  max_key_bytes: 5\n", "limits.max_key_bytes", "did you mean limits.max-key-bytes?"},
		{"Listen: \":1\"\n", "Listen", "did you mean listen?"},
		{"limit:\n  max-key-bytes: 5\n", "limit", "did you mean limits?"},
		{"metrics_listen: \"\"\n", "metrics_listen", "did you mean metrics-listen?"},
		{"timeouts:\n  handshake: 5s\n", "timeouts.handshake", "known keys here: timeouts.drain, timeouts.first-message, timeouts.idle"},
		{"zzz: 1\n", "zzz", "known keys here: access, audit"},
	}
	for _, tt := range tests {
		t.Run(tt.wantKey, func(t *testing.T) {
			_, err := load(t, tt.yaml, nil)
			fe := findKey(err, tt.wantKey)
			if fe == nil || !strings.Contains(fe.Msg, tt.wantMsg) {
				t.Fatalf("got %v, want %s: ...%s", err, tt.wantKey, tt.wantMsg)
			}
		})
	}
}

func TestAllErrorsReported(t *testing.T) {
	_, err := load(t, "listn: x\nlimits:\n  max-key-bytes: 0\ntimeouts:\n  message: abc\naccess:\n  allow: [10.0.0/8, 1.2.3.4/8]\nlog:\n  format: xml\n", nil)
	want := []string{"listn", "limits.max-key-bytes", "timeouts.message", "access.allow[0]", "access.allow[1]", "log.format"}
	var got []string
	for _, fe := range fieldErrors(err) {
		got = append(got, fe.Key)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("keys %v, want %v\n%v", got, want, err)
	}
}

// Values that do not parse are reported each with its own message, whichever
// layer they come from, and a bad list item leaves no second error behind.
func TestDecodeErrorsFromEveryLayer(t *testing.T) {
	_, err := load(t, "limits:\n  max-keys: 8k\naccess:\n  allow: [1.2.3.4, x]\n",
		[]string{"STOREGUARD_CAPS_PER_SOURCE_RATE=abc"}, Flag{Key: "log.level", Name: "log-level", Value: "INFO+2"})
	want := []string{
		`limits.max-keys: "8k" is not an integer (`,
		`access.allow[1]: "x" is not a CIDR (`,
		`caps.per-source-rate: "abc" is not a number (env STOREGUARD_CAPS_PER_SOURCE_RATE)`,
		`log.level: "INFO+2" is not one of debug, info, warn, error (flag --log-level)`,
	}
	got := fieldErrors(err)
	if len(got) != len(want) {
		t.Fatalf("%d errors, want %d:\n%v", len(got), len(want), err)
	}
	for i, fe := range got {
		if !strings.HasPrefix(fe.Error(), want[i]) {
			t.Errorf("error %d: %q, want %q...", i, fe, want[i])
		}
	}
}

func TestGenerationSpellings(t *testing.T) {
	for _, s := range []string{"auto", "AUTO", "G0", "g3", "G6", "1.13", "2.0", "2.6", "2.6.0", "2.10", "2.99"} {
		if err := checkGeneration(s); err != nil {
			t.Errorf("checkGeneration(%q) = %v", s, err)
		}
	}
	for _, s := range []string{"", "G7", "G8", "G", "G00", "1.12", "3.0", "2.100", "02.6", "2.06", "v2.6", "2", " auto"} {
		if err := checkGeneration(s); err == nil {
			t.Errorf("checkGeneration(%q) accepted", s)
		}
	}
}

func TestYAMLRoundTrip(t *testing.T) {
	custom := Default()
	custom.Listen, custom.Upstream, custom.MetricsListen, custom.AuditLog = "[::]:29500", "store.internal:29500", "", "/var/log/storeguard #1.jsonl"
	custom.Generation, custom.Backend, custom.Mode = "2.10", BackendLegacy, ModeMonitor
	custom.Limits = Limits{100, 1000, 7, 5000, false, true, 5}
	custom.Timeouts = Timeouts{1500 * time.Millisecond, 90 * time.Minute, 10 * time.Second, 36 * time.Hour, 3 * time.Second, 0}
	custom.Access.Allow = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("192.0.2.1/32")}
	custom.Access.Deny = []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}
	custom.Access.DenyIdentities = []string{"spiffe://job.example/ns/old/**", "dns:*.lab.example"}
	custom.Caps = Caps{AutoCount{N: 10}, 0, 0.25, 1, 6, 3, AutoCount{N: 4}, 16, 48, AutoCount{N: 900}, 7, 1 << 20, 1 << 19, 1 << 17, AutoRate{Rate: 2.5}, 3, 250 * time.Millisecond, 0, 1}
	custom.Ban = Ban{ServingRate: 0.5, ServingBurst: 2}
	custom.Audit = Audit{1, 0, 2, 3, 0, 1, time.Second, 0}
	custom.Scan = Scan{3, time.Second}
	custom.Flows = FlowsSuspicious
	custom.Log = Log{slog.LevelError, LogText}
	custom.Replay.Ports = []uint16{1, 65535}
	if err := custom.Validate(); err != nil {
		t.Fatalf("test config invalid: %v", err)
	}
	for name, c := range map[string]Config{"default": Default(), "custom": custom} {
		t.Run(name, func(t *testing.T) {
			out, err := c.YAML()
			if err != nil {
				t.Fatal(err)
			}
			got, err := load(t, string(out), nil)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !reflect.DeepEqual(got, c) {
				t.Fatalf("round trip changed the config\n got %+v\nwant %+v\n%s", got, c, out)
			}
			if !bytes.Contains(out, []byte("max-key-bytes: ")) || !bytes.Contains(out, []byte("# longest key")) {
				t.Errorf("output lacks key names or comments:\n%s", out)
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	for key, want := range map[string]string{
		"limits.max-key-bytes": "STOREGUARD_LIMITS_MAX_KEY_BYTES",
		"metrics-listen":       "STOREGUARD_METRICS_LISTEN",
		"caps.per-source-rate": "STOREGUARD_CAPS_PER_SOURCE_RATE",
	} {
		if got := EnvName(key); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", key, got, want)
		}
	}
	if len(schema.envs) != len(Keys()) { // init panics on a clash; this guards the count
		t.Errorf("%d env names for %d keys", len(schema.envs), len(Keys()))
	}
}

func TestEnvNearMisses(t *testing.T) {
	got := EnvNearMisses([]string{"STOREGUARD_LIMITS_MAX_KEY_BYTE=1", "STOREGUARD_PORT=tcp://x", "STOREGUARD_LISTEN=:1", "STOREGUARD_CONFIG=x"})
	if len(got) != 1 || !strings.Contains(got[0], "did you mean STOREGUARD_LIMITS_MAX_KEY_BYTES?") {
		t.Fatalf("near misses %q", got)
	}
}

// Load shares nothing mutable, so reloads may run beside readers.
func TestConcurrentLoad(t *testing.T) {
	path := writeFile(t, "limits:\n  max-keys: 9\n")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := Load(Options{File: path, Env: []string{"STOREGUARD_MODE=monitor"}})
			if err != nil || c.Limits.MaxKeys != 9 || c.Mode != ModeMonitor {
				t.Errorf("Load: %+v, %v", c, err)
			}
			if _, err := c.YAML(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

func fieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var fe *FieldError
		if errors.As(err, &fe) {
			out = append(out, fe)
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

func findKey(err error, key string) *FieldError {
	for _, fe := range fieldErrors(err) {
		if fe.Key == key {
			return fe
		}
	}
	return nil
}

// Auto byte limits follow the store's backend; numbers apply to every backend. Whatever the
// settings, a maximal SET fits the message limit and the message limit fits the buffer budget.
func TestLimitsFor(t *testing.T) {
	const legacy, libuv, unknown = protocol.BackendLegacy, protocol.BackendLibuv, protocol.BackendAny
	tests := []struct {
		name           string
		yaml           string
		backend        protocol.Backend
		value, message uint64
	}{
		{"default, libuv: libuv's own", "", libuv, 8 << 20, 32 << 20},
		{"default, legacy: a source's share", "", legacy, 64 << 20, 64<<20 + 8192 + 25},
		{"default, backend unknown: the stricter", "", unknown, 8 << 20, 32 << 20},
		{"a number applies to legacy", "limits:\n  max-value-bytes: 16777216\n", legacy, 16 << 20, 32 << 20},
		{"a number applies to libuv", "limits:\n  max-value-bytes: 16777216\n", libuv, 16 << 20, 32 << 20},
		{"an auto message fits a numbered value", "limits:\n  max-value-bytes: 41943040\n", libuv, 40 << 20, 40<<20 + 8192 + 25},
		{"an auto legacy value fits a numbered message", "limits:\n  max-message-bytes: 50000000\n", legacy, 50000000 - 8192 - 25, 50000000},
		{"a numbered message leaves libuv's value", "limits:\n  max-message-bytes: 50000000\n", libuv, 8 << 20, 50000000},
		{"an auto legacy value fits a smaller budget", "caps:\n  buffer-budget-bytes: 50331648\n", legacy, 48<<20 - 8192 - 25, 48 << 20},
		{"the smallest budget allowed", "caps:\n  buffer-budget-bytes: 33554432\n", legacy, 32<<20 - 8192 - 25, 32 << 20},
		{"a longer key grows the auto message", "limits:\n  max-key-bytes: 1048576\n", legacy, 64 << 20, 65<<20 + 25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, tt.yaml, nil)
			lim := c.LimitsFor(tt.backend)
			if lim.MaxValueBytes != tt.value || lim.MaxMessageBytes != tt.message {
				t.Fatalf("value %d, message %d; want %d, %d", lim.MaxValueBytes, lim.MaxMessageBytes, tt.value, tt.message)
			}
			if err := lim.Validate(); err != nil {
				t.Fatal(err)
			}
			if lim.MaxMessageBytes < lim.MaxKeyBytes+lim.MaxValueBytes+compareSetOverhead || lim.MaxMessageBytes > uint64(c.Caps.BufferBudgetBytes) {
				t.Fatalf("message limit %d: a maximal SET (%d) does not fit, or it exceeds the budget %d",
					lim.MaxMessageBytes, lim.MaxKeyBytes+lim.MaxValueBytes+compareSetOverhead, c.Caps.BufferBudgetBytes)
			}
		})
	}
}

// Decoder's limits are the configured backend's; a G0/G1 store is legacy whatever backend says,
// and an unknown backend gets libuv's. LoosestLimits, the probe's, are legacy's unless libuv is set.
func TestDecoderLimits(t *testing.T) {
	tests := []struct {
		generation     string
		backend        Backend
		decoder, probe uint64 // max value bytes
	}{
		{"auto", BackendAuto, 8 << 20, 64 << 20},
		{"auto", BackendLegacy, 64 << 20, 64 << 20},
		{"auto", BackendLibUV, 8 << 20, 8 << 20},
		{"1.13", BackendAuto, 64 << 20, 64 << 20},
		{"2.1", BackendAuto, 64 << 20, 64 << 20},
		{"2.6", BackendAuto, 8 << 20, 64 << 20},
		{"2.6", BackendLegacy, 64 << 20, 64 << 20},
		{"2.6", BackendLibUV, 8 << 20, 8 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.generation+"/"+string(tt.backend), func(t *testing.T) {
			c := Default()
			c.Generation, c.Backend = tt.generation, tt.backend
			dc, err := c.Decoder()
			if err != nil {
				t.Fatal(err)
			}
			if got := dc.Limits.MaxValueBytes; got != tt.decoder {
				t.Errorf("decoder's max value %d, want %d", got, tt.decoder)
			}
			if got := c.LoosestLimits().MaxValueBytes; got != tt.probe {
				t.Errorf("loosest max value %d, want %d", got, tt.probe)
			}
		})
	}
}

// TestPolicyErrorsAllAtOnce: a bad policy mode and a bad policy file are both named, each by its key.
func TestPolicyErrorsAllAtOnce(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "policy.yaml")
	os.WriteFile(bad, []byte("rules:\n  - name: x\n    action: nope\n"), 0o600)
	cfgFile := filepath.Join(dir, "c.yaml")
	os.WriteFile(cfgFile, []byte("policy:\n  file: "+bad+"\n  write-once: maybe\n"), 0o600)
	_, err := Load(Options{File: cfgFile, Env: []string{}})
	if err == nil || !strings.Contains(err.Error(), "policy.write-once") || !strings.Contains(err.Error(), `policy.file: `+bad+`: rules[0] (x): action: "nope"`) {
		t.Fatalf("%v", err)
	}
}

// TestAdmissionIdentities: access.deny-identities and caps.per-identity-connections reach the
// gate's config as the patterns and the cap.
func TestAdmissionIdentities(t *testing.T) {
	c, err := load(t, "access:\n  deny-identities: [\"spiffe://job.example/ns/old/**\", \"dns:*.lab.example\"]\n"+
		"caps:\n  per-identity-connections: 64\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	a := c.Admission()
	if a.PerIdentityConnections != 64 || len(a.DenyIdentities) != 2 {
		t.Fatalf("admission config: cap %d, %d patterns", a.PerIdentityConnections, len(a.DenyIdentities))
	}
	for id, want := range map[string]bool{"spiffe://job.example/ns/old/sa/w": true, "dns:w.lab.example": true,
		"spiffe://job.example/ns/new/sa/w": false} {
		if a.DenyIdentities.Match(id) != want {
			t.Errorf("deny-identities match %s: %v, want %v", id, !want, want)
		}
	}
	if d := Default().Admission(); d.PerIdentityConnections != 0 || len(d.DenyIdentities) != 0 {
		t.Errorf("default admission identities: %+v", d)
	}
}

// caps.max-connections and caps.per-prefix-connections: auto are worked out from this process's
// descriptor limit, per-prefix as half of max; a number is kept, and a number for max halves into
// an auto per-prefix.
func TestConnectionCapsAuto(t *testing.T) {
	c := Default()
	want := admission.ConnectionsFor(admission.FileLimit())
	if m, p := c.Caps.Connections(); m != want || p != want/2 {
		t.Errorf("auto: max-connections %d, per-prefix %d; want %d, %d", m, p, want, want/2)
	}
	c.Caps.MaxConnections = AutoCount{N: 3000}
	if m, p := c.Caps.Connections(); m != 3000 || p != 1500 {
		t.Errorf("max-connections 3000: got %d, per-prefix %d", m, p)
	}
	c.Caps.PerPrefixConnections = AutoCount{N: 0}
	if a := c.Admission(); a.MaxConnections != 3000 || a.PerPrefixConnections != 0 {
		t.Errorf("Admission: max %d, per-prefix %d; want 3000, 0", a.MaxConnections, a.PerPrefixConnections)
	}
}

// TestParsedIsWhatWasValidated: LoadParsed hands over what validating the configuration parsed,
// the policy file's rules included, so serve reads and parses nothing again: a policy file broken
// after the load changes nothing in what was handed over (and Parse, reading it again, refuses it).
func TestParsedIsWhatWasValidated(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte("rules:\n  - name: no-listing\n    ops: [get_num_keys]\n    action: deny\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := "policy:\n  file: " + pol + "\n" +
		"access:\n  deny-identities: [\"dns:*.lab.example\"]\n" +
		"tls:\n  mode: \"on\"\n  cert-file: c.pem\n  key-file: k.pem\n  ca-file: ca.pem\n" +
		"  allow: [\"spiffe://job.example/**\"]\n  key-exchange: [x25519]\n  peer-set: inet sg peers\n  peer-set-timeout: 1m\n"
	path := writeFile(t, yaml)
	p, err := LoadParsed(Options{File: path, Env: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := Load(Options{File: path, Env: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Config(), c) {
		t.Fatal("LoadParsed's configuration differs from Load's")
	}
	if err := os.WriteFile(pol, []byte("rules: [not a rule\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(c); err == nil || !strings.Contains(err.Error(), "policy.file") {
		t.Fatalf("Parse of the broken policy file: %v", err)
	}
	if p.Rules() == nil {
		t.Fatal("no policy handed over")
	}
	dec, err := c.Decoder()
	if err != nil || !reflect.DeepEqual(p.Decoder(), dec) {
		t.Errorf("decoder %+v, want %+v (%v)", p.Decoder(), dec, err)
	}
	if got, want := p.Admission(), c.Admission(); !reflect.DeepEqual(got, want) || len(got.DenyIdentities) != 1 {
		t.Errorf("admission %+v, want %+v", got, want)
	}
	if groups, err := identity.ParseGroups(c.TLS.KeyExchange); err != nil || !reflect.DeepEqual(p.KeyExchange(), groups) {
		t.Errorf("key exchange %v, want %v", p.KeyExchange(), groups)
	}
	if allow, err := identity.ParseAllow(c.TLS.Allow); err != nil || !reflect.DeepEqual(p.Allow(), allow) || allow.Empty() {
		t.Errorf("allow %+v, want %+v", p.Allow(), allow)
	}
	sp, on := p.PeerSet()
	if want, err := nftset.Parse(c.TLS.PeerSet); err != nil || !on || !reflect.DeepEqual(sp, want) {
		t.Errorf("peer set %+v %t, want %+v", sp, on, want)
	}
}
