package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"regexp"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/migrations"
)

// IO is what a command reads and writes: the process's standard streams and
// environment, or a test's.
type IO struct {
	In     io.Reader
	Out    io.Writer
	Err    io.Writer
	Getenv func(string) string

	d *Daemon // the daemon running the command: its provider types
}

// command is one subcommand: one file each.
type command struct {
	name, args, summary string
	run                 func(ctx context.Context, io *IO, args []string) error
}

func commands() []command {
	return []command{
		{"run", "--config FILE", "run the dispatcher, rescuer, reaper, drift and reconciliation; serve /metrics, /healthz, /readyz, /events/NAME", runCmd},
		{"migrate", "[--namespace NS]", "apply the schema migrations the database lacks", migrateCmd},
		{"roles", "[--producer NAME …] [--login] [--print | --explain]", "as the schema's owner: create or update the producer, daemon, operator and viewer roles and their grants", rolesCmd},
		{"enqueue", "--source ID --kind KIND --payload JSON | --from FILE|-", "enqueue effects (JSON lines: source_id, kind, payload)", enqueueCmd},
		{"status", "[--json]", "effects by kind and state, oldest pending age", statusCmd},
		{"list", "[--state S] [--kind K] [--source-prefix P] [--created-after T] … [--json]", "effects matching a filter, a page at a time", listCmd},
		{"inspect", "ID|KEY | --source ID [--kind KIND] [--json]", "one effect's record and history", inspectCmd},
		{"retry", "ID [--attempts N] [--now] --note T|--no-note", "move a failed effect back to pending; --now: make a pending one backing off due now", retryCmd},
		{"resolve", "ID --as confirmed|failed [--ref R] | ID --refire; --note T|--no-note", "settle an uncertain effect", resolveCmd},
		{"cancel", "ID | --source ID --kind KIND; --note T|--no-note", "cancel a pending effect", cancelCmd},
		{"supersede", "ID --payload JSON|--payload-file FILE [--expect-hash HEX] --note T|--no-note", "replace the payload of an effect that did nothing; it is sent under a new key", supersedeCmd},
		{"bulk", "retry [--now]|resolve|refire|cancel|supersede [filter] [--provider P] [--note T --yes] [--max N]", "one action on every effect a filter matches: shown first, capped, done with --note and --yes", bulkCmd},
		{"pause", "--kind K | --provider P --note T [--any-name]", "stop claiming a kind's, or a provider's, effects (its incident)", pauseCmd},
		{"resume", "--kind K | --provider P --note T [--now]", "claim a paused kind's or provider's effects again; --now: and make those backing off due now", resumeCmd},
		{"drift", "run|list", "run the drift rules now, or list recent runs", driftCmd},
		{"reconcile", "run|list", "reconcile with the providers now, or list recent runs", reconcileCmd},
		{"version", "", "the build's version and schema version (and the database's, when one is given)", versionCmd},
	}
}

// Run runs the command args names with the built-in provider types, as
// the sidefx binary does.
func Run(ctx context.Context, args []string, io *IO) error {
	return (&Daemon{}).Run(ctx, args, io)
}

// Run runs the command args names (args[0] is the command, "run" or
// "status", say; the program's name is not in args), reading and writing io.
func (d *Daemon) Run(ctx context.Context, args []string, io *IO) error {
	dio := *io
	dio.d = d
	if dio.Getenv == nil {
		dio.Getenv = os.Getenv
	}
	io = &dio
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(io.Out)
		if len(args) == 0 {
			return usageErr("no command given")
		}
		return nil
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, io, args[1:])
		}
	}
	usage(io.Err)
	if args[0] == "demo" {
		// The demo is its own command: the sidefx binary links no fake
		// provider, cluster launcher or broker client.
		return usageErr("the demo is its own command: go run ./cmd/sidefx-demo (from a clone of sidefx)")
	}
	return usageErr("unknown command %q", args[0])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sidefx COMMAND [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n            %s\n", c.name, c.args, c.summary)
	}
	fmt.Fprintln(w, "\nEvery command takes --config FILE and --database-url URL, which wins over SIDEFX_DATABASE_URL, which wins over the file's database_url. sidefx COMMAND -h lists its flags.")
	fmt.Fprintln(w, "A configuration with databases (several): --database NAME picks one; status shows each without it.")
	fmt.Fprintln(w, "The fields of list, inspect, status, drift and reconcile --json: \"JSON output\" in docs/operations.md.")
}

