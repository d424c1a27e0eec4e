package e2e_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/internal/lab/peers"
)

// sqlHomes is where the product's SQL statements are today, and how many
// string literals of each file hold one: the ratchet of issue 28's "one
// home for SQL". A statement in a new place fails this test, and so does
// a file that holds more, or fewer, than listed: move statements into the
// engine and shrink the list; never grow it without saying why.
// migrations.go applies the schema; daemon's are readiness checks of the
// server (no sidefx table); sidefxtest/contract's check what the contract
// wrote.
var sqlHomes = map[string]int{
	"daemon/run.go":                 1,
	"daemon/session.go":             1,
	"drift/rule.go":                 7,
	"drift/run.go":                  1,
	"drift/store.go":                3,
	"edge/edge.go":                  6,
	"effects/operate.go":            4,
	"effects/pause.go":              5,
	"effects/registry.go":           7,
	"effects/store.go":              12,
	"effects/supersede.go":          6,
	"inbox/inbox.go":                2,
	"internal/schedule/schedule.go": 4,
	"internal/store/engine.go":      26,
	"internal/store/registry.go":    6,
	"migrations/migrations.go":      9,
	"reconcile/store.go":            17,
	"sidefxtest/contract/cases.go":  6,
}

// statementRE is what a string literal holding a SQL statement contains.
var statementRE = regexp.MustCompile(`\b(SELECT|INSERT INTO|UPDATE|DELETE FROM)\s`)

func TestSQL_LivesWhereTheListSays(t *testing.T) {
	root, err := peers.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch rel {
			case ".git", "internal/lab", "bench", "examples", "tools", "docs", "deploy":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if l, ok := n.(*ast.BasicLit); ok && l.Kind == token.STRING && statementRE.MatchString(l.Value) {
				got[rel]++
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 5 {
		t.Fatalf("found SQL in %d files: not the tree this test expects", len(got))
	}
	for _, f := range slices.Sorted(maps.Keys(got)) {
		switch want, ok := sqlHomes[f]; {
		case !ok:
			t.Errorf("%s holds %d SQL statements: statements on sidefx's tables belong in the engine (internal/store), not in a new place", f, got[f])
		case got[f] > want:
			t.Errorf("%s holds %d SQL statements, more than the %d listed: move them into the engine", f, got[f], want)
		case got[f] < want:
			t.Errorf("%s holds %d SQL statements, fewer than the %d listed: shrink sqlHomes to match", f, got[f], want)
		}
	}
	for f := range sqlHomes {
		if _, ok := got[f]; !ok {
			t.Errorf("%s holds no SQL statement any more: take it out of sqlHomes", f)
		}
	}
}
