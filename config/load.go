package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// Options say where Load looks. The zero value loads the defaults plus the
// process environment.
type Options struct {
	// File is a YAML config file. If empty, the --config flag in Flags is
	// used, then $STOREGUARD_CONFIG; if all are empty, no file is read.
	File string
	// Flags are the command's flags, parsed. Only flags that were given
	// count; a flag counts if its name is a key ("listen", "mode") or one
	// of the aliases AddServeFlags registers ("log-level" → log.level).
	Flags *pflag.FlagSet
	// Env is the environment as "NAME=value" pairs; nil means os.Environ().
	// Pass an empty, non-nil slice to ignore the environment.
	Env []string
}

// LoadFile loads path over the defaults, with the process environment on top.
func LoadFile(path string) (Config, error) {
	return Load(Options{File: path})
}

// Load builds a Config from, lowest precedence first: the embedded default,
// the YAML file, STOREGUARD_* environment variables, and the given flags.
// It reports every problem at once, joined, each a *FieldError naming its key.
// Load keeps no state; to reload, call it again with the same Options.
func Load(opts Options) (Config, error) {
	env := opts.Env
	if env == nil {
		env = os.Environ()
	}
	path := configPath(opts, env)

	v := viper.New()
	for _, key := range schema.leaves {
		v.SetDefault(key, defaultValues[key])
	}
	origins := map[string]string{}
	var errs []error

	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("config file: %w", err)
		}
		root, err := parseDoc(data)
		if err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", path, err)
		}
		p := fileParser{path: path, origins: origins}
		m := p.mapping(root, "")
		errs = append(errs, p.errs...)
		if err := v.MergeConfigMap(m); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", path, err)
		}
	}

	// Env goes into viper's config layer above the file rather than through
	// AutomaticEnv, which can only read the process environment.
	if err := v.MergeConfigMap(envSettings(env, origins)); err != nil {
		return Config{}, fmt.Errorf("environment: %w", err)
	}

	if opts.Flags != nil {
		var bindErr error
		opts.Flags.Visit(func(f *pflag.Flag) { // Visit sees only flags that were given
			key := flagKey(f.Name)
			if key == "" {
				return
			}
			if err := v.BindPFlag(key, f); err != nil {
				bindErr = err
			}
			origins[key] = "flag --" + f.Name
		})
		if bindErr != nil {
			return Config{}, bindErr
		}
	}

	// Values that fail to decode keep their default, so validation below
	// reports only what is really wrong rather than a cascade of zeros.
	c := Default()
	d := decoder{get: v.Get}
	d.decode(&c)
	errs = append(errs, d.errs...)
	for _, err := range c.validate() {
		// A key that failed to decode holds a placeholder; say so once.
		if !d.failed(err.(*FieldError).Key) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		for _, err := range errs {
			var fe *FieldError
			if errors.As(err, &fe) && fe.Origin == "" {
				fe.Origin = origin(origins, fe.Key)
			}
		}
		sort.SliceStable(errs, func(i, j int) bool { return keyRank(errs[i]) < keyRank(errs[j]) })
		return Config{}, errors.Join(errs...)
	}
	return c, nil
}

// keyRank orders errors as the keys appear in the default file, unknown
// keys first.
func keyRank(err error) int {
	fe, ok := err.(*FieldError)
	if !ok {
		return -1
	}
	key, _, _ := strings.Cut(fe.Key, "[")
	for i, leaf := range schema.leaves {
		if leaf == key || strings.HasPrefix(leaf, key+".") {
			return i
		}
	}
	return -1
}

func configPath(opts Options, env []string) string {
	if opts.File != "" {
		return opts.File
	}
	if opts.Flags != nil {
		if f := opts.Flags.Lookup("config"); f != nil && f.Value.String() != "" {
			return f.Value.String()
		}
	}
	for i := len(env) - 1; i >= 0; i-- { // the last assignment wins, as in a shell
		if name, val, ok := strings.Cut(env[i], "="); ok && name == envConfig {
			return val
		}
	}
	return ""
}

// origin finds where key's value came from, falling back from a list element
// to its list.
func origin(origins map[string]string, key string) string {
	if o, ok := origins[key]; ok {
		return o
	}
	if i := strings.IndexByte(key, '['); i >= 0 {
		return origins[key[:i]]
	}
	return ""
}

