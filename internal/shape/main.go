// Command shape counts how a package reads to a newcomer (issue #44): methods and fields of its
// types, the longest and most branching functions, and the file-level "uses a name defined in"
// graph: its references, and the pairs of files that use each other (a reference running back
// up, in whichever order a reader takes the files). Linux build, test files left out.
//
//	go run ./internal/shape [-types conn,Server] [-funcs serveEvent] [-pairs] ./proxy
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	types := flag.String("types", "conn,Server", "types whose methods and fields to count")
	funcs := flag.String("funcs", "serveEvent", "functions (or methods) whose length and complexity to give")
	pairs := flag.Bool("pairs", false, "list the pairs of files that use each other")
	flag.Parse()
	dir := "."
	if flag.NArg() > 0 {
		dir = flag.Arg(0)
	}
	if err := run(dir, strings.Split(*types, ","), strings.Split(*funcs, ","), *pairs); err != nil {
		fmt.Fprintln(os.Stderr, "shape:", err)
		os.Exit(1)
	}
}

func run(dir string, types, funcs []string, pairs bool) error {
	ctx := build.Default
	ctx.GOOS = "linux"
	pkg, err := ctx.ImportDir(dir, 0)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	for _, name := range pkg.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			return err
		}
		files[name] = f
	}
	// Where each top-level name is defined (methods by "Type.name").
	defined := map[string]string{}
	methods := map[string]map[string]string{} // type -> method -> file
	fields := map[string]int{}
	for name, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil {
					t := recvType(d.Recv.List[0].Type)
					if methods[t] == nil {
						methods[t] = map[string]string{}
					}
					methods[t][d.Name.Name] = name
					defined[t+"."+d.Name.Name] = name
				} else {
					defined[d.Name.Name] = name
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						defined[s.Name.Name] = name
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, fl := range st.Fields.List {
								fields[s.Name.Name] += max(1, len(fl.Names))
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							defined[n.Name] = name
						}
					}
				}
			}
		}
	}
	for _, t := range types {
		fs := map[string]bool{}
		for _, f := range methods[t] {
			fs[f] = true
		}
		fmt.Printf("%s: %d fields, %d methods in %d files\n", t, fields[t], len(methods[t]), len(fs))
	}
	// Functions: lines and cyclomatic complexity.
	for name, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			for _, want := range funcs {
				if fd.Name.Name == want {
					lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
					fmt.Printf("%s (%s): %d lines, complexity %d\n", fd.Name.Name, name, lines, complexity(fd))
				}
			}
		}
	}
	// The file graph: a file uses a name another file defines (a method by its name alone, when
	// only one type of the package has a method of that name).
	byMethod := map[string][]string{}
	for k, f := range defined {
		if _, m, ok := strings.Cut(k, "."); ok {
			byMethod[m] = append(byMethod[m], f)
		}
	}
	edges := map[[2]string]bool{}
	for name, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			var to string
			switch n := n.(type) {
			case *ast.Ident:
				to = defined[n.Name]
			case *ast.SelectorExpr:
				if fs := byMethod[n.Sel.Name]; len(fs) == 1 {
					to = fs[0]
				}
			}
			if to != "" && to != name {
				edges[[2]string{name, to}] = true
			}
			return true
		})
	}
	var mutual []string
	for e := range edges {
		if edges[[2]string{e[1], e[0]}] && e[0] < e[1] {
			mutual = append(mutual, e[0]+" <-> "+e[1])
		}
	}
	if pairs {
		sort.Strings(mutual)
		for _, m := range mutual {
			fmt.Println(m)
		}
	}
	fmt.Printf("files: %d, file-to-file references: %d, pairs of files using each other: %d\n", len(files), len(edges), len(mutual))
	return nil
}

func recvType(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvType(e.X)
	case *ast.Ident:
		return e.Name
	case *ast.IndexExpr:
		return recvType(e.X)
	}
	return "?"
}

// complexity is McCabe's: one, plus one per branch (if, for, case, && and ||).
func complexity(fd *ast.FuncDecl) int {
	n := 1
	ast.Inspect(fd.Body, func(x ast.Node) bool {
		switch x := x.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			n++
		case *ast.CaseClause:
			if x.List != nil {
				n++
			}
		case *ast.CommClause:
			if x.Comm != nil {
				n++
			}
		case *ast.BinaryExpr:
			if x.Op == token.LAND || x.Op == token.LOR {
				n++
			}
		}
		return true
	})
	return n
}
