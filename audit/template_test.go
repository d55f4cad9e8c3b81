package audit_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/netip"
	"os"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/storeguard/storeguard/audit"
)

const templatePath = "../configs/elastic/storeguard-template.json"

// indexTemplate is the part of a composable index template the checks read.
type indexTemplate struct {
	IndexPatterns []string       `json:"index_patterns"`
	Meta          map[string]any `json:"_meta"`
	Template      struct {
		Mappings struct {
			Dynamic          any                          `json:"dynamic"`
			DynamicTemplates []map[string]dynamicTemplate `json:"dynamic_templates"`
			Properties       map[string]json.RawMessage   `json:"properties"`
		} `json:"mappings"`
	} `json:"template"`
}

type dynamicTemplate struct {
	PathMatch string  `json:"path_match"`
	Mapping   mapping `json:"mapping"`
}

type mapping struct {
	Type       string                     `json:"type"`
	Dynamic    any                        `json:"dynamic"`
	Properties map[string]json.RawMessage `json:"properties"`
}

// field is one mapped path of the template: a leaf with its type, or an object.
type field struct {
	typ     string // "object" for an object
	dynamic string // objects: "strict", "true", "false", or "" to inherit
}

type mappedTemplate struct {
	raw      indexTemplate
	fields   map[string]field // by full dotted path
	dynamics []dynamicTemplate
	rootDyn  string
}

func loadTemplate(t *testing.T) *mappedTemplate {
	t.Helper()
	b, err := os.ReadFile(templatePath)
	if err != nil {
		t.Fatal(err)
	}
	var raw indexTemplate
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		// Unknown keys are fine for Elasticsearch; this test just reads a few.
		if err := json.Unmarshal(b, &raw); err != nil {
			t.Fatalf("%s: %v", templatePath, err)
		}
	}
	m := &mappedTemplate{raw: raw, fields: map[string]field{}, rootDyn: dynString(raw.Template.Mappings.Dynamic)}
	for _, dt := range raw.Template.Mappings.DynamicTemplates {
		for _, d := range dt {
			m.dynamics = append(m.dynamics, d)
		}
	}
	if err := m.add("", raw.Template.Mappings.Properties); err != nil {
		t.Fatalf("%s: %v", templatePath, err)
	}
	return m
}

func (m *mappedTemplate) add(prefix string, props map[string]json.RawMessage) error {
	for name, rawMapping := range props {
		var mp mapping
		if err := json.Unmarshal(rawMapping, &mp); err != nil {
			return fmt.Errorf("%s%s: %v", prefix, name, err)
		}
		p := prefix + name
		if mp.Type == "" || mp.Type == "object" {
			m.fields[p] = field{typ: "object", dynamic: dynString(mp.Dynamic)}
			if err := m.add(p+".", mp.Properties); err != nil {
				return err
			}
			continue
		}
		m.fields[p] = field{typ: mp.Type}
	}
	return nil
}

func dynString(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case bool:
		return strconv.FormatBool(v)
	case string:
		return v
	}
	return fmt.Sprint(v)
}

// resolve is the mapping type Elasticsearch would index the leaf at path p with, as a mapped
// field or through a dynamic template; an error when it would reject it (an unmapped field where
// dynamic is strict) or guess its type (dynamic without a template).
func (m *mappedTemplate) resolve(p string) (string, error) {
	if f, ok := m.fields[p]; ok {
		if f.typ == "object" {
			return "", fmt.Errorf("%s is mapped as an object, the event has a value there", p)
		}
		return f.typ, nil
	}
	// The nearest mapped ancestor decides; each must be an object.
	dyn := m.rootDyn
	parts := strings.Split(p, ".")
	for i := 1; i < len(parts); i++ {
		f, ok := m.fields[strings.Join(parts[:i], ".")]
		if !ok {
			break
		}
		if f.typ != "object" {
			return "", fmt.Errorf("%s is under %s, which is mapped as %s", p, strings.Join(parts[:i], "."), f.typ)
		}
		if f.dynamic != "" {
			dyn = f.dynamic
		}
	}
	switch dyn {
	case "strict":
		return "", fmt.Errorf("%s is not mapped, and dynamic is strict there: Elasticsearch rejects the event", p)
	case "false":
		return "", fmt.Errorf("%s is not mapped, and dynamic is false there: kept in _source, never indexed", p)
	}
	for _, d := range m.dynamics {
		if simpleMatch(d.PathMatch, p) {
			return d.Mapping.Type, nil
		}
	}
	return "", fmt.Errorf("%s is not mapped and no dynamic template matches it: Elasticsearch would guess its type", p)
}

