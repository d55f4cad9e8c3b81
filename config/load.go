package config

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
)

// Options say where Load looks. The zero value loads the defaults plus the
// process environment.
type Options struct {
	// File is a YAML config file. If empty, $STOREGUARD_CONFIG in Env names
	// it; if both are empty, no file is read.
	File string
	// Env is the environment as "NAME=value" pairs; nil means os.Environ().
	// Pass an empty, non-nil slice to ignore the environment.
	Env []string
	// Flags are the settings given on the command line, the highest layer.
	Flags []Flag
}

// Flag is one setting given on the command line.
type Flag struct {
	Key   string // the key it sets: "log.level"
	Name  string // the flag as typed, named in errors: "log-level"
	Value string // its text; a list is comma-separated, as in the environment
}

// Path returns the config file Load reads: File, else $STOREGUARD_CONFIG;
// "" for none.
func (o Options) Path() string {
	if o.File != "" {
		return o.File
	}
	env := o.environ()
	for i := len(env) - 1; i >= 0; i-- { // the last assignment wins, as in a shell
		if name, val, ok := strings.Cut(env[i], "="); ok && name == envConfig {
			return val
		}
	}
	return ""
}

func (o Options) environ() []string {
	if o.Env == nil {
		return os.Environ()
	}
	return o.Env
}

// LoadFile loads path over the defaults, with the process environment on top.
func LoadFile(path string) (Config, error) {
	return Load(Options{File: path})
}

// Load builds a Config from, lowest precedence first: the embedded default,
// the YAML file, STOREGUARD_* environment variables, and the given flags.
// Viper holds the layers and unmarshals the result; decodeHook parses each
// value. It reports every problem at once, joined, each a *FieldError naming
// its key. Load keeps no state; to reload, call it again with the same Options.
func Load(opts Options) (Config, error) {
	p, err := LoadParsed(opts)
	if err != nil {
		return Config{}, err
	}
	return p.cfg, nil
}

// LoadParsed is Load, with what validating the configuration parsed (Parsed): what serve runs on.
func LoadParsed(opts Options) (*Parsed, error) {
	env := opts.environ()
	v := newViper()
	origins := map[string]string{}
	var errs []error

	if path := opts.Path(); path != "" {
		settings, fileErrs, err := readFile(path, origins)
		if err != nil {
			return nil, err
		}
		errs = append(errs, fileErrs...)
		if err := v.MergeConfigMap(settings); err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
	}

	// Env goes into viper's config layer above the file rather than through
	// AutomaticEnv, which can only read the process environment.
	if err := v.MergeConfigMap(envSettings(env, origins)); err != nil {
		return nil, fmt.Errorf("environment: %w", err)
	}

	for _, f := range opts.Flags {
		given := "flag --" + f.Name
		if k := schema.kinds[f.Key]; k != kindScalar && k != kindList {
			errs = append(errs, &FieldError{Key: f.Key, Msg: "is not a setting", Origin: given})
			continue
		}
		if err := v.BindFlagValue(f.Key, flagValue(f.Value)); err != nil {
			return nil, err
		}
		origins[f.Key] = given
	}

	c, decodeErrs := decode(v)
	errs = append(errs, decodeErrs...)

	failed := map[string]bool{}
	for _, err := range decodeErrs {
		if fe, ok := err.(*FieldError); ok {
			failed[fe.Key] = true
		}
	}
	p := &Parsed{cfg: c}
	for _, err := range c.validate(p) {
		// A key that failed to decode holds its zero value; say so once.
		if !failed[err.(*FieldError).Key] {
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
		return nil, errors.Join(errs...)
	}
	if err := p.finish(); err != nil {
		return nil, err
	}
	return p, nil
}

// newViper returns a viper holding the embedded defaults, its lowest layer.
func newViper() *viper.Viper {
	v := viper.New()
	for _, key := range schema.leaves {
		v.SetDefault(key, defaultValues[key])
	}
	return v
}

// decode unmarshals v's settings into a Config, each value parsed by
// decodeHook. Every key has a field and every field a key (the embedded
// default, decoded at start-up, proves it). A value that does not parse
// leaves its field zero and comes back as a *FieldError naming its key.
func decode(v *viper.Viper) (Config, []error) {
	var c Config
	err := v.UnmarshalExact(&c, viper.DecodeHook(decodeHook), func(dc *mapstructure.DecoderConfig) {
		dc.ErrorUnset = true
	})
	var errs []error
	// mapstructure wraps a join of one *DecodeError per field that failed.
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		case *mapstructure.DecodeError:
			errs = append(errs, &FieldError{Key: e.Name(), Msg: e.Unwrap().Error()})
		default:
			if inner := errors.Unwrap(err); inner != nil {
				walk(inner)
			} else {
				errs = append(errs, err)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return c, errs
}

// flagValue is a command-line setting as viper reads flags: given, and text.
type flagValue string

func (f flagValue) HasChanged() bool    { return true }
func (f flagValue) Name() string        { return "" } // viper binds it by key
func (f flagValue) ValueString() string { return string(f) }
func (f flagValue) ValueType() string   { return "string" }

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
// map of their text. Other STOREGUARD_* variables are ignored, not errors:
// Kubernetes injects STOREGUARD_PORT, STOREGUARD_SERVICE_HOST… into every
// pod of a namespace with a Service named storeguard. EnvNearMisses lists
// the ones that look misspelt.
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
		setNested(out, key, val)
		origins[key] = "env " + name
	}
	return out
}

// EnvNearMisses describes the STOREGUARD_* variables in env that are not
// settings but look like misspelt ones.
func EnvNearMisses(env []string) []string {
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
