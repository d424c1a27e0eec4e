package drift

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// Rule says what should exist: every source id its SQL returns must have
// exactly one effect of Kind.
type Rule struct {
	// Name identifies the rule in findings, logs and metrics: lowercase
	// words of [a-z0-9_-] joined by dots or underscores.
	Name string
	// Kind is the effect kind each expected source must have.
	Kind string
	// SQL returns the expected source ids: one column of a text-compatible
	// type (text, varchar, uuid, integer types). It may use two
	// placeholders, each standing for a timestamptz:
	//   :due_before   sources whose effect is due by then (now − Grace);
	//                 without it, Grace cannot apply to missing effects
	//   :window_start the start of the Window, to bound the scan
	// e.g. SELECT id FROM orders WHERE paid_at < :due_before AND paid_at >= :window_start
	SQL string
	// Grace is how long a fresh source has to get its effect before it is
	// reported missing (a service that enqueues asynchronously needs some).
	// Default 0.
	Grace time.Duration
	// Window bounds the comparison to the recent past: sources the SQL
	// returns for :window_start, and effects created since window start
	// plus Grace. 0 compares everything.
	Window time.Duration
	// Sample caps the source ids kept per finding. Default 100.
	Sample int
	// CheckAtMost, if positive, checks a random sample of at most this many
	// due sources (for missing) and of at most this many effects in the
	// window (for extra), instead of all of them: on very large tables a
	// run then costs about the same whatever their size, and its counts are
	// counts in the sample (Finding.Sampled). Default 0: check everything.
	CheckAtMost int
	// StatementTimeout bounds each statement of the rule's run: the
	// database cancels one that runs longer, and the rule's run fails.
	// Default 0: the Checker's Config.StatementTimeout, and
	// DefaultStatementTimeout (30s) without one.
	StatementTimeout time.Duration
}

// DefaultStatementTimeout is how long a statement of a rule's run may take
// when neither the rule nor the Checker's Config says.
const DefaultStatementTimeout = 30 * time.Second

func (r *Rule) timeout() time.Duration {
	if r.StatementTimeout > 0 {
		return r.StatementTimeout
	}
	return DefaultStatementTimeout
}

