package config_test

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/providers/builtin"
)

// The reference, config.Reference (reference.yaml) and the table of
// docs/config-reference.md, is generated here from the one place each field is documented: its doc
// comment in this package. Run with -update after changing a field.
var update = flag.Bool("update", false, "rewrite reference.yaml and docs/config-reference.md")

// referenceExample is the example the reference shows: only values, no
// word of documentation. Every field it leaves out that has a default is
// added with its default.
const referenceExample = `
database_url: postgres://sidefx@localhost:5432/app
providers:
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY, webhook_secret_env: STRIPE_WEBHOOK_SECRET, consistency_delay: 5m, lookup_rate: 10}
  mail:
    type: sendgrid
    api_key_env: SENDGRID_API_KEY
    event_public_key: MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEL8Qo5TVXHufq2zwpUyEnFcflEqcwq9aea1tXthqK0EnwEKfewvL0jVy530zjQX26/SQs4P3Ni4sybrfXv9Sd0A==
    event_delay: 1h
    event_tolerance: 5m
  partner:
    type: webhook
    url: https://partner.example/hooks
    secret_env: PARTNER_WEBHOOK_SECRET
    secrets_env: [PARTNER_WEBHOOK_SECRET_NEW]
    headers: {X-Tenant: t1}
    headers_env: {X-Partner-Token: PARTNER_TOKEN}
    confirm_when: {content_type: application/json, headers: [X-Request-Id]}
    concurrency: 8
    rate_per_second: 50
    burst: 10
    limit_scope: fleet
  payments:
    type: http
    url: https://checkout.example/v71/payments
    key_header: Idempotency-Key
    key_max_length: 64
    headers_env: {X-API-Key: PAYMENTS_API_KEY}
    key_window: 720h
    statuses:
      unknown: ["4xx /errorCode=704"]
      retryable: ["503"]
      for_key: ["422 /resultCode=Refused"]
    reference: {json_pointer: /pspReference}
    confirm_when: {statuses: [200, 201], content_type: application/json, headers: [Psp-Reference]}
  ledger:
    type: http
    url: https://ledger.internal.example/entries
    key_header: Idempotency-Key
    replayed_header: Idempotent-Replayed
    statuses:
      confirmed: ["409 /status=duplicate"]
      rejected: ["410"]
    reference: {header: Location}
kinds:
  charge.create: {provider: stripe, operation: charges.create, max_attempts: 20, outlast_key_window: false, notify_outcome: false}
  email.receipt: {provider: mail, at_least_once: false, refire_when_absent_after: 1h}
  webhook.order_paid: {provider: partner}
  payment.authorise: {provider: payments, max_attempts: 12}
  ledger.entry: {provider: ledger, max_attempts: 12}
drift:
  rules:
    - name: paid_orders_charged
      kind: charge.create
      sql: SELECT id::text FROM orders WHERE status = 'paid' AND paid_at >= :window_start AND paid_at < :due_before
      sample: 10
      check_at_most: 0
reconcile:
  schedule: "@every 10m"
console:
  listen: 127.0.0.1:9465
  tokens_file: /etc/sidefx/console-tokens
  hidden_fields: [personalizations.to.email, customer_email]
`

// databasesExample is what databases holds instead of database_url, as a
// comment in the reference: the example has database_url.
const databasesExample = `

For example, instead of database_url:
  databases:
    - {name: eu, url_env: SIDEFX_DATABASE_URL_EU, kinds: [charge.create, email.receipt]}
    - {name: us, url: postgres://sidefx@us-db:5432/app, schema: app, kinds: [charge.create]}`

// sections are the configuration's structs, by where they are in the file:
// the common fields of a provider, then each built-in type's own
// (typeSections).
var sections = []struct {
	path string
	typ  reflect.Type
	ptyp string // the provider type whose settings these are
}{
	{"", reflect.TypeFor[config.Config](), ""},
	{"databases[]", reflect.TypeFor[config.DatabaseConfig](), ""},
	{"http", reflect.TypeFor[config.HTTPConfig](), ""},
	{"log", reflect.TypeFor[config.LogConfig](), ""},
	{"dispatcher", reflect.TypeFor[config.DispatcherConfig](), ""},
	{"providers.NAME", reflect.TypeFor[config.ProviderConfig](), ""},
	{"kinds.KIND", reflect.TypeFor[config.KindConfig](), ""},
	{"drift", reflect.TypeFor[config.DriftConfig](), ""},
	{"drift.rules[]", reflect.TypeFor[config.DriftRule](), ""},
	{"reconcile", reflect.TypeFor[config.ReconcileConfig](), ""},
	{"tracing", reflect.TypeFor[config.TracingConfig](), ""},
	{"console", reflect.TypeFor[config.ConsoleConfig](), ""},
}

