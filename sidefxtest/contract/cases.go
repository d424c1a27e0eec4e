package contract

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/sidefxtest"
)

// env is what a case gets: the family's handles on a fresh database, and
// the observer, a pgx pool on the same database.
type env struct {
	ctx context.Context
	h   Handles
	obs *pgxpool.Pool
}

// clause is one clause of the contract.
type clause struct {
	name string
	run  func(t *testing.T, e env)
}

// clauses are the contract, for every family alike.
var clauses = []clause{
	{"InsertsOnceAndReportsDuplicates", insertsOnce},
	{"AtomicWithTheCallersTransaction", atomic},
	{"PayloadMismatchNamesSourceKindAndHashes", mismatch},
	{"MismatchAbortsTheTransaction", mismatchInTx},
	{"BatchResultsInOrder", batch},
	{"BatchMismatchInsertsNothing", batchMismatch},
	{"InvalidInputNamesTheField", invalidInput},
	{"DatabaseChecksBecomeValidationErrors", databaseChecks},
	{"AwkwardTextSurvives", awkwardText},
	{"ScheduleAndAttemptsSurvive", schedule},
	{"ConcurrentEnqueuesLeaveOneRow", concurrent},
	{"Cancel", cancel},
	{"RequireServedReadsTheRegistry", requireServed},
}

// Run runs every case on f, each on a fresh database, in parallel.
func Run(t *testing.T, f Family) {
	for _, c := range clauses {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			url := sidefxtest.URL(t)
			ctx := context.Background()
			obs, err := pgxpool.New(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(obs.Close)
			c.run(t, env{ctx: ctx, h: f.Open(t, url), obs: obs})
		})
	}
}

