package config_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/providers/builtin"
)

const twoKinds = `providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY}
  partner: {type: webhook, url: "https://partner.example/hooks", secret_env: PARTNER_WEBHOOK_SECRET}
kinds:
  email.receipt: {provider: mail}
  webhook.order_paid: {provider: partner}
`

// databases: each database names its kinds, which the top level
// configures; Build gives each its own dispatcher with a share of the
// workers, and database_url alone is the one database "default".
func TestDatabases_Build(t *testing.T) {
	t.Parallel()
	doc := twoKinds + `dispatcher: {workers: 9}
databases:
  - {name: eu, url: "postgres://sidefx:hunter2@eu/app", kinds: [email.receipt, webhook.order_paid]}
  - {name: us, url_env: US_DB, schema: shard_us, kinds: [webhook.order_paid]}
  - {name: ap-1, url: "postgres://ap/app", kinds: [webhook.order_paid]}
`
	env := secretEnv()
	env["US_DB"] = "postgres://sidefx:s3cret@us/app"
	cfg, err := config.Parse([]byte(doc), getenv(env), builtin.Types()...)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.DatabaseNames(); strings.Join(got, ",") != "eu,us,ap-1" {
		t.Errorf("names: %q", got)
	}
	if s := fmt.Sprint(cfg); strings.Contains(s, "hunter2") || strings.Contains(s, "s3cret") {
		t.Errorf("the config prints a database password: %s", s)
	}
	rt, err := config.Build(cfg, getenv(env), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if len(rt.Databases) != 3 {
		t.Fatalf("%d databases", len(rt.Databases))
	}
	eu, us := rt.Databases[0], rt.Databases[1]
	if us.URL != "postgres://sidefx:s3cret@us/app" || us.Dispatcher.Schema != "shard_us" || us.Migrations.Schema != "shard_us" || eu.Dispatcher.Schema != "public" {
		t.Errorf("us: url and schema from url_env and schema: %s %s %s; eu schema %s", config.RedactDatabaseURL(us.URL), us.Dispatcher.Schema, us.Migrations.Schema, eu.Dispatcher.Schema)
	}
	if len(eu.Dispatcher.Kinds) != 2 || len(us.Dispatcher.Kinds) != 1 || us.Dispatcher.Kinds["webhook.order_paid"].Provider == nil {
		t.Errorf("kinds: eu %v, us %v", eu.Dispatcher.Kinds, us.Dispatcher.Kinds)
	}
	for _, d := range rt.Databases {
		if d.Dispatcher.Workers != 3 {
			t.Errorf("%s: %d workers, want 9/3", d.Name, d.Dispatcher.Workers)
		}
	}
	if s := fmt.Sprint(rt); strings.Contains(s, "hunter2") || strings.Contains(s, "s3cret") || !strings.Contains(s, "us:{") {
		t.Errorf("the runtime prints a database password, or not its databases: %s", s)
	}

	// database_url alone: one database, "default", as today's.
	cfg, err = config.Parse([]byte("database_url: postgres://localhost/app\n"+twoKinds), getenv(secretEnv()), builtin.Types()...)
	if err != nil {
		t.Fatal(err)
	}
	rt, err = config.Build(cfg, getenv(secretEnv()), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if len(rt.Databases) != 1 || rt.Databases[0].Name != config.DefaultDatabase || rt.Databases[0].URL != "postgres://localhost/app" ||
		rt.Databases[0].Dispatcher.Workers != rt.Dispatcher.Workers || len(rt.Databases[0].Dispatcher.Kinds) != 2 {
		t.Errorf("database_url's database: %+v", rt.Databases)
	}
}

// Each mistake in databases is an error naming its field.
func TestDatabases_Invalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		doc  string
		env  map[string]string
		want []string
	}{
		{"both forms", "database_url: postgres://a/app\ndatabases:\n  - {name: a, url: postgres://a/app, kinds: [email.receipt]}\n", nil,
			[]string{"database_url: set together with databases"}},
		{"both forms, database_url from the environment", "databases:\n  - {name: a, url: postgres://a/app, kinds: [email.receipt]}\n",
			map[string]string{config.EnvDatabaseURL: "postgres://b/app"},
			[]string{"database_url (from SIDEFX_DATABASE_URL): set together with databases"}},
		{"duplicate names", "databases:\n  - {name: a, url: postgres://a/app, kinds: [email.receipt]}\n  - {name: a, url: postgres://b/app, kinds: [email.receipt]}\n", nil,
			[]string{`line 9: databases[1].name: "a" is databases[0]'s name already`}},
		{"no name", "databases:\n  - {url: postgres://a/app, kinds: [email.receipt]}\n", nil,
			[]string{"databases[0].name: required"}},
		{"a name too long or with capitals", "databases:\n  - {name: Shard.EU, url: postgres://a/app, kinds: [email.receipt]}\n", nil,
			[]string{`databases[0].name: "Shard.EU" is not a database name: 1 to 32 of a-z 0-9 _ -`}},
		{"no url", "databases:\n  - {name: a, kinds: [email.receipt]}\n", nil,
			[]string{"databases[0].url: required (or url_env"}},
		{"url and url_env", "databases:\n  - {name: a, url: postgres://a/app, url_env: A_DB, kinds: [email.receipt]}\n", map[string]string{"A_DB": "postgres://a/app"},
			[]string{"databases[0].url_env: set together with url"}},
		{"url_env unset", "databases:\n  - {name: a, url_env: A_DB, kinds: [email.receipt]}\n", nil,
			[]string{"databases[0].url_env: environment variable A_DB is not set or empty"}},
		{"a database without kinds", "databases:\n  - {name: a, url: postgres://a/app}\n", nil,
			[]string{"databases[0].kinds: none: list the kinds the daemon serves from this database (kinds: email.receipt, webhook.order_paid)"}},
		{"a kind with no provider", "databases:\n  - {name: a, url: postgres://a/app, kinds: [email.receipt, charge.create]}\n", nil,
			[]string{`databases[0].kinds[1]: "charge.create" is not one of kinds, which names its provider and policy`}},
		{"a kind twice", "databases:\n  - {name: a, url: postgres://a/app, kinds: [email.receipt, email.receipt]}\n", nil,
			[]string{`databases[0].kinds[1]: "email.receipt" is listed twice`}},
		{"session_database_url", "session_database_url: postgres://s/app\ndatabases:\n  - {name: a, url: postgres://a/app, kinds: [email.receipt]}\n", nil,
			[]string{"session_database_url: not with databases"}},
		{"a bad schema", "databases:\n  - {name: a, url: postgres://a/app, schema: \"x y\", kinds: [email.receipt]}\n", nil,
			[]string{"databases[0].schema:"}},
		{"the console's database", "console: {database: b}\ndatabases:\n  - {name: a, url: postgres://a/app, kinds: [email.receipt]}\n", nil,
			[]string{`console.database: no database named "b" (databases: a)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := secretEnv()
			for k, v := range tt.env {
				env[k] = v
			}
			_, err := config.Parse([]byte(twoKinds+tt.doc), getenv(env), builtin.Types()...)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, config.ErrInvalid) {
				t.Errorf("not ErrInvalid: %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error lacks %q:\n%v", w, err)
				}
			}
		})
	}
	// A kind no database serves is a warning, not an error.
	cfg, err := config.Parse([]byte(twoKinds+"databases:\n  - {name: a, url: postgres://a/app, kinds: [email.receipt]}\n"), getenv(secretEnv()), builtin.Types()...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(cfg.Warnings, "\n"), `kinds["webhook.order_paid"]: no database of databases serves it`) {
		t.Errorf("warnings: %q", cfg.Warnings)
	}
}