// usageError is a command line that cannot be run: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErr(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	// Every command: a table, column or function of sidefx's missing says
	// to run sidefx migrate (schemaProblem names the versions where a
	// command can read them).
	err = engine.ExplainSchema(err)
	fmt.Fprintln(stderr, "sidefx:", err)
	var ue *usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// common are the flags every command takes.
type common struct {
	configPath  string
	databaseURL string
	schema      string
	dbName      string // --database: one of the configuration's databases
}

func newFlags(name string, io *IO) (*flag.FlagSet, *common) {
	fs := flag.NewFlagSet("sidefx "+name, flag.ContinueOnError)
	fs.SetOutput(io.Err)
	c := &common{}
	fs.StringVar(&c.configPath, "config", "", "configuration `file` (YAML)")
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL `url` (default: SIDEFX_DATABASE_URL, else the config's database_url)")
	fs.StringVar(&c.schema, "schema", "", "schema holding side_effects (default: the config's, or public)")
	fs.StringVar(&c.dbName, "database", "", "`name` of one of the config's databases (required when it has several)")
	return fs, c
}

// parse parses args, turning flag errors into usage errors. Flags may
// follow positional arguments (sidefx retry 42 --note …); "--" ends the
// flags.
func parse(fs *flag.FlagSet, args []string) error {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return usageErr("%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	return fs.Parse(append([]string{"--"}, positional...))
}

// loadConfig loads --config, if given.
func (c *common) loadConfig(io *IO) (*config.Config, error) {
	if c.configPath == "" {
		return nil, nil
	}
	// The flag stands in for SIDEFX_DATABASE_URL, so that a file without
	// database_url is not refused when the flag gives one.
	getenv := io.Getenv
	if c.databaseURL != "" && !hasDatabases(c.configPath) {
		getenv = func(name string) string {
			if name == config.EnvDatabaseURL {
				return c.databaseURL
			}
			return io.Getenv(name)
		}
	}
	types, err := io.providerTypes()
	if err != nil {
		return nil, err
	}
	cfg, err := config.Load(c.configPath, getenv, types...)
	if err != nil {
		return nil, fmt.Errorf("configuration %s:\n%w", c.configPath, err)
	}
	return cfg, nil
}

// hasDatabases reports whether the file at path has a top-level
// databases: (read again by config.Load, which says what is wrong with
// it): --database-url then connects to the one --database names, and does
// not stand in for SIDEFX_DATABASE_URL, which databases: refuses.
func hasDatabases(path string) bool {
	b, err := os.ReadFile(path)
	return err == nil && topDatabases.Match(b)
}

var topDatabases = regexp.MustCompile(`(?m)^databases\s*:`)

// database returns the URL and schema to use: flags, then the config, then
// the environment. Of a configuration with databases, --database names
// the one (needed when there are several).
func (c *common) database(io *IO) (url, schema string, err error) {
	cfg, err := c.loadConfig(io)
	if err != nil {
		return "", "", err
	}
	url, schema = c.databaseURL, c.schema
	if cfg != nil {
		d, err := c.pickDatabase(cfg)
		if err != nil {
			return "", "", err
		}
		if d != nil {
			if url == "" {
				// --database-url wins: connecting to one database of
				// several as another role (its owner, to migrate).
				url = d.ConnString()
			}
			if schema == "" {
				schema = d.Schema
			}
		}
		if url == "" {
			url = cfg.DatabaseURL
		}
		if schema == "" {
			schema = cfg.Schema
		}
	} else if c.dbName != "" {
		return "", "", usageErr("--database %s: names one of the databases of a configuration: give --config too", c.dbName)
	}
	if url == "" {
		url = io.Getenv("SIDEFX_DATABASE_URL")
	}
	if url == "" {
		return "", "", usageErr("no database: give --database-url, --config, or set SIDEFX_DATABASE_URL")
	}
	return url, schema, nil
}

// pickDatabase returns the database of cfg's databases that --database
// names, or the only one; nil for a configuration with database_url. A
// name cfg does not have, or none when it has several, is an error listing
// its names.
func (c *common) pickDatabase(cfg *config.Config) (*config.DatabaseConfig, error) {
	names := strings.Join(cfg.DatabaseNames(), ", ")
	if len(cfg.Databases) == 0 {
		if c.dbName != "" && c.dbName != config.DefaultDatabase {
			return nil, usageErr("--database %s: the configuration has one database, %s (database_url)", c.dbName, config.DefaultDatabase)
		}
		return nil, nil
	}
	if c.dbName == "" {
		if len(cfg.Databases) == 1 {
			return &cfg.Databases[0], nil
		}
		return nil, usageErr("the configuration has several databases: give --database NAME (%s)", names)
	}
	for i := range cfg.Databases {
		if cfg.Databases[i].Name == c.dbName {
			return &cfg.Databases[i], nil
		}
	}
	return nil, usageErr("--database %s: no such database in the configuration (databases: %s)", c.dbName, names)
}

// open connects to the database and returns a pool and a store on it.
func (c *common) open(ctx context.Context, io *IO) (*pgxpool.Pool, *engine.Store, error) {
	url, schema, err := c.database(io)
	if err != nil {
		return nil, nil, err
	}
	// A command may reach the database through a pooler in transaction
	// mode (sidefx enqueue from a producer's host, say).
	pool, err := openPool(ctx, "connect", url, 0, true)
	if err != nil {
		return nil, nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("connect: %w", redactURL(err, url))
	}
	store, err := engine.NewStore(pool, &engine.StoreConfig{Schema: schema})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, store, nil
}

// schemaProblem explains err, from a statement on schema, when the schema
// lacks sidefx's tables or some of its migrations (an undefined table,
// column or function): "schema app has no sidefx tables: run sidefx
// migrate", as sidefx run says, rather than PostgreSQL's words. Any other
// error, or one the migration status does not explain, is returned as it is.
func schemaProblem(ctx context.Context, pool *pgxpool.Pool, schema string, err error) error {
	pe, ok := engine.PgErrorOf(err)
	if !ok || (pe.Code != "42P01" && pe.Code != "42703" && pe.Code != "42883") {
		return err
	}
	applied, missing, serr := migrations.Status(ctx, pool, &migrations.Config{Schema: schema})
	if serr != nil || len(missing) == 0 {
		return err
	}
	if schema == "" {
		schema = "public"
	}
	return &migrations.SchemaBehindError{Schema: schema, Applied: applied, Missing: missing}
}

// redactURL keeps a database password out of an error.
func redactURL(err error, url string) error {
	cfg, perr := pgxpool.ParseConfig(url)
	if perr != nil || cfg.ConnConfig.Password == "" || !strings.Contains(err.Error(), cfg.ConnConfig.Password) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), cfg.ConnConfig.Password, "xxxxx"))
}

// actor names who runs an operator's command: --actor, else user@host.
func actor(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host + " (sidefx cli)"
}

// oneArg returns the single positional argument.
func oneArg(fs *flag.FlagSet, what string) (string, error) {
	if fs.NArg() != 1 {
		return "", usageErr("want exactly one %s, got %d arguments", what, fs.NArg())
	}
	return fs.Arg(0), nil
}

func sortedKeys[M ~map[K]V, K ~string, V any](m M) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}
