package drift

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

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
	} else if err := engine.CheckDriftPlaceholders(r.SQL); err != nil {
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

// readOnly runs fn in the rule's read-only transaction (a savepoint if db
// is a transaction), whose statements the database cancels after the
// rule's statement timeout. fn's errors are returned as they are.
func readOnly(ctx context.Context, db DB, r Rule, fn func(pgx.Tx) error) error {
	var fnErr error
	err := engine.DriftReadOnly(ctx, db, r.timeout(), func(tx pgx.Tx) error {
		fnErr = fn(tx)
		return fnErr
	})
	if err != nil && fnErr == nil {
		return fmt.Errorf("drift rule %q: %w", r.Name, err)
	}
	return err
}

// engineRule is what the engine's statements need of r.
func (r *Rule) engineRule() engine.DriftRule {
	return engine.DriftRule{SQL: r.SQL, Kind: r.Kind, Grace: r.Grace, Window: r.Window, Sample: r.Sample,
		CheckAtMost: r.CheckAtMost, Timeout: r.timeout()}
}

// checkShape runs the rule's SQL for no rows and checks its result is one
// text-compatible column.
func checkShape(ctx context.Context, db engine.DB, r Rule) error {
	oids, err := engine.DriftShape(ctx, db, r.engineRule())
	if err != nil {
		return fmt.Errorf("%w %q: the database refuses its sql: %s", ErrRule, r.Name, err)
	}
	if len(oids) != 1 {
		return fmt.Errorf("%w %q: its sql returns %d columns, want one (the source id)", ErrRule, r.Name, len(oids))
	}
	if _, ok := textOIDs[oids[0]]; !ok {
		return fmt.Errorf("%w %q: its sql returns a column of type oid %d, want text, varchar, uuid or an integer", ErrRule, r.Name, oids[0])
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
	f := Finding{Rule: r.Name, Kind: r.Kind, Sampled: r.CheckAtMost > 0}
	start := time.Now()
	var c engine.DriftCounts
	err := readOnly(ctx, db, r, func(tx pgx.Tx) error {
		if err := checkShape(ctx, tx, r); err != nil {
			return err
		}
		var err error
		c, err = engine.DriftCompare(ctx, tx, engine.Quote(schema), r.engineRule())
		var se *engine.RuleSQLError
		switch {
		case errors.As(err, &se):
			return fmt.Errorf("drift rule %q: %s", r.Name, se.Problem)
		case err != nil:
			return fmt.Errorf("drift rule %q: %w", r.Name, err)
		}
		return nil
	})
	f.Duration = time.Since(start)
	if err != nil {
		f.Err = err
		return f
	}
	f.Missing, f.Extra = int(c.Missing), int(c.Extra)
	f.MissingIDs, f.ExtraIDs = c.MissingIDs, c.ExtraIDs
	f.Problem = nullProblem(c.Nulls)
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