// allSections are sections with, after the providers' common fields, one
// section for each built-in type's settings and one for each struct in
// them.
func allSections() []struct {
	path string
	typ  reflect.Type
	ptyp string
} {
	var out []struct {
		path string
		typ  reflect.Type
		ptyp string
	}
	for _, s := range sections {
		out = append(out, s)
		if s.typ != reflect.TypeFor[config.ProviderConfig]() {
			continue
		}
		for _, pt := range builtin.Types() {
			out = append(out, struct {
				path string
				typ  reflect.Type
				ptyp string
			}{"providers.NAME", pt.Settings(), pt.Name})
			for _, f := range yamlFields(pt.Settings()) {
				if f.Type.Kind() == reflect.Struct && f.Type.NumField() > 0 {
					out = append(out, struct {
						path string
						typ  reflect.Type
						ptyp string
					}{"providers.NAME." + yamlName(f), f.Type, pt.Name})
				}
			}
		}
	}
	return out
}

// docKey names a struct in fieldDocs: its package's path and its name.
func docKey(t reflect.Type) string { return t.PkgPath() + "." + t.Name() }

// fieldDocs reads the doc comment of every struct field of the package's
// (non-test) sources and of the built-in provider types' packages: docKey
// → field name → text.
func fieldDocs(t *testing.T) map[string]map[string]string {
	t.Helper()
	// providers: the settings' shared structs (providers.ConfirmWhen).
	dirs := map[string]string{"github.com/sidefx/sidefx/config": ".", "github.com/sidefx/sidefx/providers": "../providers"}
	for _, pt := range builtin.Types() {
		pkg := pt.Settings().PkgPath()
		dirs[pkg] = "../" + strings.TrimPrefix(pkg, "github.com/sidefx/sidefx/")
	}
	docs := map[string]map[string]string{}
	for pkgPath, dir := range dirs {
		fset := token.NewFileSet()
		pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, pkg := range pkgs {
			for _, f := range pkg.Files {
				ast.Inspect(f, func(n ast.Node) bool {
					ts, ok := n.(*ast.TypeSpec)
					if !ok {
						return true
					}
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						return true
					}
					m := map[string]string{}
					for _, fld := range st.Fields.List {
						for _, name := range fld.Names {
							m[name.Name] = strings.TrimSpace(fld.Doc.Text())
						}
					}
					docs[pkgPath+"."+ts.Name.Name] = m
					return true
				})
			}
		}
	}
	return docs
}

// yamlFields lists the struct's fields that the file holds: YAML name and
// Go field.
func yamlFields(typ reflect.Type) []reflect.StructField {
	var out []reflect.StructField
	for f := range typ.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		out = append(out, f)
	}
	return out
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return name
}