// via runs f on each of the three kinds of handle a family has, named
// "DB", "Conn" and "Tx" (committed after f).
func (e env) via(t *testing.T, f func(t *testing.T, via string, db any)) {
	t.Run("DB", func(t *testing.T) { f(t, "DB", e.h.DB) })
	t.Run("Conn", func(t *testing.T) { f(t, "Conn", e.h.Conn) })
	t.Run("Tx", func(t *testing.T) {
		tx := e.begin(t)
		f(t, "Tx", tx.Handle)
		if err := tx.Commit(e.ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func (e env) begin(t *testing.T) Tx {
	t.Helper()
	tx, err := e.h.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func (e env) count(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.obs.QueryRow(e.ctx, "SELECT count(*) FROM side_effects").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// stored is what the observer reads of one effect.
type stored struct {
	id          int64
	key         string
	payload     string // jsonb text
	state       string
	maxAttempts *int32
	next        time.Time
	due         *time.Time
}

func (e env) stored(t *testing.T, source, kind string) stored {
	t.Helper()
	var s stored
	err := e.obs.QueryRow(e.ctx, `SELECT id, idempotency_key, payload::text, state, max_attempts, next_attempt_at, due_at
		FROM side_effects WHERE source_id = $1 AND kind = $2`, source, kind).
		Scan(&s.id, &s.key, &s.payload, &s.state, &s.maxAttempts, &s.next, &s.due)
	if err != nil {
		t.Fatalf("read effect %q %q: %v", source, kind, err)
	}
	return s
}

func effect(source, kind, payload string) outbox.Effect {
	return outbox.Effect{SourceID: source, Kind: kind, Payload: json.RawMessage(payload)}
}

func insertsOnce(t *testing.T, e env) {
	e.via(t, func(t *testing.T, via string, db any) {
		source := "order-" + via
		first, err := outbox.Enqueue(e.ctx, db, effect(source, "email.receipt", `{"to": "a@example.com", "total": 4200}`))
		if err != nil {
			t.Fatal(err)
		}
		if !first.Inserted || first.ID == 0 || first.Key != derive.Key(source, "email.receipt") {
			t.Fatalf("first enqueue = %+v", first)
		}
		// The same payload, spelled with another key order and spacing, is
		// the same effect.
		again, err := outbox.Enqueue(e.ctx, db, effect(source, "email.receipt", ` { "total":4200 , "to":"a@example.com"}`))
		if err != nil {
			t.Fatal(err)
		}
		if again.Inserted || again.ID != first.ID || again.Key != first.Key {
			t.Fatalf("duplicate enqueue = %+v, want the first's id and key, not inserted (first %+v)", again, first)
		}
		other, err := outbox.Enqueue(e.ctx, db, effect(source, "webhook.order_paid", `{}`))
		if err != nil || !other.Inserted || other.ID == first.ID || other.Key == first.Key {
			t.Fatalf("another kind = %+v, %v: want a new effect", other, err)
		}
	})
	if n := e.count(t); n != 6 {
		t.Fatalf("rows = %d, want 2 for each of 3 handles", n)
	}
}

func atomic(t *testing.T, e env) {
	tx := e.begin(t)
	res, err := outbox.Enqueue(e.ctx, tx.Handle, effect("order-9", "email.receipt", `{}`))
	if err != nil || !res.Inserted {
		t.Fatalf("enqueue in a transaction = %+v, %v", res, err)
	}
	if n := e.count(t); n != 0 {
		t.Fatalf("rows seen before commit = %d, want 0", n)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t); n != 0 {
		t.Fatalf("rows after rollback = %d, want 0", n)
	}
	// The pair is free again: a committed transaction inserts it.
	tx = e.begin(t)
	again, err := outbox.Enqueue(e.ctx, tx.Handle, effect("order-9", "email.receipt", `{}`))
	if err != nil || !again.Inserted {
		t.Fatalf("enqueue after rollback = %+v, %v", again, err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if s := e.stored(t, "order-9", "email.receipt"); s.id != again.ID || s.key != again.Key {
		t.Fatalf("stored %+v, enqueue said %+v", s, again)
	}
}

// checkMismatch checks err is the mismatch of source and kind at index.
func checkMismatch(t *testing.T, err error, index int, source, kind string) {
	t.Helper()
	var pm *effects.PayloadMismatchError
	if !errors.Is(err, outbox.ErrPayloadMismatch) || !errors.As(err, &pm) {
		t.Fatalf("err = %v, want a *effects.PayloadMismatchError", err)
	}
	if pm.Index != index || pm.SourceID != source || pm.Kind != kind || len(pm.StoredHash) != 64 || len(pm.NewHash) != 64 || pm.StoredHash == pm.NewHash {
		t.Fatalf("mismatch = %+v, want index %d, source %q, kind %q and two hashes", pm, index, source, kind)
	}
	for _, want := range []string{source, kind, pm.StoredHash, pm.NewHash} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func mismatch(t *testing.T, e env) {
	e.via(t, func(t *testing.T, via string, db any) {
		source := "order-" + via
		if _, err := outbox.Enqueue(e.ctx, db, effect(source, "charge.create", `{"amount": 100}`)); err != nil {
			t.Fatal(err)
		}
		if via == "Tx" {
			return // a mismatch aborts the transaction: see MismatchAbortsTheTransaction
		}
		_, err := outbox.Enqueue(e.ctx, db, effect(source, "charge.create", `{"amount": 200}`))
		checkMismatch(t, err, 0, source, "charge.create")
		if s := e.stored(t, source, "charge.create"); s.payload != `{"amount": 100}` {
			t.Fatalf("stored payload = %s, the first must stay", s.payload)
		}
	})
}

func mismatchInTx(t *testing.T, e env) {
	if _, err := outbox.Enqueue(e.ctx, e.h.DB, effect("o-1", "charge.create", `{"amount": 100}`)); err != nil {
		t.Fatal(err)
	}
	tx := e.begin(t)
	if _, err := outbox.Enqueue(e.ctx, tx.Handle, effect("o-2", "charge.create", `{"amount": 1}`)); err != nil {
		t.Fatal(err)
	}
	_, err := outbox.Enqueue(e.ctx, tx.Handle, effect("o-1", "charge.create", `{"amount": 200}`))
	checkMismatch(t, err, 0, "o-1", "charge.create")
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t); n != 1 {
		t.Fatalf("rows = %d, want only the first effect", n)
	}
}

func batch(t *testing.T, e env) {
	if _, err := outbox.Enqueue(e.ctx, e.h.DB, effect("o-5", "email.receipt", `{"n": 5}`)); err != nil {
		t.Fatal(err)
	}
	var es []outbox.Effect
	for i := range 20 {
		es = append(es, effect(fmt.Sprintf("o-%d", i), "email.receipt", fmt.Sprintf(`{"n": %d}`, i)))
	}
	es = append(es, es[7]) // a duplicate inside the batch
	tx := e.begin(t)
	res, err := outbox.EnqueueMany(e.ctx, tx.Handle, es)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if len(res) != len(es) {
		t.Fatalf("%d results for %d effects", len(res), len(es))
	}
	for i, r := range res {
		want := i != 5 && i != 20
		if r.Inserted != want || r.Key != derive.Key(es[i].SourceID, "email.receipt") || r.ID == 0 {
			t.Errorf("result %d = %+v, want inserted %v and its own key", i, r, want)
		}
	}
	if res[20].ID != res[7].ID {
		t.Errorf("the duplicate in the batch got id %d, the original %d", res[20].ID, res[7].ID)
	}
	if n := e.count(t); n != 20 {
		t.Fatalf("rows = %d, want 20", n)
	}
}

func batchMismatch(t *testing.T, e env) {
	if _, err := outbox.Enqueue(e.ctx, e.h.DB, effect("o-3", "k", `{"v": 1}`)); err != nil {
		t.Fatal(err)
	}
	es := []outbox.Effect{effect("o-1", "k", `{"v": 1}`), effect("o-2", "k", `{"v": 1}`), effect("o-3", "k", `{"v": 2}`)}
	_, err := outbox.EnqueueMany(e.ctx, e.h.DB, es)
	checkMismatch(t, err, 2, "o-3", "k")
	// Two items of one batch that differ are a mismatch too.
	_, err = outbox.EnqueueMany(e.ctx, e.h.Conn, []outbox.Effect{es[0], effect("o-1", "k", `{"v": 9}`)})
	checkMismatch(t, err, 1, "o-1", "k")
	if n := e.count(t); n != 1 {
		t.Fatalf("rows = %d, want only the first effect", n)
	}
}

func invalidInput(t *testing.T, e env) {
	ok := effect("s", "email.receipt", `{}`)
	for _, c := range []struct {
		e     outbox.Effect
		field string
		says  string
	}{
		{effect("", "email.receipt", `{}`), "source_id", "empty"},
		{effect("s", "Email.Receipt", `{}`), "kind", "lowercase"},
		{effect("s", "email.receipt", `[1]`), "payload", "array"},
		{outbox.Effect{SourceID: "s", Kind: "email.receipt", Payload: map[string]int{}, MaxAttempts: -1}, "max_attempts", "positive"},
	} {
		_, err := outbox.EnqueueMany(e.ctx, e.h.DB, []outbox.Effect{ok, c.e})
		var ve *effects.ValidationError
		if !errors.Is(err, outbox.ErrInvalid) || !errors.As(err, &ve) || ve.Field != c.field || ve.Index != 1 || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: err = %v, want field %s at index 1 saying %q", c.e, err, c.field, c.says)
		}
	}
	if err := outbox.Cancel(e.ctx, e.h.DB, "s", "Bad Kind"); !errors.Is(err, outbox.ErrInvalid) {
		t.Errorf("cancel of an invalid kind: %v, want ErrInvalid", err)
	}
	if n := e.count(t); n != 0 {
		t.Fatalf("rows after invalid input = %d", n)
	}
}

// databaseChecks reaches the SQL function's own checks (which the outbox's
// checks in Go normally spare it) through engine.Store: SQLSTATE 22023
// with its JSON detail must become a *effects.ValidationError whatever the
// driver.
func databaseChecks(t *testing.T, e env) {
	db, err := engine.Of(e.h.DB)
	if err != nil {
		t.Fatal(err)
	}
	store, err := engine.NewStore(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok := effects.NewEffect{SourceID: "s", Kind: "k", Payload: json.RawMessage(`{}`)}
	for _, c := range []struct {
		item  effects.NewEffect
		limit int
		says  string
	}{
		{effects.NewEffect{SourceID: "", Kind: "k", Payload: json.RawMessage(`{}`)}, 0, "source_id is empty"},
		{effects.NewEffect{SourceID: "s2", Kind: "K", Payload: json.RawMessage(`{}`)}, 0, "is not lowercase"},
		{effects.NewEffect{SourceID: "s2", Kind: "k", Payload: json.RawMessage(`{"a": "bcdefghij"}`)}, 10, "the limit is 10"},
		{effects.NewEffect{SourceID: "s2", Kind: "k", Payload: json.RawMessage(`{}`), NotBefore: time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC)},
			0, "not_before is 0001-01-02 00:00:00+00, want a time from 2000-01-01"},
	} {
		_, err := store.Insert(e.ctx, []effects.NewEffect{ok, c.item}, c.limit, "")
		var ve *effects.ValidationError
		if !errors.As(err, &ve) || ve.Index != 1 || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: err = %v, want a ValidationError at index 1 saying %q", c.item, err, c.says)
		}
	}
	if n := e.count(t); n != 0 {
		t.Fatalf("rows = %d, want 0", n)
	}
}

func awkwardText(t *testing.T, e env) {
	sources := []string{`a"b`, `back\slash`, `c,d`, `{braces}`, ` spaced `, `NULL`, `null`, `ünïcødé ✓`, `'quote'`, `\"`, `{"a":1}`}
	payload := `{"q": "\"\\{},' NULL ✓", "n": [1, {"x": null}]}`
	var es []outbox.Effect
	for _, s := range sources {
		es = append(es, effect(s, "email.receipt", payload))
	}
	res, err := outbox.EnqueueMany(e.ctx, e.h.DB, es)
	if err != nil {
		t.Fatal(err)
	}
	var want string
	if err := e.obs.QueryRow(e.ctx, "SELECT $1::jsonb::text", payload).Scan(&want); err != nil {
		t.Fatal(err)
	}
	for i, s := range sources {
		got := e.stored(t, s, "email.receipt")
		if !res[i].Inserted || got.id != res[i].ID || got.key != derive.Key(s, "email.receipt") || res[i].Key != got.key {
			t.Errorf("source %q: result %+v, stored %+v", s, res[i], got)
		}
		if got.payload != want {
			t.Errorf("source %q: payload %s, want %s", s, got.payload, want)
		}
	}
	// And the same batch again is all duplicates.
	again, err := outbox.EnqueueMany(e.ctx, e.h.Conn, es)
	if err != nil {
		t.Fatal(err)
	}
	for i := range again {
		if again[i].Inserted || again[i].ID != res[i].ID {
			t.Errorf("again %d = %+v, want a duplicate of %+v", i, again[i], res[i])
		}
	}
}

func schedule(t *testing.T, e env) {
	// Some months ahead (at most a year is taken), in an odd zone, with
	// nanoseconds the database truncates.
	in := time.Now().AddDate(0, 7, 0).In(time.FixedZone("x", 5*3600+1800))
	later := time.Date(in.Year(), in.Month(), in.Day(), 12, 30, 15, 123456789, in.Location())
	es := []outbox.Effect{
		{SourceID: "later", Kind: "email.receipt", Payload: map[string]int{}, NotBefore: later, MaxAttempts: 7},
		{SourceID: "now", Kind: "email.receipt", Payload: map[string]int{}},
	}
	var dbNow time.Time
	if err := e.obs.QueryRow(e.ctx, "SELECT now()").Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.EnqueueMany(e.ctx, e.h.DB, es); err != nil {
		t.Fatal(err)
	}
	l := e.stored(t, "later", "email.receipt")
	want := later.Truncate(time.Microsecond)
	if !l.next.Equal(want) || l.due == nil || !l.due.Equal(want) || l.maxAttempts == nil || *l.maxAttempts != 7 {
		t.Errorf("later: next %v, due %v, max attempts %v; want %v, %v, 7", l.next, l.due, l.maxAttempts, want, want)
	}
	n := e.stored(t, "now", "email.receipt")
	if n.next.Before(dbNow) || n.due != nil || n.maxAttempts != nil {
		t.Errorf("now: next %v (the database's now was %v), due %v, max attempts %v; want due now, no due_at, the kind's policy", n.next, dbNow, n.due, n.maxAttempts)
	}
}

func concurrent(t *testing.T, e env) {
	const n = 8
	res, errs := make([]outbox.Enqueued, n), make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			tx, err := e.h.Begin(e.ctx)
			if err != nil {
				errs[i] = err
				return
			}
			defer tx.Rollback(e.ctx) //nolint:errcheck // a no-op after Commit
			if res[i], errs[i] = outbox.Enqueue(e.ctx, tx.Handle, effect("evt-7", "email.receipt", `{"to": "a@example.com"}`)); errs[i] == nil {
				errs[i] = tx.Commit(e.ctx)
			}
		})
	}
	close(start)
	wg.Wait()
	inserted := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("goroutine %d: %v", i, err)
		}
		if res[i].Inserted {
			inserted++
		}
		if res[i].ID != res[0].ID || res[i].Key != derive.Key("evt-7", "email.receipt") {
			t.Errorf("goroutine %d got %+v, goroutine 0 %+v", i, res[i], res[0])
		}
	}
	if inserted != 1 {
		t.Fatalf("%d callers saw Inserted, want exactly 1", inserted)
	}
	if c := e.count(t); c != 1 {
		t.Fatalf("rows = %d, want 1", c)
	}
}

func cancel(t *testing.T, e env) {
	for _, s := range []string{"o-1", "o-2", "o-3"} {
		if _, err := outbox.Enqueue(e.ctx, e.h.DB, effect(s, "email.receipt", `{}`)); err != nil {
			t.Fatal(err)
		}
	}
	// Cancelled in a transaction rolled back: still pending.
	tx := e.begin(t)
	if err := outbox.Cancel(e.ctx, tx.Handle, "o-1", "email.receipt"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if s := e.stored(t, "o-1", "email.receipt"); s.state != "pending" {
		t.Fatalf("after a rolled back cancel: %s, want pending", s.state)
	}
	if err := outbox.Cancel(e.ctx, e.h.Conn, "o-1", "email.receipt"); err != nil {
		t.Fatal(err)
	}
	if s := e.stored(t, "o-1", "email.receipt"); s.state != "cancelled" {
		t.Fatalf("after cancel: %s, want cancelled", s.state)
	}
	err := outbox.Cancel(e.ctx, e.h.DB, "o-1", "email.receipt")
	var se *effects.StateError
	if !errors.Is(err, outbox.ErrWrongState) || !errors.As(err, &se) || se.State != effects.Cancelled {
		t.Errorf("cancel of a cancelled effect: %v, want ErrWrongState naming cancelled", err)
	}
	if err := outbox.Cancel(e.ctx, e.h.DB, "o-404", "email.receipt"); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("cancel of a missing effect: %v, want ErrNotFound", err)
	}
	// Enqueued again, a cancelled effect is a duplicate, not a new one.
	if res, err := outbox.Enqueue(e.ctx, e.h.DB, effect("o-1", "email.receipt", `{}`)); err != nil || res.Inserted {
		t.Errorf("enqueue after cancel = %+v, %v: want a duplicate", res, err)
	}
	// An effect that may have been performed is never cancelled.
	if _, err := e.obs.Exec(e.ctx, `UPDATE side_effects SET state = 'pending', attempts = 1, maybe_attempts = '{1}',
		last_error = 'timeout after the request was sent' WHERE source_id = 'o-2'`); err != nil {
		t.Fatal(err)
	}
	err = outbox.Cancel(e.ctx, e.h.DB, "o-2", "email.receipt")
	var mp *effects.MaybePerformedError
	if !errors.Is(err, outbox.ErrMaybePerformed) || !errors.As(err, &mp) || len(mp.MaybeAttempts) != 1 || mp.MaybeAttempts[0] != 1 ||
		!strings.Contains(err.Error(), "timeout after the request was sent") {
		t.Errorf("cancel of a maybe performed effect: %v (%+v), want ErrMaybePerformed naming attempt 1 and why", err, mp)
	}
	if s := e.stored(t, "o-2", "email.receipt"); s.state != "pending" {
		t.Fatalf("maybe performed effect is %s, want pending", s.state)
	}
}

func requireServed(t *testing.T, e env) {
	ob, err := outbox.New(&outbox.Config{RequireServed: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.obs.Exec(e.ctx, `INSERT INTO sidefx_dispatchers (worker_id, kinds, interval_ms, kind_status)
		VALUES ('w-1', '{email.receipt}', 1000, '{"email.receipt": {"provider": "sendgrid", "in_flight": 2, "limit": 10}}')`); err != nil {
		t.Fatal(err)
	}
	if res, err := ob.Enqueue(e.ctx, e.h.DB, effect("o-1", "email.receipt", `{}`)); err != nil || !res.Inserted {
		t.Fatalf("enqueue of a served kind = %+v, %v", res, err)
	}
	_, err = ob.Enqueue(e.ctx, e.h.DB, effect("o-1", "charge.create", `{}`))
	var uk *effects.UnknownKindError
	if !errors.Is(err, outbox.ErrUnknownKind) || !errors.As(err, &uk) || uk.Kind != "charge.create" || !uk.Served ||
		len(uk.Known) != 1 || uk.Known[0] != "email.receipt" {
		t.Fatalf("enqueue of an unserved kind: %v, want an UnknownKindError naming the served kinds", err)
	}
}
