// Package godeps is what the dependency tests share: the packages a
// program importing a given package compiles, as `go list -deps` says, and
// the import chain that brings one in.
package godeps

import (
	"bytes"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Package is one line of go list -deps: a package, its module (empty for
// the standard library) and its imports.
type Package struct {
	Path, Module string
	Imports      []string
}

// List runs go list -deps on pkg (with env added to go's environment:
// GOOS=windows, say) and returns every package a program importing pkg
// compiles, pkg included, by import path.
func List(t testing.TB, pkg string, env ...string) map[string]Package {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}|{{with .Module}}{{.Path}}{{end}}|{{join .Imports " "}}`, pkg)
	if len(env) > 0 {
		cmd.Env = append(cmd.Environ(), env...)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.String())
	}
	deps := map[string]Package{}
	for line := range strings.Lines(string(out)) {
		f := strings.SplitN(strings.TrimSpace(line), "|", 3)
		if len(f) != 3 {
			t.Fatalf("go list: unexpected line %q", line)
		}
		deps[f[0]] = Package{Path: f[0], Module: f[1], Imports: strings.Fields(f[2])}
	}
	return deps
}

// Chain returns how from reaches to: from → … → to, the shortest way.
func Chain(deps map[string]Package, from, to string) string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var chain []string
			for q := to; q != ""; q = prev[q] {
				chain = append(chain, q)
			}
			slices.Reverse(chain)
			return strings.Join(chain, " → ")
		}
		for _, imp := range deps[p].Imports {
			if _, seen := prev[imp]; !seen {
				prev[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	return to
}

// Rules say what a program importing a package must not compile, each
// with why: Modules by module path prefix, Packages by import path (the
// package and those below it), Exact by import path alone.
type Rules struct {
	Modules, Packages, Exact map[string]string
}

// Check lists pkg's dependencies, fails t unless every package in needs is
// among them (so that the listing is the real one), and reports each
// package the rules forbid with the chain that brings it in.
func Check(t testing.TB, pkg string, needs []string, r Rules, env ...string) map[string]Package {
	t.Helper()
	deps := List(t, pkg, env...)
	for _, want := range append([]string{pkg}, needs...) {
		if _, ok := deps[want]; !ok {
			t.Fatalf("go list -deps %s lacks %s: the listing is not what this test expects (%d packages)", pkg, want, len(deps))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(deps)) {
		d := deps[p]
		for prefix, why := range r.Modules {
			if d.Module != "" && (d.Module == prefix || strings.HasPrefix(d.Module, prefix)) {
				t.Errorf("a program importing %s compiles %s, module %s (%s): %s", pkg, p, d.Module, why, Chain(deps, pkg, p))
			}
		}
		for prefix, why := range r.Packages {
			if p == strings.TrimSuffix(prefix, "/") || strings.HasPrefix(p, strings.TrimSuffix(prefix, "/")+"/") {
				t.Errorf("a program importing %s compiles %s (%s): %s", pkg, p, why, Chain(deps, pkg, p))
			}
		}
		if why, bad := r.Exact[p]; bad {
			t.Errorf("a program importing %s compiles %s (%s): %s", pkg, p, why, Chain(deps, pkg, p))
		}
	}
	return deps
}
