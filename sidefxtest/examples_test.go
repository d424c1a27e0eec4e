package sidefxtest_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The examples, their tests included, use only what a user can import:
// no package under internal/ (sidefxtest is the test kit they use).
func TestExamples_ImportOnlyPublicPackages(t *testing.T) {
	files := 0
	err := filepath.WalkDir("../examples", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		files++
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(p, "github.com/sidefx/sidefx/") && (strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal")) {
				t.Errorf("%s imports %s: examples use public packages only (sidefxtest for tests)", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 8 {
		t.Fatalf("found %d Go files under examples/: not the tree this test expects", files)
	}
}
