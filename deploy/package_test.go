package deploy_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/providers/builtin"
)

// TestPackageConfig: the package's /etc/sidefx/sidefx.yaml passes sidefx's
// validator once a database URL is given (by /etc/default/sidefx's
// SIDEFX_DATABASE_URL), and is refused without one, rather than starting
// on a default database.
func TestPackageConfig(t *testing.T) {
	cfg := read(t, "package/sidefx.yaml")
	env := map[string]string{config.EnvDatabaseURL: "postgres://sidefx_daemon@db.example:5432/app"}
	if _, err := config.Parse(cfg, func(k string) string { return env[k] }, builtin.Types()...); err != nil {
		t.Errorf("package/sidefx.yaml is refused:\n%v", err)
	}
	if _, err := config.Parse(cfg, func(string) string { return "" }, builtin.Types()...); err == nil || !strings.Contains(err.Error(), "database_url") {
		t.Errorf("package/sidefx.yaml without a database URL: %v, want database_url required", err)
	}
}

// TestChangelogVersion: VERSION is a semantic version, and CHANGELOG.md has
// its section.
func TestChangelogVersion(t *testing.T) {
	v := strings.TrimSpace(string(read(t, "../VERSION")))
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(v) {
		t.Fatalf("VERSION %q: want vMAJOR.MINOR.PATCH", v)
	}
	if !regexp.MustCompile(`(?m)^## ` + regexp.QuoteMeta(v) + `( |$)`).Match(read(t, "../CHANGELOG.md")) {
		t.Errorf("CHANGELOG.md has no section ## %s", v)
	}
}
