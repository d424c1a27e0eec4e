package migrations_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// readSums reads released.sum: "SHA-256  path" per line, as sha256sum
// prints it, for every embedded migration and every file of
// testdata/released.
func readSums(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open("released.sum")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		sum, path, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("released.sum:%d: %q is not \"SHA-256  path\"", n, sc.Text())
		}
		sums[path] = sum
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return sums
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// A database migrated to version N ran file N as it was then, and never
// runs it again: a file edited after its release gives the databases that
// ran it before the edit another schema than those that ran it after (the
// kind_status column added to 0007 after it landed was missing from every
// database migrated before, and each heartbeat failed on it). Each file is
// pinned by its SHA-256; a new one is added to released.sum with
// `sha256sum NNNN_name.sql >> released.sum` once it is final.
func TestReleasedMigrationsNeverChange(t *testing.T) {
	t.Parallel()
	sums := readSums(t)
	files, err := filepath.Glob("*.sql")
	if err != nil {
		t.Fatal(err)
	}
	kept, err := filepath.Glob("testdata/released/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, kept...)
	seen := map[string]bool{}
	for _, f := range files {
		seen[f] = true
		want, ok := sums[f]
		got := fileSum(t, f)
		switch {
		case !ok:
			t.Errorf("%s is not in released.sum: once it is final, add the line %q", f, got+"  "+f)
		case got != want:
			t.Errorf("%s has SHA-256 %s, released as %s: released migrations never change: write a new one", f, got, want)
		}
	}
	var gone []string
	for f := range sums {
		if !seen[f] {
			gone = append(gone, f)
		}
	}
	sort.Strings(gone)
	for _, f := range gone {
		t.Errorf("%s is in released.sum but missing: released migrations never change: write a new one", f)
	}
}