// envSettings turns the STOREGUARD_* variables that name keys into a nested
// map. Other STOREGUARD_* variables are ignored, not errors: Kubernetes
// injects STOREGUARD_PORT, STOREGUARD_SERVICE_HOST… into every pod of a
// namespace with a Service named storeguard. `config check` lists near misses.
func envSettings(env []string, origins map[string]string) map[string]any {
	out := map[string]any{}
	for _, kv := range env {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, envPrefix) {
			continue
		}
		key, ok := schema.envs[name]
		if !ok {
			continue
		}
		var value any = val
		if schema.kinds[key] == kindList {
			value = splitList(val)
		}
		setNested(out, key, value)
		origins[key] = "env " + name
	}
	return out
}

// envNearMisses describes STOREGUARD_* variables that look like misspelt keys.
func envNearMisses(env []string) []string {
	// Compare without the shared prefix, or every short name looks close.
	names := make([]string, 0, len(schema.envs))
	for n := range schema.envs {
		names = append(names, strings.TrimPrefix(n, envPrefix))
	}
	sort.Strings(names)
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || name == envConfig || schema.envs[name] != "" {
			continue
		}
		if s := suggest(strings.TrimPrefix(name, envPrefix), names); s != "" {
			s = strings.Replace(s, "did you mean ", "did you mean "+envPrefix, 1)
			out = append(out, fmt.Sprintf("%s is not a setting and is ignored%s", name, s))
		}
	}
	return out
}

// splitList reads "a, b,c" as a list; "" is the empty list.
func splitList(s string) []any {
	out := []any{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func setNested(m map[string]any, key string, value any) {
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		sub, ok := m[p].(map[string]any)
		if !ok {
			sub = map[string]any{}
			m[p] = sub
		}
		m = sub
	}
	m[parts[len(parts)-1]] = value
}

// fileParser checks a YAML document against the schema and turns it into a
// nested map for viper. Scalars keep their literal text (so generation: 2.10
// stays "2.10", not the float 2.1); the decoder parses them per key.
type fileParser struct {
	path    string
	origins map[string]string
	errs    []error
}

func (p *fileParser) fail(n *yaml.Node, key, format string, args ...any) {
	fe := fieldErr(key, format, args...)
	fe.Origin = p.where(n)
	p.errs = append(p.errs, fe)
}

func (p *fileParser) where(n *yaml.Node) string {
	if p.path == "" {
		return fmt.Sprintf("line %d", n.Line)
	}
	return fmt.Sprintf("%s:%d", p.path, n.Line)
}

func (p *fileParser) mapping(n *yaml.Node, prefix string) map[string]any {
	out := map[string]any{}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], deref(n.Content[i+1])
		key := join(prefix, kn.Value)
		if seen[kn.Value] {
			p.fail(kn, key, "appears twice")
			continue
		}
		seen[kn.Value] = true
		p.origins[key] = p.where(kn)
		switch schema.kinds[key] {
		case kindUnknown:
			msg := "unknown key" + suggest(key, knownKeys())
			if !strings.Contains(msg, "?") {
				msg += "; known keys here: " + strings.Join(siblings(prefix), ", ")
			}
			p.fail(kn, key, "%s", msg)
		case kindSection:
			switch {
			case vn.Kind == yaml.MappingNode:
				out[kn.Value] = p.mapping(vn, key)
			case isNull(vn): // "limits:" with nothing under it changes nothing
			default:
				p.fail(vn, key, "must be a mapping of %s.* keys", key)
			}
		case kindList:
			switch {
			case vn.Kind == yaml.SequenceNode:
				items := []any{}
				for j, item := range vn.Content {
					item = deref(item)
					ik := fmt.Sprintf("%s[%d]", key, j)
					p.origins[ik] = p.where(item)
					if item.Kind != yaml.ScalarNode || isNull(item) {
						p.fail(item, ik, "must be a single value")
						continue
					}
					items = append(items, item.Value)
				}
				out[kn.Value] = items
			case isNull(vn): // "allow:" with no items is the empty list
				out[kn.Value] = []any{}
			default:
				p.fail(vn, key, "must be a list, such as [a, b]")
			}
		case kindScalar:
			switch {
			case vn.Kind != yaml.ScalarNode:
				p.fail(vn, key, "must be a single value, not a list or mapping")
			case isNull(vn):
				p.fail(vn, key, "has no value; write \"\" for an empty string, or remove the key for the default")
			default:
				out[kn.Value] = vn.Value
			}
		}
	}
	return out
}

