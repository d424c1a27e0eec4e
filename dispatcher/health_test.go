package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/internal/metrics"
	"github.com/sidefx/sidefx/providers/providertest"
)

// daemonRole returns a pool on a fresh database as its owner, and one as a
// fresh role holding deploy/postgres/daemon-role.sql's grants, the least
// privileges `sidefx run` needs, and the role's name.
func daemonRole(t *testing.T) (owner, daemon *pgxpool.Pool, role string) {
	t.Helper()
	return pgtest.DaemonRole(t)
}

// sql runs stmt on pool, failing the test on an error.
func sql(t *testing.T, pool *pgxpool.Pool, stmt string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// errorLog is a slog.Handler that counts error lines by their op attribute.
type errorLog struct {
	mu   *sync.Mutex
	byOp map[string]int
}

func newErrorLog() errorLog { return errorLog{mu: &sync.Mutex{}, byOp: map[string]int{}} }

func (h errorLog) Enabled(context.Context, slog.Level) bool { return true }
func (h errorLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelError {
		return nil
	}
	op := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "op" {
			op = a.Value.String()
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.byOp[op]++
	return nil
}
func (h errorLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h errorLog) WithGroup(string) slog.Handler      { return h }

func (h errorLog) lines(op string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byOp[op]
}

// dbErrors reads sidefx_dispatcher_errors_total{op,class} from reg.
func dbErrors(t *testing.T, reg *prometheus.Registry, op string, class dispatcher.ErrorClass) int {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "sidefx_dispatcher_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["op"] == op && labels["class"] == string(class) {
				return int(m.GetCounter().GetValue())
			}
		}
	}
	return 0
}

// healthError waits until d reports a persistent failure and returns it.
func healthError(t *testing.T, d *dispatcher.Dispatcher) *dispatcher.HealthError {
	t.Helper()
	var he *dispatcher.HealthError
	waitFor(t, 30*time.Second, func() (bool, string) {
		err := d.Healthy()
		if err == nil {
			return false, "healthy"
		}
		if !errors.As(err, &he) {
			t.Fatalf("Healthy() = %T %v, want a *HealthError", err, err)
		}
		return true, ""
	})
	return he
}

