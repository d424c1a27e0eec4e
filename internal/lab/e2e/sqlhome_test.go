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

// engineHome is where every statement on sidefx's tables lives: the
// engine package (issue 28's "one home for SQL").
const engineHome = "internal/engine/"

// sqlHomes is where the product's SQL statements are outside the engine,
// and how many string literals of each file hold one. A statement in a new
// place fails this test, and so does a file that holds more, or fewer,
// than listed: move statements into the engine and shrink the list; never
// grow it without saying why. migrations.go applies the schema; the
// daemon's session check asks the server for its backend (no sidefx
// table); sidefxtest/contract's check what the contract wrote;
// internal/roles holds the roles' GRANT statements and the comments that
// explain them (privileges, no statement on a sidefx table's rows: its
// literals match here for "GRANT SELECT ON").
var sqlHomes = map[string]int{
	"daemon/session.go":            1,
	"internal/roles/header.go":     3,
	"internal/roles/roles.go":      16,
	"migrations/migrations.go":     8,
	"sidefxtest/contract/cases.go": 6,
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
	inEngine := 0
	for f, n := range got {
		if strings.HasPrefix(f, engineHome) {
			inEngine += n
			delete(got, f)
		}
	}
	if inEngine < 50 {
		t.Fatalf("found %d SQL statements in %s: not the tree this test expects", inEngine, engineHome)
	}
	for _, f := range slices.Sorted(maps.Keys(got)) {
		switch want, ok := sqlHomes[f]; {
		case !ok:
			t.Errorf("%s holds %d SQL statements: statements on sidefx's tables belong in the engine ("+engineHome+"), not in a new place", f, got[f])
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