func knownKeys() []string {
	keys := make([]string, 0, len(schema.kinds))
	for k := range schema.kinds {
		keys = append(keys, k)
	}
	sort.Strings(keys) // ties in suggest go to the first, so keep it stable
	return keys
}

func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// flagAliases map flag names that are not keys themselves.
var flagAliases = map[string]string{
	"log-level":  "log.level",
	"log-format": "log.format",
}

func flagKey(name string) string {
	if k, ok := flagAliases[name]; ok {
		return k
	}
	if k := schema.kinds[name]; k == kindScalar || k == kindList {
		return name
	}
	return ""
}

// decoder reads each key from get and parses it into a Config field. On a
// parse error the field keeps its previous value and the error is recorded.
// Values arrive as strings (file, env, string flags) or as the Go types
// viper gives typed flags.
type decoder struct {
	get  func(key string) any
	errs []error
}

func (d *decoder) decode(c *Config) {
	d.str("listen", &c.Listen)
	d.str("upstream", &c.Upstream)
	d.str("metrics-listen", &c.MetricsListen)
	d.str("audit-log", &c.AuditLog)
	d.str("generation", &c.Generation)
	d.lower("backend", (*string)(&c.Backend))
	d.lower("mode", (*string)(&c.Mode))
	d.int("event-loops", &c.EventLoops)

	d.int64("limits.max-key-bytes", &c.Limits.MaxKeyBytes)
	d.int64("limits.max-value-bytes", &c.Limits.MaxValueBytes)
	d.int64("limits.max-keys", &c.Limits.MaxKeys)
	d.int64("limits.max-message-bytes", &c.Limits.MaxMessageBytes)
	d.bool("limits.block-watch-key", &c.Limits.BlockWatchKey)
	d.bool("limits.reject-zero-count", &c.Limits.RejectZeroCount)

	d.duration("timeouts.upstream-dial", &c.Timeouts.UpstreamDial)
	d.duration("timeouts.message", &c.Timeouts.Message)
	d.duration("timeouts.first-message", &c.Timeouts.FirstMessage)
	d.duration("timeouts.idle", &c.Timeouts.Idle)
	d.duration("timeouts.drain", &c.Timeouts.Drain)

	d.prefixes("access.allow", &c.Access.Allow)
	d.prefixes("access.deny", &c.Access.Deny)

	d.int("caps.max-connections", &c.Caps.MaxConnections)
	d.int("caps.per-source-connections", &c.Caps.PerSourceConnections)
	d.float("caps.per-source-rate", &c.Caps.PerSourceRate)
	d.int("caps.per-source-burst", &c.Caps.PerSourceBurst)
	d.int64("caps.buffer-budget-bytes", &c.Caps.BufferBudgetBytes)

	d.int("ban.violations", &c.Ban.Violations)
	d.duration("ban.window", &c.Ban.Window)
	d.duration("ban.duration", &c.Ban.Duration)

	d.int64("audit.max-bytes", &c.Audit.MaxBytes)
	d.int("audit.max-backups", &c.Audit.MaxBackups)
	d.int("audit.sample-first", &c.Audit.SampleFirst)
	d.int("audit.sample-every", &c.Audit.SampleEvery)
	d.duration("audit.sample-window", &c.Audit.SampleWindow)

	d.level("log.level", &c.Log.Level)
	d.lower("log.format", (*string)(&c.Log.Format))

	d.ports("replay.ports", &c.Replay.Ports)
}

func (d *decoder) fail(key, format string, args ...any) {
	d.errs = append(d.errs, fieldErr(key, format, args...))
}

func (d *decoder) failed(key string) bool {
	for _, err := range d.errs {
		if err.(*FieldError).Key == key {
			return true
		}
	}
	return false
}

// scalar returns key's value as text; ok is false (and an error recorded)
// for a list or mapping.
func (d *decoder) scalar(key string) (string, bool) {
	switch v := d.get(key).(type) {
	case nil:
		return "", true
	case string:
		return v, true
	case bool, int, int64, float64, time.Duration:
		return fmt.Sprint(v), true
	default:
		d.fail(key, "must be a single value, got %v", v)
		return "", false
	}
}

