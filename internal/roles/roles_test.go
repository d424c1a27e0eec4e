package roles

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// deploy/postgres's files are what this package makes: go generate
// ./internal/roles rewrites them.
func TestFiles_AreCurrent(t *testing.T) {
	files, err := Files()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join("..", "..", "deploy", "postgres", name))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("deploy/postgres/%s is not what internal/roles makes: run go generate ./internal/roles", name)
		}
	}
	if len(files) != 5 {
		t.Fatalf("%d files", len(files))
	}
}

// Names are checked and quoted; one role for two kinds is refused; the
// options add their grants and say so.
func TestScript_NamesAndOptions(t *testing.T) {
	for _, o := range []Options{
		{Schema: "app;drop"},
		{Names: map[string]string{Viewer: "public"}},
		{Names: map[string]string{Producer: "pg_x"}},
		{Names: map[string]string{Producer: "a'b"}},
		{Names: map[string]string{Operator: "ops", Viewer: "ops"}},
		{Names: map[string]string{"admin": "x"}},
	} {
		if _, err := Script(o); err == nil {
			t.Errorf("Script(%+v) was made", o)
		}
	}
	s, err := Script(Options{Schema: "App", Names: map[string]string{Operator: "ops-team", Viewer: "user"}, Login: true, EdgeOutcome: true, ConsoleSettings: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`CREATE ROLE "ops-team" LOGIN`, `rolname = 'ops-team'`, `ALTER ROLE "user" LOGIN;`, `GRANT USAGE ON SCHEMA "App" TO "user";`,
		`GRANT SELECT ON "App".side_effects TO sidefx_producer;`, `GRANT SELECT ON "App".sidefx_settings TO sidefx_daemon;`,
		"(--edge-outcome)", "(--console-settings)",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the script lacks %q", want)
		}
	}
	if d, _ := Script(Options{}); strings.Contains(d, "public.side_effects TO sidefx_producer") || strings.Contains(d, "sidefx_settings TO sidefx_daemon") || strings.Contains(d, "\nALTER ROLE") {
		t.Error("the default script grants an option's privilege, or LOGIN")
	}
}
