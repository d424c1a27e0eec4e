package pgtest

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// installHint says how to get out of a missing-binaries failure.
const installHint = "install PostgreSQL (Debian/Ubuntu: apt-get install postgresql), " +
	"or set SIDEFX_PG_BIN to the directory holding pg_ctl, initdb and postgres, " +
	"or set SIDEFX_TEST_DATABASE_URL to the URL of a running server to use instead"

// debianBinGlob is where Debian and Ubuntu install each PostgreSQL version.
const debianBinGlob = "/usr/lib/postgresql/*/bin"

// findBinDir returns the directory of the PostgreSQL server programs: the one
// in SIDEFX_PG_BIN if set, else the newest /usr/lib/postgresql/*/bin, else
// the directory of pg_ctl on PATH.
func findBinDir() (string, error) {
	if dir := os.Getenv("SIDEFX_PG_BIN"); dir != "" {
		if err := hasServerPrograms(dir); err != nil {
			return "", fmt.Errorf("pgtest: PostgreSQL binaries were not found: SIDEFX_PG_BIN=%s: %v; %s", dir, err, installHint)
		}
		return dir, nil
	}
	dirs, _ := filepath.Glob(debianBinGlob)
	// Newest version first: /usr/lib/postgresql/16/bin before .../15/bin.
	slices.SortFunc(dirs, func(a, b string) int {
		return -compareVersions(filepath.Base(filepath.Dir(a)), filepath.Base(filepath.Dir(b)))
	})
	for _, dir := range dirs {
		if hasServerPrograms(dir) == nil {
			return dir, nil
		}
	}
	if path, err := exec.LookPath("pg_ctl"); err == nil {
		if dir := filepath.Dir(path); hasServerPrograms(dir) == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("pgtest: PostgreSQL binaries (pg_ctl, initdb, postgres) were not found in SIDEFX_PG_BIN, %s or PATH; %s", debianBinGlob, installHint)
}

// hasServerPrograms checks that dir holds executable pg_ctl, initdb and
// postgres.
func hasServerPrograms(dir string) error {
	for _, prog := range []string{"pg_ctl", "initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, prog))
		if err != nil {
			return fmt.Errorf("no %s: %w", prog, err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s is not an executable file", filepath.Join(dir, prog))
		}
	}
	return nil
}

// compareVersions compares version strings like "9.6" and "15" numerically;
// non-numeric parts count as 0.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	}
	return 0
}