// generateReference renders reference.yaml: the example, filled with the
// defaults, each field under its documentation (the first time the field
// appears).
func generateReference(t *testing.T) []byte {
	t.Helper()
	docs := fieldDocs(t)
	cfg, err := config.Parse([]byte(referenceExample), getenv(nil), builtin.Types()...)
	if err != nil {
		t.Fatalf("the reference's example: %v", err)
	}
	var given yaml.Node
	if err := yaml.Unmarshal([]byte(referenceExample), &given); err != nil {
		t.Fatal(err)
	}
	var filled yaml.Node
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(out, &filled); err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	var walk func(n, given *yaml.Node, typ reflect.Type, entries bool)
	walk = func(n, given *yaml.Node, typ reflect.Type, entries bool) {
		for typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		switch {
		case n.Kind == yaml.MappingNode && typ.Kind() == reflect.Struct:
			fields := map[string]reflect.StructField{}
			owner := map[string]reflect.Type{} // the struct each field is of
			for _, f := range yamlFields(typ) {
				fields[yamlName(f)], owner[yamlName(f)] = f, typ
			}
			if typ == reflect.TypeFor[config.ProviderConfig]() {
				// A provider's own fields are its type's settings'.
				settings := settingsOf(t, lookup(n, "type").Value)
				for _, f := range yamlFields(settings) {
					fields[yamlName(f)], owner[yamlName(f)] = f, settings
				}
			}
			var kept []*yaml.Node
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				f, ok := fields[k.Value]
				if !ok {
					t.Fatalf("%s has no field %s", typ, k.Value)
				}
				g := lookup(given, k.Value)
				// In a provider, kind or rule, a field the example does not
				// give and that has no default is left out.
				if entries && g == nil && isZero(v) {
					continue
				}
				if key := docKey(owner[k.Value]) + "." + f.Name; !documented[key] {
					documented[key] = true
					k.HeadComment = docs[docKey(owner[k.Value])][f.Name]
					if key == docKey(reflect.TypeFor[config.Config]())+".Databases" {
						// The example serves database_url, so databases
						// shows its fields in an example of its own.
						k.HeadComment += databasesExample
					}
				}
				if f.Type == reflect.TypeFor[config.Duration]() {
					d, err := time.ParseDuration(v.Value)
					if err != nil {
						t.Fatalf("%s: %v", k.Value, err)
					}
					v.Value = shortDuration(d)
				}
				walk(v, g, f.Type, entries)
				kept = append(kept, k, v)
			}
			n.Content = kept
		case n.Kind == yaml.MappingNode && typ.Kind() == reflect.Map:
			for i := 0; i+1 < len(n.Content); i += 2 {
				walk(n.Content[i+1], lookup(given, n.Content[i].Value), typ.Elem(), true)
			}
		case n.Kind == yaml.SequenceNode && typ.Kind() == reflect.Slice:
			for i, v := range n.Content {
				var g *yaml.Node
				if given != nil && i < len(given.Content) {
					g = given.Content[i]
				}
				walk(v, g, typ.Elem(), true)
			}
		}
		// Short lists and maps of scalars stay on one line.
		if (typ.Kind() == reflect.Slice || typ.Kind() == reflect.Map) && allScalars(n) {
			n.Style = yaml.FlowStyle
		}
	}
	root := filled.Content[0]
	walk(root, given.Content[0], reflect.TypeFor[config.Config](), false)
	var b bytes.Buffer
	b.WriteString("# sidefx daemon configuration (YAML), generated from the documentation of\n" +
		"# the config package's fields (go test ./config -run TestReference -update).\n" +
		"# Every value shown is the default, except in the example providers, kinds,\n" +
		"# drift rule, reconciliation schedule and console. Durations are written\n" +
		"# as Go writes them: 500ms, 60s, 5m, 720h; a bare number is refused.\n" +
		"# Unknown fields are errors. Secrets are never written here: a provider\n" +
		"# names the environment variables that hold them.\n\n")
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// settingsOf returns the settings struct of the built-in type name.
func settingsOf(t *testing.T, name string) reflect.Type {
	t.Helper()
	for _, pt := range builtin.Types() {
		if pt.Name == name {
			return pt.Settings()
		}
	}
	t.Fatalf("no built-in provider type %q", name)
	return nil
}