// simpleMatch is Elasticsearch's path_match: * stands for any run of characters, dots and
// slashes included.
func simpleMatch(pattern, s string) bool {
	if pattern == "" {
		return false
	}
	parts := strings.Split(pattern, "*")
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return len(parts) == 1 && s == "" || len(parts) > 1 && strings.HasSuffix(s, last)
}

// leaves expands a document's dotted keys and objects into leaf paths, as Elasticsearch does.
func leaves(prefix string, v any, f func(string, any)) {
	if m, ok := v.(map[string]any); ok {
		for k, e := range m {
			leaves(strings.TrimPrefix(prefix+"."+k, "."), e, f)
		}
		return
	}
	f(prefix, v)
}

var maxUint64 = new(big.Int).SetUint64(1<<64 - 1)

// accepts says whether Elasticsearch indexes v in a field of mapping type typ, coercing as it
// does by default (coerce: true): numeric strings into numeric fields. Stricter than
// Elasticsearch in one way: a fraction in an integer field is an error here, where
// Elasticsearch would truncate it.
func accepts(typ string, v any) error {
	if a, ok := v.([]any); ok {
		for _, e := range a {
			if err := accepts(typ, e); err != nil {
				return err
			}
		}
		return nil
	}
	var num string
	switch v := v.(type) {
	case json.Number:
		num = v.String()
	case string:
		num = v
	}
	switch typ {
	case "keyword":
		if _, ok := v.(string); ok {
			return nil
		}
	case "long":
		if _, err := strconv.ParseInt(num, 10, 64); err == nil {
			return nil
		}
	case "unsigned_long":
		if n, ok := new(big.Int).SetString(num, 10); ok && n.Sign() >= 0 && n.Cmp(maxUint64) <= 0 {
			return nil
		}
	case "ip":
		if s, ok := v.(string); ok && esIP(s) {
			return nil
		}
	case "date": // strict_date_optional_time: RFC 3339 with up to nanoseconds, Z or an offset
		if s, ok := v.(string); ok {
			if _, err := time.Parse(time.RFC3339Nano, s); err == nil {
				return nil
			}
		}
	case "boolean":
		switch v {
		case true, false, "true", "false":
			return nil
		}
	default:
		return fmt.Errorf("mapping type %s: this test has no check for it yet", typ)
	}
	return fmt.Errorf("a %s field rejects %T %v", typ, v, v)
}

// TestTemplateMapsEveryEvent: every field of every kind of event is mapped by the index template,
// and its value is one the mapping type takes.
func TestTemplateMapsEveryEvent(t *testing.T) {
	tm := loadTemplate(t)
	if !slices.Contains(tm.raw.IndexPatterns, "storeguard-*") {
		t.Errorf("index_patterns %v lacks storeguard-*", tm.raw.IndexPatterns)
	}
	if tm.rootDyn != "strict" {
		t.Errorf(`mappings.dynamic = %q, want "strict": an unmapped field must be an error, not a guess`, tm.rootDyn)
	}
	if v, _ := tm.raw.Meta["ecs_version"].(string); v != audit.ECSVersion {
		t.Errorf("_meta.ecs_version = %q, want %s", v, audit.ECSVersion)
	}
	for _, ob := range observers {
		for _, d := range allKinds(t, ob.o) {
			leaves("", d.m, func(p string, v any) {
				typ, err := tm.resolve(p)
				if err == nil {
					err = accepts(typ, v)
				}
				if err != nil {
					t.Errorf("%s (%s): %s: %v", d.name, ob.name, p, err)
				}
			})
		}
	}
}

