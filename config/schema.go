package config

import (
	_ "embed"
	"fmt"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// defaultYAML holds every key with its default. It is the schema too: a key
// is known if and only if it appears here. configs/storeguard.yaml is a copy
// (a test keeps the two identical).
//
//go:embed default.yaml
var defaultYAML []byte

type kind int

const (
	kindUnknown kind = iota
	kindSection      // a mapping of further keys
	kindScalar
	kindList
)

// schema is derived from defaultYAML once, at start-up.
type schemaInfo struct {
	kinds  map[string]kind   // dotted key → kind, sections included
	leaves []string          // leaf keys in file order
	envs   map[string]string // STOREGUARD_… → leaf key
}

var (
	schema        schemaInfo
	defaultValues map[string]any // leaf key → string or []any of strings, as read from defaultYAML
	defaultConfig Config
)

func init() {
	root, err := parseDoc(defaultYAML)
	if err != nil {
		panic("config: embedded default.yaml: " + err.Error())
	}
	schema = schemaInfo{kinds: map[string]kind{}, envs: map[string]string{}}
	schema.add(root, "")
	p := fileParser{origins: map[string]string{}}
	defaultValues = flatten(p.mapping(root, ""), "")
	if len(p.errs) > 0 {
		panic(fmt.Sprintf("config: embedded default.yaml: %v", p.errs))
	}
	// Decoding the default also proves Config and default.yaml agree: decode
	// fails on a key without a field and on a field without a key.
	c, errs := decode(newViper())
	if errs = append(errs, c.validate(&Parsed{})...); len(errs) > 0 {
		panic(fmt.Sprintf("config: embedded default.yaml is invalid: %v", errs))
	}
	defaultConfig = c
}

func (s *schemaInfo) add(n *yaml.Node, prefix string) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		key := join(prefix, n.Content[i].Value)
		v := n.Content[i+1]
		switch v.Kind {
		case yaml.MappingNode:
			s.kinds[key] = kindSection
			s.add(v, key)
			continue
		case yaml.SequenceNode:
			s.kinds[key] = kindList
		default:
			s.kinds[key] = kindScalar
		}
		s.leaves = append(s.leaves, key)
		env := EnvName(key)
		if other, dup := s.envs[env]; dup {
			panic(fmt.Sprintf("config: keys %s and %s share the env name %s", other, key, env))
		}
		s.envs[env] = key
	}
}

// EnvName is the environment variable that sets key:
// "limits.max-key-bytes" → "STOREGUARD_LIMITS_MAX_KEY_BYTES".
func EnvName(key string) string {
	return envPrefix + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

const (
	envPrefix = "STOREGUARD_"
	// envConfig names the config file when neither Options.File nor
	// --config gives one. It is not a config key.
	envConfig = envPrefix + "CONFIG"
)

// Keys returns every leaf key, in the order of the default file.
func Keys() []string { return append([]string(nil), schema.leaves...) }

// DefaultYAML returns the embedded default file: every key with its default
// and a comment.
func DefaultYAML() []byte { return append([]byte(nil), defaultYAML...) }

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

func parseDoc(data []byte) (*yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return &yaml.Node{Kind: yaml.MappingNode}, nil // empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: the top level must be a mapping of keys", root.Line)
	}
	return root, nil
}

// flatten turns nested maps into dotted keys.
func flatten(m map[string]any, prefix string) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			for sk, sv := range flatten(sub, join(prefix, k)) {
				out[sk] = sv
			}
			continue
		}
		out[join(prefix, k)] = v
	}
	return out
}

// suggest names the known key closest to an unknown one, or lists the keys
// that could have been meant.
func suggest(unknown string, candidates []string) string {
	u := strings.ToLower(unknown)
	best, bestScore := "", -1
	limit := max(1, len(lastPart(u))/3)
	consider := func(c string, dist int, of string) {
		if dist > limit {
			return
		}
		// Whole-key matches beat the right name in the wrong section.
		score := 2 * dist
		if of != u {
			score++
		}
		if bestScore < 0 || score < bestScore {
			best, bestScore = c, score
		}
	}
	for _, c := range candidates {
		lc := strings.ToLower(c)
		consider(c, levenshtein(u, lc), u)
		consider(c, levenshtein(lastPart(u), lastPart(lc)), lastPart(u))
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %s?", best)
}

// siblings lists the known keys directly under section ("" for the top).
func siblings(section string) []string {
	var out []string
	for k := range schema.kinds {
		parent := ""
		if i := strings.LastIndexByte(k, '.'); i >= 0 {
			parent = k[:i]
		}
		if parent == section {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func lastPart(key string) string {
	return key[strings.LastIndexByte(key, '.')+1:]
}

func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
