package pgcluster

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrNoBinaries is wrapped by the error of FindBinaries, and thus of Start,
// when the PostgreSQL server programs are not found. The error's text ends
// with how to install them.
var ErrNoBinaries = errors.New("pgcluster: PostgreSQL binaries were not found")

// installHint says how to get out of a missing-binaries failure.
const installHint = "install PostgreSQL (Debian/Ubuntu: apt-get install postgresql), " +
	"or set SIDEFX_PG_BIN to the directory holding pg_ctl, initdb and postgres"

// debianBinGlob is where Debian and Ubuntu install each PostgreSQL version.
const debianBinGlob = "/usr/lib/postgresql/*/bin"

// FindBinaries returns the directory of the PostgreSQL server programs
// (pg_ctl, initdb, postgres): the one in SIDEFX_PG_BIN if set, else the
// newest /usr/lib/postgresql/*/bin, else the directory of pg_ctl on PATH.
// If there is none, the error wraps ErrNoBinaries and says how to install
// them.
func FindBinaries() (string, error) {
	if dir := os.Getenv("SIDEFX_PG_BIN"); dir != "" {
		if err := hasServerPrograms(dir); err != nil {
			return "", fmt.Errorf("%w: SIDEFX_PG_BIN=%s: %v; %s", ErrNoBinaries, dir, err, installHint)
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
	return "", fmt.Errorf("%w (pg_ctl, initdb, postgres) in SIDEFX_PG_BIN, %s or PATH; %s", ErrNoBinaries, debianBinGlob, installHint)
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
