// Package migrations holds the ordered SQL that creates and upgrades the
// sidefx schema, embedded in the binary, and Apply, which runs the missing
// steps once.
//
// Each file NNNN_name.sql is one version. Apply runs, in one transaction
// under a lock of sidefx_migrations (an advisory lock before it exists),
// every version the database lacks, and records it in sidefx_migrations.
// Two processes applying at once serialise on the lock;
// the second finds nothing to do. The transaction is READ COMMITTED whatever
// the database's default_transaction_isolation, so that the second reads the
// versions after the lock, with what the first committed. Released files never change: a change to
// the schema is a new file (released.sum pins each file's SHA-256, and a
// test builds every released version and upgrades it). A schema newer than
// the build, migrated by a later sidefx, is refused (NewerSchemaError).
package migrations

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sidefx/sidefx/internal/engine"
)

//go:embed *.sql
var files embed.FS

// Beginner is what Apply needs from the database: *pgxpool.Pool and
// *pgx.Conn satisfy it. Apply begins with their BeginTx, at READ COMMITTED;
// a Beginner without BeginTx must give READ COMMITTED transactions for
// concurrent Apply calls to succeed.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config says where and how to apply the migrations.
type Config struct {
	// Schema is the PostgreSQL schema that holds the sidefx tables and
	// functions; Apply creates it if needed. Default "public".
	Schema string

	// Namespace is mixed into every derived key (see derive.KeyNS) so that
	// deployments sharing a provider account never send the same key. Empty
	// leaves the stored namespace as it is (the default is no namespace). It
	// can be set only while side_effects is empty: once keys have been
	// derived, changing it would give a retried effect another key, and
	// Apply returns ErrNamespaceChange instead.
	Namespace string

	// LockWait is how long Apply waits for the lock of a schema's very
	// first migration (an advisory lock: no sidefx table exists yet to
	// lock), which any role that can connect may hold; past it Apply fails
	// with a *LockedError naming the sessions holding it. Default 1 minute.
	// Once sidefx_migrations exists Apply locks it instead, which only
	// roles that may write it can hold, and waits as long as they do.
	LockWait time.Duration
}

// LockedError is returned by Apply when the first migration's lock was
// held by another session for longer than Config.LockWait.
type LockedError struct {
	Schema  string
	Waited  time.Duration
	Holders []string // each "pid N, role R, application A, since T"
}

func (e *LockedError) Error() string {
	who := "a session that has since ended"
	if len(e.Holders) > 0 {
		who = strings.Join(e.Holders, "; ")
	}
	return fmt.Sprintf("apply migrations: schema %s: waited %s for the migrations lock (advisory lock %d), held by %s; "+
		"end that session (pg_terminate_backend) or wait for it, then run migrate again", e.Schema, e.Waited, lockKey(e.Schema), who)
}

// ErrNamespaceChange is returned by Apply when Config.Namespace differs from
// the namespace the database's keys were derived with.
var ErrNamespaceChange = errors.New("the key namespace cannot change once effects exist")

// NewerSchemaError is returned by Apply, and by CheckNotNewer, for a
// database whose schema has a version this build does not know: it was
// migrated by a newer sidefx, whose statements this one does not make
// (evidence it would not keep, guards it would not check).
type NewerSchemaError struct {
	Schema  string
	Version int // the newest version the database holds
	Latest  int // the newest this build knows
}

func (e *NewerSchemaError) Error() string {
	return fmt.Sprintf("the database's sidefx schema %s is version %d, newer than this sidefx (%d): upgrade sidefx before running it against this database",
		e.Schema, e.Version, e.Latest)
}

// CheckNotNewer returns a *NewerSchemaError if applied, the versions a
// database's schema holds (as Status returns them), has one newer than
// this build's newest, else nil.
func CheckNotNewer(schema string, applied []int) error {
	return checkNotNewer(schema, applied, Latest())
}

func checkNotNewer(schema string, applied []int, latest int) error {
	if len(applied) == 0 {
		return nil
	}
	if v := slices.Max(applied); v > latest {
		if schema == "" {
			schema = "public"
		}
		return &NewerSchemaError{Schema: schema, Version: v, Latest: latest}
	}
	return nil
}

// Migration is one embedded schema version.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

var fileRE = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)

// All returns the embedded migrations in version order.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("embedded migration %q is not named NNNN_name.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		b, err := fs.ReadFile(files, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		if len(ms) > 0 && ms[len(ms)-1].Version >= v {
			return nil, fmt.Errorf("migration %s repeats version %d", e.Name(), v)
		}
		ms = append(ms, Migration{Version: v, Name: m[2], SQL: string(b)})
	}
	return ms, nil
}