// TestTemplateAgreesWithEvent: the template maps exactly the fields audit.Event can write, each
// with the type its Go type and ECS call for, so that neither rots when the other changes.
func TestTemplateAgreesWithEvent(t *testing.T) {
	tm := loadTemplate(t)
	s := loadECS(t)
	writable := map[string]string{} // json key → mapping type the Go type calls for
	objects := map[string]bool{}    // json keys of maps: objects filled by dynamic templates
	// Visible fields: the embedded *TLS's are written as Event's own.
	for _, sf := range reflect.VisibleFields(reflect.TypeFor[audit.Event]()) {
		key, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if key == "" || key == "-" {
			continue
		}
		typ, object := goMappingType(sf.Type)
		if object {
			objects[key] = true
			continue
		}
		if typ == "" {
			t.Errorf("Event.%s (%s, %s): this test knows no mapping type for it", sf.Name, key, sf.Type)
		}
		writable[key] = typ
	}
	for key, want := range writable {
		got, err := tm.resolve(key)
		if err != nil {
			t.Errorf("Event writes %s: %v", key, err)
			continue
		}
		if got != want {
			t.Errorf("%s is mapped as %s, its Go type calls for %s", key, got, want)
		}
		if f, ok := s.Fields[key]; ok && f.Type != got && !(f.Type == "long" && got == "unsigned_long") {
			t.Errorf("%s is mapped as %s, ECS %s has it %s", key, got, s.Version, f.Type)
		}
	}
	for key := range objects {
		f, ok := tm.fields[key]
		if !ok || f.typ != "object" || f.dynamic != "true" {
			t.Errorf("Event writes the object %s: want it mapped as an object with dynamic true, got %+v", key, f)
		}
		if !slices.ContainsFunc(tm.dynamics, func(d dynamicTemplate) bool { return d.PathMatch == key+".*" }) {
			t.Errorf("Event writes the object %s: no dynamic template with path_match %s.*", key, key)
		}
	}
	for p, f := range tm.fields {
		if f.typ == "object" {
			if f.dynamic == "true" && !objects[p] {
				t.Errorf("the template lets %s take any field, but Event writes no object there", p)
			}
			continue
		}
		if _, ok := writable[p]; !ok {
			t.Errorf("the template maps %s (%s), which Event never writes", p, f.typ)
		}
	}
	for _, d := range tm.dynamics {
		if !objects[strings.TrimSuffix(d.PathMatch, ".*")] {
			t.Errorf("dynamic template %s matches no object Event writes", d.PathMatch)
		}
	}
}

var (
	timeType    = reflect.TypeFor[time.Time]()
	addrType    = reflect.TypeFor[netip.Addr]()
	bigUintType = reflect.TypeFor[audit.BigUint]()
	hexType     = reflect.TypeFor[audit.HexBytes]()
)

// goMappingType is the mapping type an Event field of Go type rt is written for; object is true
// for a map (its keys become fields).
func goMappingType(rt reflect.Type) (typ string, object bool) {
	for rt.Kind() == reflect.Pointer {
		rt = rt.Elem()
	}
	switch rt {
	case timeType:
		return "date", false
	case addrType:
		return "ip", false
	case bigUintType:
		return "unsigned_long", false
	case hexType:
		return "keyword", false
	}
	switch rt.Kind() {
	case reflect.Map:
		return "", true
	case reflect.Slice:
		t, _ := goMappingType(rt.Elem())
		return t, false
	case reflect.String:
		return "keyword", false
	case reflect.Bool:
		return "boolean", false
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "long", false
	}
	return "", false
}