func (d *decoder) str(key string, dst *string) {
	if s, ok := d.scalar(key); ok {
		*dst = s
	}
}

func (d *decoder) lower(key string, dst *string) {
	if s, ok := d.scalar(key); ok {
		*dst = strings.ToLower(strings.TrimSpace(s))
	}
}

func (d *decoder) int64(key string, dst *int64) {
	s, ok := d.scalar(key)
	if !ok {
		return
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		d.fail(key, "%q is not an integer", s)
		return
	}
	*dst = n
}

func (d *decoder) int(key string, dst *int) {
	var n int64
	before := len(d.errs)
	d.int64(key, &n)
	if len(d.errs) > before {
		return
	}
	if n < math.MinInt32 || n > math.MaxInt32 {
		d.fail(key, "%d is far too large", n)
		return
	}
	*dst = int(n)
}

func (d *decoder) float(key string, dst *float64) {
	s, ok := d.scalar(key)
	if !ok {
		return
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		d.fail(key, "%q is not a number", s)
		return
	}
	*dst = f
}

func (d *decoder) bool(key string, dst *bool) {
	s, ok := d.scalar(key)
	if !ok {
		return
	}
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true":
		*dst = true
	case "false":
		*dst = false
	default:
		d.fail(key, "%q is not true or false", s)
	}
}

func (d *decoder) duration(key string, dst *time.Duration) {
	s, ok := d.scalar(key)
	if !ok {
		return
	}
	t, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		if _, nerr := strconv.ParseFloat(strings.TrimSpace(s), 64); nerr == nil {
			d.fail(key, "%q is not a duration; add a unit, such as %ss", s, strings.TrimSpace(s))
			return
		}
		d.fail(key, "%q is not a duration (such as 500ms, 30s, 10m, 2h)", s)
		return
	}
	*dst = t
}

func (d *decoder) level(key string, dst *slog.Level) {
	s, ok := d.scalar(key)
	if !ok {
		return
	}
	for _, ll := range logLevels {
		if strings.EqualFold(strings.TrimSpace(s), ll.name) {
			*dst = ll.level
			return
		}
	}
	d.fail(key, "%q is not one of debug, info, warn, error", s)
}

// list returns key's elements as text. Viper hands back []any from the file
// and env layers and []string from slice flags; a lone string is one
// comma-separated list, as in the environment.
func (d *decoder) list(key string) ([]string, bool) {
	switch v := d.get(key).(type) {
	case nil:
		return nil, true
	case []any:
		out := make([]string, len(v))
		for i, e := range v {
			out[i] = fmt.Sprint(e)
		}
		return out, true
	case []string:
		return v, true
	case []int:
		out := make([]string, len(v))
		for i, e := range v {
			out[i] = strconv.Itoa(e)
		}
		return out, true
	case string:
		var out []string
		for _, e := range splitList(v) {
			out = append(out, e.(string))
		}
		return out, true
	default:
		d.fail(key, "must be a list, got %v", v)
		return nil, false
	}
}

func (d *decoder) prefixes(key string, dst *[]netip.Prefix) {
	items, ok := d.list(key)
	if !ok {
		return
	}
	var out []netip.Prefix
	for i, s := range items {
		s = strings.TrimSpace(s)
		p, err := netip.ParsePrefix(s)
		if err != nil {
			// A bare address is a one-address prefix.
			a, aerr := netip.ParseAddr(s)
			if aerr != nil || a.Zone() != "" {
				d.fail(fmt.Sprintf("%s[%d]", key, i), "%q is not a CIDR", s)
			} else {
				p = netip.PrefixFrom(a, a.BitLen())
			}
		}
		out = append(out, p) // the zero Prefix holds a bad element's place
	}
	*dst = out
}

func (d *decoder) ports(key string, dst *[]uint16) {
	items, ok := d.list(key)
	if !ok {
		return
	}
	var out []uint16
	for i, s := range items {
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
		if err != nil || n == 0 {
			d.fail(fmt.Sprintf("%s[%d]", key, i), "%q is not a port (1 to 65535)", s)
		}
		out = append(out, uint16(n))
	}
	*dst = out
}
