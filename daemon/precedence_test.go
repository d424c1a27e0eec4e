package daemon

import (
	"os"
	"path/filepath"
	"testing"
)

// Which database a command uses: the flag, else SIDEFX_DATABASE_URL, else
// the file's database_url; the schema from the flag, else the file.
func TestCLI_DatabasePrecedence(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	if err := os.WriteFile(cfg, []byte("database_url: postgres://file/db\nschema: fromfile\nproviders:\n  hook: {type: webhook, url: \"https://example.com/h\", secret_env: HOOK_SECRET}\nkinds:\n  order.paid: {provider: hook}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noURL := filepath.Join(t.TempDir(), "nourl.yaml")
	if err := os.WriteFile(noURL, []byte("providers:\n  hook: {type: webhook, url: \"https://example.com/h\", secret_env: HOOK_SECRET}\nkinds:\n  order.paid: {provider: hook}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name                string
		flagURL, env, path  string
		flagSchema          string
		wantURL, wantSchema string
	}{
		{"file only", "", "", cfg, "", "postgres://file/db", "fromfile"},
		{"environment over the file", "", "postgres://env/db", cfg, "", "postgres://env/db", "fromfile"},
		{"flag over both", "postgres://flag/db", "postgres://env/db", cfg, "flagged", "postgres://flag/db", "flagged"},
		{"flag without a file", "postgres://flag/db", "postgres://env/db", "", "", "postgres://flag/db", ""},
		{"environment without a file", "", "postgres://env/db", "", "", "postgres://env/db", ""},
		{"flag with a file without database_url", "postgres://flag/db", "", noURL, "", "postgres://flag/db", "public"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{"SIDEFX_DATABASE_URL": c.env, "HOOK_SECRET": "whsec_dGVzdHNlY3JldHRlc3RzZWNyZXQ="}
			io := &IO{Getenv: func(k string) string { return env[k] }}
			cm := &common{configPath: c.path, databaseURL: c.flagURL, schema: c.flagSchema}
			url, schema, err := cm.database(io)
			if err != nil || url != c.wantURL || schema != c.wantSchema {
				t.Errorf("database: %q %q %v, want %q %q", url, schema, err, c.wantURL, c.wantSchema)
			}
		})
	}
}
