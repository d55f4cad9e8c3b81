package config

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// readFile reads the YAML file at path into a nested map for viper. The
// error is for a file that cannot be read or parsed; errs are problems with
// single keys, reported with the rest.
func readFile(path string, origins map[string]string) (settings map[string]any, errs []error, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config file: %w", err)
	}
	root, err := parseDoc(data)
	if err != nil {
		return nil, nil, fmt.Errorf("config file %s: %w", path, err)
	}
	p := fileParser{path: path, origins: origins}
	settings = p.mapping(root, "")
	return settings, p.errs, nil
}

// fileParser checks a YAML document against the schema and turns it into a
// nested map for viper's config layer. It stands in for viper's own reading
// (ReadConfig), which lower-cases keys ("Listen:" would pass unseen), types
// scalars (generation: 2.10 would become the float 2.1), keeps no line for
// errors to name, and fails the whole file on a duplicate key. Scalars keep
// their literal text; decodeHook parses them per field.
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