func lookup(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func isZero(n *yaml.Node) bool {
	switch n.Kind {
	case yaml.ScalarNode:
		return n.Tag == "!!null" || n.Value == "" || n.Value == "0" || n.Value == "false" || n.Value == "0s"
	case yaml.MappingNode, yaml.SequenceNode:
		return len(n.Content) == 0
	}
	return false
}

func allScalars(n *yaml.Node) bool {
	for _, c := range n.Content {
		if c.Kind != yaml.ScalarNode || c.HeadComment != "" {
			return false
		}
	}
	return len(n.Content) <= 8
}

// shortDuration writes d as a file's author would: 720h, 1m, 10ms.
func shortDuration(d time.Duration) string {
	s := d.String()
	for _, unit := range []string{"h", "m"} {
		s = strings.Replace(s, unit+"0m0s", unit, 1)
		s = strings.Replace(s, unit+"0s", unit, 1)
	}
	if s == "1m" {
		return "60s"
	}
	return s
}

// generateTable renders docs/config-reference.md: one table per section,
// every field with its documentation.
func generateTable(t *testing.T) []byte {
	t.Helper()
	docs := fieldDocs(t)
	var b bytes.Buffer
	for _, s := range allSections() {
		title := "`" + s.path + "`"
		switch {
		case s.path == "":
			title = "top level"
		case s.ptyp != "":
			title += ", type `" + s.ptyp + "`"
		case s.typ == reflect.TypeFor[config.ProviderConfig]():
			title += ", every type"
		}
		fmt.Fprintf(&b, "\n**%s**\n\n| field | meaning |\n|---|---|\n", title)
		for _, f := range yamlFields(s.typ) {
			doc := docs[docKey(s.typ)][f.Name]
			if doc == "" {
				t.Errorf("%s.%s has no documentation", s.typ, f.Name)
			}
			doc = strings.ReplaceAll(strings.Join(strings.Fields(doc), " "), "|", `\|`)
			fmt.Fprintf(&b, "| `%s` | %s |\n", yamlName(f), doc)
		}
	}
	return b.Bytes()
}

const (
	tableBegin = "<!-- reference: generated by go test ./config -run TestReference -update; do not edit -->\n"
	tableEnd   = "<!-- end of reference -->\n"
)

// The reference file and docs/config-reference.md's table are what the fields'
// documentation generates.
func TestReference_GeneratedFromTheFieldDocs(t *testing.T) {
	yml := generateReference(t)
	table := generateTable(t)
	doc, err := os.ReadFile("../docs/config-reference.md")
	if err != nil {
		t.Fatal(err)
	}
	begin := bytes.Index(doc, []byte(tableBegin))
	end := bytes.Index(doc, []byte(tableEnd))
	if begin < 0 || end < begin {
		t.Fatalf("docs/config-reference.md lacks the reference's markers %q … %q", tableBegin, tableEnd)
	}
	newDoc := bytes.Join([][]byte{doc[:begin+len(tableBegin)], table, doc[end:]}, nil)
	if *update {
		if err := os.WriteFile("reference.yaml", yml, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("../docs/config-reference.md", newDoc, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if config.Reference != string(yml) {
		t.Errorf("reference.yaml is not what the fields' documentation generates: run go test ./config -run TestReference -update")
	}
	if !bytes.Equal(doc, newDoc) {
		t.Errorf("docs/config-reference.md is not what the fields' documentation generates: run go test ./config -run TestReference -update")
	}
}

var defaultRE = regexp.MustCompile(`\bDefault ("[^"]*"|\S+?)[.,;:]?(?:\s|$)`)

// Where a field's documentation names its default as a plain value, that
// is the default Load fills in.
func TestReference_DocumentedDefaultsAreTheDefaults(t *testing.T) {
	docs := fieldDocs(t)
	cfg := mustParse(t, minimal, nil)
	checked := 0
	for _, s := range []struct {
		v reflect.Value
	}{{reflect.ValueOf(*cfg)}, {reflect.ValueOf(cfg.HTTP)}, {reflect.ValueOf(cfg.Log)}, {reflect.ValueOf(cfg.Dispatcher)}, {reflect.ValueOf(cfg.Drift)}, {reflect.ValueOf(cfg.Console)}} {
		typ := s.v.Type()
		for _, f := range yamlFields(typ) {
			m := defaultRE.FindStringSubmatch(docs[docKey(typ)][f.Name])
			if m == nil {
				continue
			}
			want, _ := strings.CutSuffix(strings.Trim(m[1], `"`), ")")
			got := s.v.FieldByIndex(f.Index)
			var ok, comparable bool
			switch v := got.Interface().(type) {
			case config.Duration:
				if d, err := time.ParseDuration(want); err == nil {
					comparable, ok = true, time.Duration(v) == d
				}
			case int:
				if n, err := strconv.Atoi(want); err == nil {
					comparable, ok = true, v == n
				}
			case string:
				if strings.HasPrefix(m[1], `"`) {
					comparable, ok = true, v == want
				}
			}
			if !comparable {
				continue
			}
			checked++
			if !ok {
				t.Errorf("%s.%s: documented default %s, but Load fills in %v", typ.Name(), f.Name, m[1], got.Interface())
			}
		}
	}
	if checked < 10 {
		t.Errorf("only %d documented defaults checked: the pattern misses them", checked)
	}
}
