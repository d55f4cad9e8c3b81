// Package docs holds no code: its test checks the documents against the code they describe (the
// package table of design.md against the packages and their imports) and every relative link of
// the Markdown files.
package docs

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/storeguard/storeguard/"

// packages lists the module's packages that design.md's table must describe: every directory with
// Go code but internal ones (internal/, a package's own internal/), commands and tests only.
func packages(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || d.Name() == "internal") {
			return filepath.SkipDir
		}
		if !d.IsDir() || rel == "." || rel == "docs" {
			return nil
		}
		p, err := build.Default.ImportDir(path, 0)
		if err != nil {
			return nil // no buildable Go files here (only tests, or none)
		}
		var imports []string
		for _, imp := range p.Imports {
			if name, ok := strings.CutPrefix(imp, module); ok && !strings.Contains("/"+name+"/", "/internal/") {
				imports = append(imports, name)
			}
		}
		slices.Sort(imports)
		out[filepath.ToSlash(rel)] = imports
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPackageTable: design.md's package table, which calls itself the contract, has a row for
// every package and none for a package that is not there, and each row's imports are the
// package's imports of the module's other packages ("stdlib" rows: none; "all": not checked).
func TestPackageTable(t *testing.T) {
	doc, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := packages(t)
	if len(pkgs) < 20 {
		t.Fatalf("found %d packages: %v", len(pkgs), pkgs)
	}
	table := regexp.MustCompile("(?m)^\\| `([a-z/-]+)` \\|([^|]*)\\|([^|]*)\\|$")
	name := regexp.MustCompile("`([a-z/]+)`")
	rows := map[string]bool{}
	for _, m := range table.FindAllStringSubmatch(string(doc), -1) {
		pkg, imports := m[1], m[3]
		rows[pkg] = true
		got, ok := pkgs[pkg]
		if !ok {
			if pkg != "interop" { // real-torch tests in Python
				t.Errorf("design.md has a row for %s, which is not a package", pkg)
			}
			continue
		}
		if strings.TrimSpace(imports) == "all" {
			continue
		}
		var want []string
		for _, n := range name.FindAllStringSubmatch(imports, -1) {
			if !strings.HasPrefix(n[1], "internal/") {
				want = append(want, n[1])
			}
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("design.md: %s imports %v, its row says %v", pkg, got, want)
		}
	}
	for pkg := range pkgs {
		if !rows[pkg] {
			t.Errorf("design.md's package table has no row for %s", pkg)
		}
	}
}

// TestLinks: every relative link of the repository's Markdown files names a file that exists.
func TestLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".." || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(path), target)); err != nil {
				t.Errorf("%s links to %s, which does not exist", path, target)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