// TestVectorConfig checks configs/vector/storeguard.yaml without Vector (no package of it is to
// be had here): it reads the audit log where the deployment kit writes it, parses each line as
// JSON, and ships to an index the template's patterns cover, in bulk mode (data_stream mode
// would add data_stream.* fields, which the strict mapping rejects).
func TestVectorConfig(t *testing.T) {
	b, err := os.ReadFile("../configs/vector/storeguard.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Sources    map[string]map[string]any `yaml:"sources"`
		Transforms map[string]map[string]any `yaml:"transforms"`
		Sinks      map[string]map[string]any `yaml:"sinks"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("configs/vector/storeguard.yaml: %v", err)
	}
	unit, err := os.ReadFile("../configs/systemd/storeguard.service")
	if err != nil {
		t.Fatal(err)
	}
	const logPath = "/var/log/storeguard/audit.jsonl"
	if !bytes.Contains(unit, []byte("STOREGUARD_AUDIT_LOG="+logPath)) {
		t.Fatalf("configs/systemd/storeguard.service no longer writes the audit log to %s", logPath)
	}
	var files []string
	for name, s := range cfg.Sources {
		if s["type"] != "file" {
			t.Errorf("source %s: type %v, want file", name, s["type"])
		}
		for _, inc := range s["include"].([]any) {
			files = append(files, inc.(string))
		}
	}
	for _, p := range []string{logPath, audit.FlowsPath(logPath)} {
		if !slices.Contains(files, p) {
			t.Errorf("the file sources read %v, not %s", files, p)
		}
	}
	var parses bool
	for _, tr := range cfg.Transforms {
		src, _ := tr["source"].(string)
		parses = parses || tr["type"] == "remap" && strings.Contains(src, "parse_json!(")
	}
	if !parses {
		t.Error("no remap transform parses the line with parse_json!")
	}
	tm := loadTemplate(t)
	if len(cfg.Sinks) == 0 {
		t.Fatal("no sink")
	}
	for name, s := range cfg.Sinks {
		if s["type"] != "elasticsearch" {
			t.Errorf("sink %s: type %v, want elasticsearch", name, s["type"])
			continue
		}
		if mode, _ := s["mode"].(string); mode != "bulk" {
			t.Errorf("sink %s: mode %q, want bulk", name, mode)
		}
		bulk, _ := s["bulk"].(map[string]any)
		index, _ := bulk["index"].(string)
		// The date in the index name, strftime: any day matches the pattern alike.
		sample := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC).Format("2006.01.02")
		index = strings.NewReplacer("%Y.%m.%d", sample, "%F", "2026-11-23").Replace(index)
		if !slices.ContainsFunc(tm.raw.IndexPatterns, func(p string) bool { ok, _ := path.Match(p, index); return ok }) {
			t.Errorf("sink %s writes to %q, which index_patterns %v does not cover", name, index, tm.raw.IndexPatterns)
		}
	}
}

// TestLiveIndexing puts the template into a real Elasticsearch or OpenSearch and indexes every kind
// of event, each of which must be accepted. Opt-in: STOREGUARD_SEARCH_URL=http://127.0.0.1:9200
// (configs/elastic/opensearch-local.sh starts an OpenSearch on loopback). It uses the index
// storeguard-conformance-test, removed before and after.
func TestLiveIndexing(t *testing.T) {
	base := os.Getenv("STOREGUARD_SEARCH_URL")
	if base == "" {
		t.Skip("STOREGUARD_SEARCH_URL not set (a real Elasticsearch or OpenSearch, e.g. configs/elastic/opensearch-local.sh)")
	}
	base = strings.TrimSuffix(base, "/")
	call := func(method, p string, body []byte) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, base+p, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if strings.HasSuffix(p, "_bulk") || strings.Contains(p, "_bulk?") {
			req.Header.Set("Content-Type", "application/x-ndjson")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	tmpl, err := os.ReadFile(templatePath)
	if err != nil {
		t.Fatal(err)
	}
	const index = "storeguard-conformance-test"
	if code, out := call("PUT", "/_index_template/storeguard", tmpl); code != 200 {
		t.Fatalf("PUT _index_template/storeguard: %d %s", code, out)
	}
	call("DELETE", "/"+index, nil)
	t.Cleanup(func() { call("DELETE", "/"+index, nil) })

	var docs []doc
	for _, ob := range observers {
		docs = append(docs, allKinds(t, ob.o)...)
	}
	var bulk bytes.Buffer
	for _, d := range docs {
		bulk.WriteString(`{"index":{"_index":"` + index + `"}}` + "\n")
		bulk.Write(d.line)
		bulk.WriteByte('\n')
	}
	code, out := call("POST", "/_bulk?refresh=true", bulk.Bytes())
	if code != 200 {
		t.Fatalf("_bulk: %d %s", code, out)
	}
	var res struct {
		Errors bool
		Items  []map[string]struct {
			Status int
			Error  json.RawMessage
		}
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("_bulk answer: %v\n%s", err, out)
	}
	if len(res.Items) != len(docs) {
		t.Fatalf("_bulk answered %d items for %d events", len(res.Items), len(docs))
	}
	for i, item := range res.Items {
		if r := item["index"]; r.Status/100 != 2 {
			t.Errorf("%s: rejected, %d %s\n%s", docs[i].name, r.Status, r.Error, docs[i].line)
		}
	}
	// The template applied, unsigned_long included: the largest declared length comes back as such.
	q := []byte(`{"query":{"term":{"storeguard.declared":"18446744073709551615"}}}`)
	if code, out := call("POST", "/"+index+"/_count", q); code != 200 || !bytes.Contains(out, []byte(`"count":`)) || bytes.Contains(out, []byte(`"count":0`)) {
		t.Errorf("no event with storeguard.declared 2^64-1 found: %d %s", code, out)
	}
	// An unmapped field is refused, not guessed.
	if code, out := call("POST", "/"+index+"/_doc", []byte(`{"@timestamp":"2026-11-23T10:00:00Z","storeguard.unknown":1}`)); code/100 == 2 {
		t.Errorf("an unmapped storeguard.unknown was accepted (%d %s): the mapping is not strict", code, out)
	}
	if code, out := call("GET", "/"+index+"/_mapping", nil); code != 200 || !bytes.Contains(out, []byte(`"unsigned_long"`)) {
		t.Errorf("mapping of %s: %d %s", index, code, out)
	}

	// The Sigma rules, as scripts/sigma-convert.sh converts them to Lucene, find exactly the events
	// of their action.
	want := map[string]int{}
	for _, d := range docs {
		want[d.m["event.action"].(string)]++
	}
	for rule, q := range sigmaLucene(t) {
		action := luceneAction.FindStringSubmatch(q)
		if action == nil {
			t.Errorf("sigma %s: no event.action in %q", rule, q)
			continue
		}
		body, _ := json.Marshal(map[string]any{"query": map[string]any{"query_string": map[string]any{"query": q}}})
		code, out := call("POST", "/"+index+"/_count", body)
		var c struct{ Count int }
		if code != 200 || json.Unmarshal(out, &c) != nil {
			t.Errorf("sigma %s: %q: %d %s", rule, q, code, out)
		} else if c.Count != want[action[1]] || c.Count == 0 {
			t.Errorf("sigma %s: %q found %d events, want the %d %s events", rule, q, c.Count, want[action[1]], action[1])
		}
	}
}

var luceneAction = regexp.MustCompile(`event\.action:([a-z_]+)`)

// sigmaLucene is configs/sigma/converted/lucene.txt: each rule's query after a "# rule" line.
func sigmaLucene(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../configs/sigma/converted/lucene.txt")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var rule string
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if r, ok := strings.CutPrefix(line, "# "); ok {
			rule = r
		} else if line != "" {
			out[rule] = line
		}
	}
	if len(out) == 0 {
		t.Fatal("configs/sigma/converted/lucene.txt has no query")
	}
	return out
}
