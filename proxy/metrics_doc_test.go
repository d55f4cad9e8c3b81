package proxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"testing"
)

// TestMetricsDocumented: docs/metrics.md lists every metric metrics.go defines, and no other:
// the list is checked against the code it describes.
func TestMetricsDocumented(t *testing.T) {
	fs := token.NewFileSet()
	file, err := parser.ParseFile(fs, "metrics.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var defined []string
	name := func(e ast.Expr) {
		if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil && !slices.Contains(defined, s) {
				defined = append(defined, s)
			}
		}
	}
	ast.Inspect(file, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr: // f("name", "help")
			if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "f" && len(n.Args) == 2 {
				name(n.Args[0])
			}
		case *ast.KeyValueExpr: // Name: "name"
			if id, ok := n.Key.(*ast.Ident); ok && id.Name == "Name" {
				name(n.Value)
			}
		}
		return true
	})
	if len(defined) < 30 {
		t.Fatalf("found %d metrics in metrics.go (%v): the parse missed how they are defined", len(defined), defined)
	}
	doc, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	// The table's first column: `name`, `name` (kind)
	var listed []string
	for _, m := range regexp.MustCompile("(?m)^\\| ([^|]+)\\|").FindAllStringSubmatch(string(doc), -1) {
		for _, n := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(m[1], -1) {
			listed = append(listed, n[1])
		}
	}
	for _, d := range defined {
		if !slices.Contains(listed, d) {
			t.Errorf("metric storeguard_%s is not in docs/metrics.md", d)
		}
	}
	for _, l := range listed {
		if !slices.Contains(defined, l) {
			t.Errorf("docs/metrics.md lists %s, which metrics.go does not define", l)
		}
	}
}