// Latest returns the highest embedded version.
func Latest() int {
	ms, err := All()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Apply applies the migrations db lacks, in order, in one transaction. It is
// safe to call from several processes at once and does nothing when the
// schema is current. A schema newer than this build (a version it does not
// know) is refused with a *NewerSchemaError, changing nothing. cfg may be
// nil for the defaults.
func Apply(ctx context.Context, db Beginner, cfg *Config) error {
	ms, err := All()
	if err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	return apply(ctx, db, cfg, ms)
}

// apply applies those of ms that db lacks; the upgrade test passes the
// migrations as they were released, up to a version.
func apply(ctx context.Context, db Beginner, cfg *Config, ms []Migration) error {
	if cfg == nil {
		cfg = &Config{}
	}
	schema, err := engine.CheckSchema(cfg.Schema)
	if err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	q := engine.Quote(schema)

	tx, err := beginReadCommitted(ctx, db)
	if err != nil {
		return fmt.Errorf("apply migrations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	// Read committed, each statement after the lock sees what the migrator
	// ahead of this one committed; under repeatable read or serializable
	// the snapshot would be taken when the lock was asked for, before that
	// commit, and the versions it applied would be applied again.
	// The migrations' statements, and the function bodies they create,
	// resolve names with pg_catalog alone, whatever schema on the
	// migrator's search_path someone else can create functions in: a
	// look-alike of a built-in there never runs as the migrator.
	if _, err := tx.Exec(ctx, "SET LOCAL search_path = pg_catalog, pg_temp"); err != nil {
		return fmt.Errorf("apply migrations: pin search_path: %w", err)
	}
	if err := lock(ctx, tx, schema, cmp.Or(cfg.LockWait, time.Minute)); err != nil {
		return err
	}
	// Only what is missing is created: CREATE … IF NOT EXISTS needs the
	// privilege to create even when the object exists, and a current
	// schema must be a no-op for any role that can read it.
	var haveSchema, haveTable bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1),
			pg_catalog.to_regclass($2) IS NOT NULL`, schema, q+".sidefx_migrations").Scan(&haveSchema, &haveTable); err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	if !haveSchema {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+q); err != nil {
			return fmt.Errorf("apply migrations: create schema %s: %w", schema, ownerHint(err))
		}
	}
	if !haveTable {
		if _, err := tx.Exec(ctx, `CREATE TABLE `+q+`.sidefx_migrations (
			version integer PRIMARY KEY,
			name text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("apply migrations: create version table: %w", ownerHint(err))
		}
	}
	applied, err := appliedVersions(ctx, tx, q)
	if err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	if len(ms) > 0 {
		if err := checkNotNewer(schema, applied, ms[len(ms)-1].Version); err != nil {
			return err
		}
	}
	for _, m := range ms {
		if slices.Contains(applied, m.Version) {
			continue
		}
		if _, err := tx.Exec(ctx, render(m.SQL, schema)); err != nil {
			return fmt.Errorf("apply migration %04d_%s: %w", m.Version, m.Name, ownerHint(err))
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+q+".sidefx_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			return fmt.Errorf("record migration %04d_%s: %w", m.Version, m.Name, err)
		}
	}
	if cfg.Namespace != "" {
		if err := setNamespace(ctx, tx, q, cfg.Namespace); err != nil {
			return fmt.Errorf("apply migrations: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("apply migrations: commit: %w", err)
	}
	return nil
}

// ownerHint adds to a refusal for want of privilege (SQLSTATE 42501) who
// may migrate: the schema's owner, the role that applied the migrations
// before (or, for a new schema, a role that may create one).
func ownerHint(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" {
		return fmt.Errorf("%w: run sidefx migrate as the owner of sidefx's tables (the role that applied its migrations before; for a new schema, a role that may create it)", err)
	}
	return err
}

// beginReadCommitted begins Apply's transaction at READ COMMITTED, whatever
// the database's or the role's default_transaction_isolation, when db can
// say the level (*pgxpool.Pool and *pgx.Conn can); any other Beginner's
// transaction has the isolation it gives, and a repeatable read one makes
// concurrent Apply calls fail.
func beginReadCommitted(ctx context.Context, db Beginner) (pgx.Tx, error) {
	if b, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		return b.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	}
	return db.Begin(ctx)
}

// Status reports the versions applied in the schema and those embedded but
// not yet applied. A database that does not have the schema at all has every
// version missing. Applied versions newer than this build's are reported
// as they are: CheckNotNewer tells.
func Status(ctx context.Context, db Beginner, cfg *Config) (applied, missing []int, err error) {
	if cfg == nil {
		cfg = &Config{}
	}
	schema, err := engine.CheckSchema(cfg.Schema)
	if err != nil {
		return nil, nil, fmt.Errorf("migration status: %w", err)
	}
	ms, err := All()
	if err != nil {
		return nil, nil, fmt.Errorf("migration status: %w", err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("migration status: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT pg_catalog.to_regclass($1) IS NOT NULL", engine.Quote(schema)+".sidefx_migrations").Scan(&exists); err != nil {
		return nil, nil, fmt.Errorf("migration status: %w", err)
	}
	if exists {
		if applied, err = appliedVersions(ctx, tx, engine.Quote(schema)); err != nil {
			return nil, nil, fmt.Errorf("migration status: %w", err)
		}
	}
	for _, m := range ms {
		if !slices.Contains(applied, m.Version) {
			missing = append(missing, m.Version)
		}
	}
	return applied, missing, nil
}

func appliedVersions(ctx context.Context, tx pgx.Tx, q string) ([]int, error) {
	rows, err := tx.Query(ctx, "SELECT version FROM "+q+".sidefx_migrations ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("read applied versions: %w", err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("read applied versions: %w", err)
	}
	return vs, nil
}

func setNamespace(ctx context.Context, tx pgx.Tx, q, ns string) error {
	var current string
	var anyRows bool
	err := tx.QueryRow(ctx, `SELECT s.namespace, EXISTS (SELECT 1 FROM `+q+`.side_effects)
		FROM `+q+`.sidefx_settings s FOR UPDATE`).Scan(&current, &anyRows)
	if err != nil {
		return fmt.Errorf("read key namespace: %w", err)
	}
	if current == ns {
		return nil
	}
	if anyRows {
		return fmt.Errorf("set namespace %q, keys were derived with %q: %w", ns, current, ErrNamespaceChange)
	}
	if _, err := tx.Exec(ctx, "UPDATE "+q+".sidefx_settings SET namespace = $1", ns); err != nil {
		return fmt.Errorf("set key namespace %q: %w", ns, err)
	}
	return nil
}

// render fills a migration's placeholders for schema.
func render(sql, schema string) string {
	return strings.NewReplacer(
		"{{schema}}", engine.Quote(schema),
		"{{channel}}", engine.Channel(schema),
	).Replace(sql)
}

// lock serialises Apply per schema, in tx (engine.LockMigrations): a
// *LockedError when the first migration's advisory lock stayed held for
// wait.
func lock(ctx context.Context, tx pgx.Tx, schema string, wait time.Duration) error {
	holders, err := engine.LockMigrations(ctx, tx, schema, lockKey(schema), wait)
	if errors.Is(err, engine.ErrLockWait) {
		return &LockedError{Schema: schema, Waited: wait, Holders: holders}
	}
	if err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	return nil
}

// lockKey is the advisory lock that serialises Apply per schema before its
// first migration.
func lockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("sidefx/migrations/" + schema))
	return int64(h.Sum64())
}

// Querier is what CheckCurrent needs from the database: pgx's QueryRow.
// *pgxpool.Pool, *pgx.Conn and pgx.Tx have it; a database/sql handle has
// it through a wrapper that scans an integer array (sidefx's own).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SchemaBehindError is returned by CheckCurrent for a schema that lacks
// versions this build has: none at all (no sidefx tables), or some.
type SchemaBehindError struct {
	Schema  string
	Applied []int // the versions the schema holds; none without sidefx tables
	Missing []int // the versions this build has and the schema lacks
}

func (e *SchemaBehindError) Error() string {
	if len(e.Applied) == 0 {
		return fmt.Sprintf("schema %s has no sidefx tables: run sidefx migrate", e.Schema)
	}
	return fmt.Sprintf("schema %s lacks migrations %v: run sidefx migrate", e.Schema, e.Missing)
}

// CheckCurrent returns a *SchemaBehindError if the schema of cfg lacks any
// version this build has (a database never migrated, or migrated by an
// older sidefx), else nil. A schema newer than this build is not refused
// here (CheckNotNewer tells). A role that may not read sidefx_migrations
// (a producer holds no privilege on sidefx's tables) is not checked
// further than that the table exists. cfg may be nil for the defaults.
func CheckCurrent(ctx context.Context, db Querier, cfg *Config) error {
	if cfg == nil {
		cfg = &Config{}
	}
	schema, err := engine.CheckSchema(cfg.Schema)
	if err != nil {
		return fmt.Errorf("migration status: %w", err)
	}
	ms, err := All()
	if err != nil {
		return fmt.Errorf("migration status: %w", err)
	}
	var exists, readable bool
	if err := db.QueryRow(ctx, `SELECT c.oid IS NOT NULL, c.oid IS NOT NULL AND pg_catalog.has_table_privilege(c.oid, 'SELECT')
		FROM (SELECT pg_catalog.to_regclass($1) AS oid) c`, engine.Quote(schema)+".sidefx_migrations").Scan(&exists, &readable); err != nil {
		return fmt.Errorf("migration status: %w", err)
	}
	var applied []int
	switch {
	case !exists:
	case !readable:
		return nil
	default:
		if err := db.QueryRow(ctx, "SELECT coalesce(pg_catalog.array_agg(version ORDER BY version), '{}') FROM "+engine.Quote(schema)+".sidefx_migrations").
			Scan(&applied); err != nil {
			return fmt.Errorf("migration status: read applied versions: %w", err)
		}
	}
	var missing []int
	for _, m := range ms {
		if !slices.Contains(applied, m.Version) {
			missing = append(missing, m.Version)
		}
	}
	if len(missing) > 0 {
		return &SchemaBehindError{Schema: schema, Applied: applied, Missing: missing}
	}
	return nil
}