// The dispatcher's role loses the privilege to record outcomes in the
// middle of a run (UPDATE on outcome_attempt, which claims do not set): the
// outcome of the call already made is kept and retried; Healthy says what
// is wrong, for /readyz; the metric counts every failure; the error is
// logged once per interval, not at every retry; no effect is claimed while
// outcomes cannot be recorded. Once the privilege is back, every outcome is
// recorded and every effect called exactly once.
func TestDispatcher_RefusedRecordIsSurfacedAndOutcomesKept(t *testing.T) {
	t.Parallel()
	owner, daemon, role := daemonRole(t)
	ctx := context.Background()
	store, err := engine.NewStore(owner, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	fake := providertest.New(providertest.Config{Name: "stripe", Idempotent: true})
	logs := newErrorLog()
	clk := newClock()
	d := build(t, daemon, &dispatcher.Config{
		Kinds: kinds("charge.create", dispatcher.Kind{Provider: fake}), Workers: 8,
		PollInterval: 20 * time.Millisecond, Observer: m, Logger: slog.New(logs),
	})
	dispatcher.SetClock(d, clk.Now)
	keys := enqueue(t, owner, "charge.create", "a", 3)
	run(t, d)
	waitStates(t, owner, 30*time.Second, map[effects.State]int{effects.Confirmed: 3})
	if err := d.Healthy(); err != nil {
		t.Fatalf("Healthy() = %v while all is well", err)
	}

	var cols string
	if err := owner.QueryRow(ctx, `SELECT string_agg(quote_ident(column_name), ', ' ORDER BY ordinal_position)
		FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'side_effects' AND column_name <> 'outcome_attempt'`).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	// One transaction: a claim between the two would be refused too.
	sql(t, owner, "REVOKE UPDATE ON side_effects FROM "+role+"; GRANT UPDATE ("+cols+") ON side_effects TO "+role)
	t.Cleanup(func() { // should the test fail midway, before the stop
		_, _ = owner.Exec(context.Background(), "GRANT UPDATE ON side_effects TO "+role)
	})
	keys = append(keys, enqueue(t, owner, "charge.create", "b", 1)...)

	he := healthError(t, d)
	var pe *pgconn.PgError
	if he.Op != "record" || he.Class != dispatcher.ClassPrivilege || !errors.As(he, &pe) || pe.Code != "42501" {
		t.Fatalf("Healthy() = %v (op %s, class %s), want record refused for lack of privilege", he, he.Op, he.Class)
	}
	t.Logf("Healthy() = %v", he)
	// More effects come due; none may be claimed while the outcome in hand
	// cannot be recorded.
	keys = append(keys, enqueue(t, owner, "charge.create", "c", 10)...)
	waitFor(t, 30*time.Second, func() (bool, string) {
		n := dbErrors(t, reg, "record", dispatcher.ClassPrivilege)
		return n >= 4, fmt.Sprintf("%d failures counted", n)
	})
	if st := fake.Stats(); st.Calls != 4 {
		t.Fatalf("%d calls while outcomes could not be recorded, want the 4 made before (%s)", st.Calls, st)
	}
	if got := counts(t, owner); got[effects.Fired] != 1 || got[effects.Pending] != 10 {
		t.Fatalf("states %v, want the refused outcome's effect fired and the 10 new ones pending", got)
	}
	// The clock has not moved: one error line, however many retries.
	if n := logs.lines("record"); n != 1 {
		t.Fatalf("%d error lines for record in one interval, want 1", n)
	}
	clk.Advance(30 * time.Second)
	waitFor(t, 30*time.Second, func() (bool, string) {
		n := logs.lines("record")
		return n == 2, fmt.Sprintf("%d error lines for record after an interval, want 2", n)
	})

	sql(t, owner, "GRANT UPDATE ON side_effects TO "+role)
	waitStates(t, owner, 30*time.Second, map[effects.State]int{effects.Confirmed: 14})
	if err := d.Healthy(); err != nil {
		t.Fatalf("Healthy() = %v after the grant came back", err)
	}
	for _, k := range keys {
		if n := len(fake.Calls(k)); n != 1 || fake.Performed(k) != 1 {
			t.Fatalf("key %s: %d calls, performed %d", k, n, fake.Performed(k))
		}
	}
	b, err := store.GetByKey(ctx, keys[3])
	if err != nil {
		t.Fatal(err)
	}
	if b.ProviderRef != fake.Calls(keys[3])[0].Ref || b.Attempts != 1 {
		t.Fatalf("the outcome kept through the refusal: %+v", b)
	}
}

// A role without UPDATE on side_effects cannot claim: Healthy says so and
// nothing is called; once granted, the effects are dispatched.
func TestDispatcher_RefusedClaimIsSurfaced(t *testing.T) {
	t.Parallel()
	owner, daemon, role := daemonRole(t)
	sql(t, owner, "REVOKE UPDATE ON side_effects FROM "+role)
	t.Cleanup(func() { // should the test fail midway, before the stop
		_, _ = owner.Exec(context.Background(), "GRANT UPDATE ON side_effects TO "+role)
	})
	enqueue(t, owner, "charge.create", "a", 5)
	fake := providertest.New(providertest.Config{Name: "stripe", Idempotent: true})
	obs := &recorder{}
	d := build(t, daemon, &dispatcher.Config{
		Kinds: kinds("charge.create", dispatcher.Kind{Provider: fake, Timeout: time.Second}),
		// The rescue is refused too, and clears when it next runs.
		Lease: 4 * time.Second, RescueInterval: 100 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, Observer: obs,
	})
	run(t, d)
	// The rescue, which runs first, is refused too: Healthy names either.
	he := healthError(t, d)
	if (he.Op != "claim" && he.Op != "rescue") || he.Class != dispatcher.ClassPrivilege || he.Failures < 1 {
		t.Fatalf("Healthy() = %v (op %s, class %s), want claim or rescue refused for lack of privilege", he, he.Op, he.Class)
	}
	waitFor(t, 10*time.Second, func() (bool, string) {
		n := obs.errors("claim", dispatcher.ClassPrivilege)
		return n >= 1, fmt.Sprintf("observer counted %d refused claims", n)
	})
	if st := fake.Stats(); st.Calls != 0 {
		t.Fatalf("calls without a claim: %s", st)
	}
	sql(t, owner, "GRANT UPDATE ON side_effects TO "+role)
	waitStates(t, owner, 30*time.Second, map[effects.State]int{effects.Confirmed: 5})
	waitFor(t, 30*time.Second, func() (bool, string) {
		err := d.Healthy()
		return err == nil, fmt.Sprint(err)
	})
}

// Errors are classified by what retrying can do about them.
func TestClassify(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]dispatcher.ErrorClass{
		"28P01": dispatcher.ClassAuth,
		"28000": dispatcher.ClassAuth,
		"42501": dispatcher.ClassPrivilege,
		"42P01": dispatcher.ClassUndefined,
		"42703": dispatcher.ClassUndefined,
		"42883": dispatcher.ClassUndefined,
		"3D000": dispatcher.ClassUndefined,
		"3F000": dispatcher.ClassUndefined,
		"42601": dispatcher.ClassMismatch,
		"42804": dispatcher.ClassMismatch,
		"25006": dispatcher.ClassReadOnly,
		"23514": dispatcher.ClassData,
		"22P02": dispatcher.ClassData,
		"40001": dispatcher.ClassTransient,
		"57P01": dispatcher.ClassTransient,
		"53300": dispatcher.ClassTransient,
	} {
		err := fmt.Errorf("claim effects: %w", &pgconn.PgError{Code: code})
		if got := dispatcher.Classify(err); got != want {
			t.Errorf("SQLSTATE %s: %s, want %s", code, got, want)
		}
		if got := want.Persistent(); got != (want != dispatcher.ClassData && want != dispatcher.ClassTransient) {
			t.Errorf("%s.Persistent() = %v", want, got)
		}
	}
	for _, err := range []error{context.DeadlineExceeded, errors.New("connection reset by peer")} {
		if got := dispatcher.Classify(err); got != dispatcher.ClassTransient {
			t.Errorf("%v: %s, want transient", err, got)
		}
	}
}
