// Command fdbcheck type-checks packages as built with the fdb build tag,
// test files included, on a machine without the FoundationDB client. The
// official bindings use cgo and need fdb_c.h and libfdb_c to compile, so a
// plain `go vet -tags fdb` cannot run here; fdbcheck type-checks the
// bindings from source with cgo's `import "C"` faked, which keeps their Go
// API exact, and then checks couchjobs' fdb code against that API.
//
// Usage: go run ./.ci/fdbcheck ./runtime/kv/fdbkv ./runtime/tuple
package main

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"os/exec"
	"path/filepath"
)

type listed struct {
	ImportPath  string
	Dir         string
	Name        string
	Standard    bool
	GoFiles     []string
	CgoFiles    []string
	TestGoFiles []string
	Module      *struct{ Path string }
}

type checker struct {
	fset   *token.FileSet
	std    types.Importer
	cache  map[string]*types.Package
	module string
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: fdbcheck PACKAGE...")
		os.Exit(2)
	}
	c := &checker{fset: token.NewFileSet(), cache: map[string]*types.Package{}}
	c.std = importer.ForCompiler(c.fset, "source", nil)
	failed := false
	for _, arg := range os.Args[1:] {
		p, err := list(arg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if p.Module != nil {
			c.module = p.Module.Path
		}
		files := append(append(append([]string{}, p.GoFiles...), p.CgoFiles...), p.TestGoFiles...)
		if _, errs := c.check(p, files, true); len(errs) > 0 {
			failed = true
			for _, e := range errs {
				fmt.Fprintln(os.Stderr, e)
			}
		} else {
			fmt.Printf("ok   %s (tag fdb, %d files)\n", p.ImportPath, len(files))
		}
	}
	if failed {
		os.Exit(1)
	}
}

func list(pattern string) (*listed, error) {
	out, err := exec.Command("go", "list", "-e", "-tags", "fdb", "-json", pattern).Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w", pattern, err)
	}
	var p listed
	if err := json.Unmarshal(out, &p); err != nil {
		return nil, fmt.Errorf("go list %s: %w", pattern, err)
	}
	return &p, nil
}

// Import resolves imports: the standard library from source, everything
// else by listing and checking it with the fdb tag.
func (c *checker) Import(path string) (*types.Package, error) {
	if pkg, ok := c.cache[path]; ok {
		return pkg, nil
	}
	p, err := list(path)
	if err != nil {
		return nil, err
	}
	if p.Standard {
		return c.std.Import(path)
	}
	pkg, errs := c.check(p, append(append([]string{}, p.GoFiles...), p.CgoFiles...), false)
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %v", path, errs[0])
	}
	c.cache[path] = pkg
	return pkg, nil
}

// check type-checks files of p. Errors inside packages outside this module
// (the cgo bindings, whose C expressions cannot be typed) are ignored; their
// exported Go API is what matters.
func (c *checker) check(p *listed, files []string, report bool) (*types.Package, []error) {
	var parsed []*ast.File
	for _, f := range files {
		af, err := parser.ParseFile(c.fset, filepath.Join(p.Dir, f), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, []error{err}
		}
		parsed = append(parsed, af)
	}
	ours := c.module != "" && (p.ImportPath == c.module || len(p.ImportPath) > len(c.module) && p.ImportPath[:len(c.module)+1] == c.module+"/")
	var errs []error
	conf := types.Config{
		Importer:    c,
		FakeImportC: true,
		Error: func(err error) {
			if ours || report {
				errs = append(errs, err)
			}
		},
	}
	pkg, _ := conf.Check(p.ImportPath, c.fset, parsed, nil)
	return pkg, errs
}