// DB is what rules run on: a *pgxpool.Pool or a *pgx.Conn, or a pgx.Tx, in
// which each rule runs in a savepoint. Each rule runs in a read-only
// transaction of its own, whatever its SQL calls.
type DB interface {
	engine.DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

var ruleNameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]*([._][a-z0-9_-]+)*$`)

// ErrRule is wrapped by every rule validation error.
var ErrRule = errors.New("invalid drift rule")

// check validates what can be checked without the database.
func (r *Rule) check() error {
	var errs []error
	if !ruleNameRE.MatchString(r.Name) || len(r.Name) > 128 {
		errs = append(errs, fmt.Errorf("name %q is not lowercase words of [a-z0-9_-] joined by dots or underscores", r.Name))
	}
	if err := effects.ValidateKind(r.Kind); err != nil {
		errs = append(errs, fmt.Errorf("kind: %w", err))
	}
	if strings.TrimSpace(r.SQL) == "" {
		errs = append(errs, errors.New("sql is empty"))
	} else if err := checkPlaceholders(r.SQL); err != nil {
		errs = append(errs, err)
	}
	if r.Grace < 0 || r.Window < 0 || r.Sample < 0 || r.CheckAtMost < 0 || r.StatementTimeout < 0 {
		errs = append(errs, errors.New("grace, window, sample, check_at_most and statement_timeout must not be negative"))
	}
	if r.Window > 0 && r.Grace >= r.Window {
		errs = append(errs, fmt.Errorf("grace %s is not below window %s: nothing would be compared", r.Grace, r.Window))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w %q: %w", ErrRule, r.Name, err)
	}
	return nil
}

// textOIDs are the result column types a rule may return: text, varchar,
// bpchar, name, uuid, int2, int4, int8.
var textOIDs = map[uint32]string{25: "text", 1043: "varchar", 1042: "char", 19: "name", 2950: "uuid", 21: "smallint", 23: "integer", 20: "bigint"}

// Validate checks each rule: its fields and placeholders, then its SQL,
// which the database runs for no rows (read-only, with the rule's statement
// timeout) and which must return one text-compatible column. It returns one
// error per invalid rule, each naming the rule, with positions in the rule's
// own SQL; valid rules are unaffected by the others.
func Validate(ctx context.Context, db DB, rules []Rule) map[string]error {
	bad := map[string]error{}
	seen := map[string]bool{}
	for _, r := range rules {
		if seen[r.Name] {
			bad[r.Name] = fmt.Errorf("%w %q: the name is used twice", ErrRule, r.Name)
			continue
		}
		seen[r.Name] = true
		if err := r.check(); err != nil {
			bad[r.Name] = err
			continue
		}
		if err := readOnly(ctx, db, r, func(tx pgx.Tx) error { return checkShape(ctx, tx, r) }); err != nil {
			bad[r.Name] = err
		}
	}
	return bad
}

// readOnly runs fn in a read-only transaction (a savepoint if db is a
// transaction) whose statements the database cancels after the rule's
// statement timeout. It always rolls back: a rule has nothing to keep.
func readOnly(ctx context.Context, db DB, r Rule, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("drift rule %q: begin its read-only transaction: %w", r.Name, engine.Brief(err))
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing was written; a failed rollback ends the session
	// A whole number of milliseconds, at least one (0 would mean none).
	ms := max(r.timeout().Milliseconds(), 1)
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET TRANSACTION READ ONLY; SET LOCAL statement_timeout = %d", ms)); err != nil {
		return fmt.Errorf("drift rule %q: begin its read-only transaction: %w", r.Name, engine.Brief(err))
	}
	return fn(tx)
}

// problem says what the database made of the rule's SQL, run inside q:
// positions are placed in the rule's own text, and a statement timeout is
// named with its value.
func (r *Rule) problem(q *query, err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "57014" && strings.Contains(pe.Message, "statement timeout") {
		return fmt.Sprintf("its sql ran past its statement timeout %s", r.timeout())
	}
	return q.explain(err, r.SQL)
}

// checkShape runs the rule's SQL for no rows and checks its result is one
// text-compatible column.
func checkShape(ctx context.Context, db engine.DB, r Rule) error {
	q := new(query).add(`WITH params AS (SELECT $1::timestamptz, $2::timestamptz)
		SELECT * FROM (`).rule(r.bind(1, 2)).add(`) AS q LIMIT 0`)
	rows, err := db.Query(ctx, q.String(), time.Now(), pgxInfinity())
	if err != nil {
		return fmt.Errorf("%w %q: the database refuses its sql: %s", ErrRule, r.Name, r.problem(q, err))
	}
	fields := rows.FieldDescriptions()
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%w %q: the database refuses its sql: %s", ErrRule, r.Name, r.problem(q, err))
	}
	if len(fields) != 1 {
		return fmt.Errorf("%w %q: its sql returns %d columns, want one (the source id)", ErrRule, r.Name, len(fields))
	}
	if _, ok := textOIDs[fields[0].DataTypeOID]; !ok {
		return fmt.Errorf("%w %q: its sql returns a column of type oid %d, want text, varchar, uuid or an integer", ErrRule, r.Name, fields[0].DataTypeOID)
	}
	return nil
}

// Finding is what one rule's run found.
type Finding struct {
	Rule string
	Kind string
	// Missing: expected sources, due, with no effect of the kind.
	Missing    int
	MissingIDs []string // at most Sample, sorted
	Extra      int
	ExtraIDs   []string
	Duration   time.Duration
	// Sampled: the counts are of a random sample (Rule.CheckAtMost), not of
	// every source and effect.
	Sampled bool
	// Err: the rule's run failed, or the rule was refused; the counts are
	// zero.
	Err error
	// Refused: the Checker refused the rule when it started (its fields or
	// its SQL are invalid, Err says why), so it does not run until it is
	// fixed and the process restarted. It counts as an error in every run.
	Refused bool `json:",omitempty"`
	// Problem: something wrong with the rule that did not stop its run, so
	// its counts stand: its SQL returned NULL ids, which were left out of the
	// comparison. It counts as an error of the run (Report.Errors).
	Problem string `json:",omitempty"`
}

// checkRule runs one rule in one statement, so missing and extra are
// computed on one snapshot.
func checkRule(ctx context.Context, db DB, schema string, r Rule) Finding {
	f := Finding{Rule: r.Name, Kind: r.Kind}
	sample := r.Sample
	if sample == 0 {
		sample = 100
	}
	t := engine.Quote(schema) + ".side_effects"
	// $1 due_before for missing, $2 window start, $3 kind, $4 now (every
	// existing source, for extra), $5 grace, $6 sample.
	// With CheckAtMost, a random sample of the due sources and of the
	// effects in the window is compared instead of all of them.
	sampling := ""
	if r.CheckAtMost > 0 {
		sampling = fmt.Sprintf(" ORDER BY random() LIMIT %d", r.CheckAtMost)
		f.Sampled = true
	}
	// params names every parameter's type, so a rule that uses neither
	// placeholder leaves none of them untyped. A NULL the rule returns is no
	// source id: due leaves it out, and known counts it (GROUP BY puts the
	// NULLs in one group) for Finding.Problem.
	q := new(query).add(`WITH params AS (SELECT $1::timestamptz, $2::timestamptz, $3::text, $4::timestamptz, $5::interval, $6::integer),
		due AS MATERIALIZED (
			SELECT source_id FROM (SELECT DISTINCT x.src::text AS source_id FROM (`).rule(r.bind(1, 2)).add(`) AS x(src)
				WHERE x.src IS NOT NULL) d` + sampling + `
		), known AS MATERIALIZED (
			SELECT x.src::text AS source_id, count(*) AS n FROM (`).rule(r.bind(4, 2)).add(`) AS x(src) GROUP BY 1
		), missing AS (
			SELECT d.source_id FROM due d
			WHERE NOT EXISTS (SELECT 1 FROM ` + t + ` s WHERE s.source_id = d.source_id AND s.kind = $3)
		), recent AS (
			SELECT s.source_id FROM ` + t + ` s
			WHERE s.kind = $3 AND s.state <> 'cancelled' AND s.created_at >= $2::timestamptz + $5::interval` + sampling + `
		), extra AS (
			SELECT r.source_id FROM recent r
			WHERE NOT EXISTS (SELECT 1 FROM known k WHERE k.source_id = r.source_id)
		)
		SELECT coalesce((SELECT n FROM known WHERE source_id IS NULL), 0),
			(SELECT count(*) FROM missing),
			coalesce((SELECT pg_catalog.array_agg(source_id ORDER BY source_id) FROM (SELECT source_id FROM missing ORDER BY source_id LIMIT $6) m), '{}'),
			(SELECT count(*) FROM extra),
			coalesce((SELECT pg_catalog.array_agg(source_id ORDER BY source_id) FROM (SELECT source_id FROM extra ORDER BY source_id LIMIT $6) e), '{}')`)
	start := time.Now()
	var nulls, missing, extra int64
	err := readOnly(ctx, db, r, func(tx pgx.Tx) error {
		if err := checkShape(ctx, tx, r); err != nil {
			return err
		}
		windowStart := pgxInfinity()
		var now time.Time
		if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
			return fmt.Errorf("drift rule %q: %w", r.Name, engine.Brief(err))
		}
		if r.Window > 0 {
			windowStart = now.Add(-r.Window)
		}
		err := tx.QueryRow(ctx, q.String(), now.Add(-r.Grace), windowStart, r.Kind, now, r.Grace, sample).
			Scan(&nulls, &missing, &f.MissingIDs, &extra, &f.ExtraIDs)
		if err != nil {
			return fmt.Errorf("drift rule %q: %s", r.Name, r.problem(q, err))
		}
		return nil
	})
	f.Duration = time.Since(start)
	if err != nil {
		f.Err, f.MissingIDs, f.ExtraIDs = err, nil, nil
		return f
	}
	f.Missing, f.Extra = int(missing), int(extra)
	f.Problem = nullProblem(nulls)
	return f
}

// nullProblem says what a rule whose SQL returned n NULL ids is told: a
// NULL is no source id, so it is left out and the other ids are compared.
func nullProblem(n int64) string {
	switch n {
	case 0:
		return ""
	case 1:
		return "the rule's query returned 1 NULL id: it was left out"
	}
	return fmt.Sprintf("the rule's query returned %d NULL ids: they were left out", n)
}

// pgxInfinity is a time far enough in the past to stand for "no window".
func pgxInfinity() time.Time { return time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC) }
