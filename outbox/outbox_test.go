package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
}

func setup(t *testing.T) bundle {
	t.Helper()
	return bundle{ctx: context.Background(), pool: pgtest.DB(t)}
}

func count(t *testing.T, b bundle) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM side_effects").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func storedPayload(t *testing.T, b bundle, source, kind string) string {
	t.Helper()
	var p string
	if err := b.pool.QueryRow(b.ctx, "SELECT payload::text FROM side_effects WHERE source_id = $1 AND kind = $2", source, kind).Scan(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestEnqueue_InsertsOnceAndReportsDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "order-1", Kind: "email.receipt", Payload: map[string]any{"to": "a@example.com", "total": 4200}})
	if err != nil {
		t.Fatal(err)
	}
	if !first.Inserted || first.ID == 0 || first.Key != derive.Key("order-1", "email.receipt") {
		t.Fatalf("first enqueue = %+v", first)
	}
	// The same payload, spelled with other key order and spacing, is the same effect.
	again, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "order-1", Kind: "email.receipt", Payload: json.RawMessage(` { "total":4200 , "to":"a@example.com"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if again.Inserted || again.ID != first.ID || again.Key != first.Key {
		t.Fatalf("duplicate enqueue = %+v, want the first's id and key, not inserted", again)
	}
	// Another kind for the same source is another effect.
	other, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "order-1", Kind: "webhook.order_paid", Payload: json.RawMessage(`{}`)})
	if err != nil || !other.Inserted || other.Key == first.Key {
		t.Fatalf("other kind = %+v, %v", other, err)
	}
	if n := count(t, b); n != 2 {
		t.Fatalf("rows = %d, want 2", n)
	}
}

func TestEnqueue_PayloadMismatchNamesBothHashes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "order-1", Kind: "charge.create", Payload: map[string]int{"amount": 100}}); err != nil {
		t.Fatal(err)
	}
	_, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "order-1", Kind: "charge.create", Payload: map[string]int{"amount": 200}})
	var pm *effects.PayloadMismatchError
	if !errors.Is(err, outbox.ErrPayloadMismatch) || !errors.As(err, &pm) {
		t.Fatalf("err = %v, want ErrPayloadMismatch", err)
	}
	if pm.SourceID != "order-1" || pm.Kind != "charge.create" || len(pm.StoredHash) != 64 || len(pm.NewHash) != 64 || pm.StoredHash == pm.NewHash {
		t.Fatalf("mismatch error = %+v", pm)
	}
	for _, want := range []string{"order-1", "charge.create", pm.StoredHash, pm.NewHash} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if p := storedPayload(t, b, "order-1", "charge.create"); p != `{"amount": 100}` {
		t.Fatalf("stored payload = %s, the first one must stay", p)
	}
}

func TestEnqueue_RolledBackLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := outbox.Enqueue(b.ctx, tx, outbox.Effect{SourceID: "order-9", Kind: "email.receipt", Payload: json.RawMessage(`{}`)})
	if err != nil || !res.Inserted {
		t.Fatalf("enqueue in tx = %+v, %v", res, err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b); n != 0 {
		t.Fatalf("rows after rollback = %d", n)
	}
	// And the pair is free again: a later commit inserts it.
	res, err = outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "order-9", Kind: "email.receipt", Payload: json.RawMessage(`{}`)})
	if err != nil || !res.Inserted {
		t.Fatalf("enqueue after rollback = %+v, %v", res, err)
	}
}

// race runs f in n goroutines released together, each in its own
// transaction committed when f succeeds.
func race(t *testing.T, b bundle, n int, f func(i int, tx pgx.Tx) (outbox.Enqueued, error)) ([]outbox.Enqueued, []error) {
	t.Helper()
	results, errs := make([]outbox.Enqueued, n), make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			tx, err := b.pool.Begin(b.ctx)
			if err != nil {
				errs[i] = err
				return
			}
			defer tx.Rollback(b.ctx) //nolint:errcheck
			if results[i], errs[i] = f(i, tx); errs[i] == nil {
				errs[i] = tx.Commit(b.ctx)
			}
		}()
	}
	close(start)
	wg.Wait()
	return results, errs
}

func TestEnqueue_32ConcurrentSameEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	results, errs := race(t, b, 32, func(_ int, tx pgx.Tx) (outbox.Enqueued, error) {
		return outbox.Enqueue(b.ctx, tx, outbox.Effect{SourceID: "evt-7", Kind: "email.receipt", Payload: map[string]string{"to": "a@example.com"}})
	})
	inserted := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("goroutine %d: %v", i, err)
		}
		if results[i].Inserted {
			inserted++
		}
		if results[i].ID != results[0].ID || results[i].Key != derive.Key("evt-7", "email.receipt") {
			t.Errorf("goroutine %d got %+v, others %+v", i, results[i], results[0])
		}
	}
	if inserted != 1 {
		t.Fatalf("%d callers saw Inserted, want exactly 1", inserted)
	}
	if n := count(t, b); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}
}

func TestEnqueue_32ConcurrentDifferentPayloads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	results, errs := race(t, b, 32, func(i int, tx pgx.Tx) (outbox.Enqueued, error) {
		return outbox.Enqueue(b.ctx, tx, outbox.Effect{SourceID: "evt-8", Kind: "charge.create", Payload: map[string]int{"amount": i}})
	})
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("goroutines %d and %d both succeeded", winner, i)
			}
			if !results[i].Inserted {
				t.Fatalf("the one success did not insert: %+v", results[i])
			}
			winner = i
		case !errors.Is(err, outbox.ErrPayloadMismatch):
			t.Fatalf("goroutine %d: %v, want ErrPayloadMismatch", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no goroutine succeeded")
	}
	if n := count(t, b); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}
	if p := storedPayload(t, b, "evt-8", "charge.create"); p != fmt.Sprintf(`{"amount": %d}`, winner) {
		t.Fatalf("stored payload %s is not the winner's (%d)", p, winner)
	}
}

// noSQL fails the test if any statement reaches it: validation must happen
// before SQL.
type noSQL struct{ t *testing.T }

func (d noSQL) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	d.t.Error("Exec called for invalid input")
	return pgconn.CommandTag{}, errors.New("no SQL")
}

func (d noSQL) Query(context.Context, string, ...any) (pgx.Rows, error) {
	d.t.Error("Query called for invalid input")
	return nil, errors.New("no SQL")
}

func (d noSQL) QueryRow(context.Context, string, ...any) pgx.Row {
	d.t.Error("QueryRow called for invalid input")
	return nil
}

func TestEnqueue_InvalidInputIsRefusedBeforeSQL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok := outbox.Effect{SourceID: "s", Kind: "email.receipt", Payload: json.RawMessage(`{}`)}
	with := func(f func(*outbox.Effect)) outbox.Effect { e := ok; f(&e); return e }
	cases := []struct {
		name  string
		e     outbox.Effect
		field string
		says  string
	}{
		{"empty source", with(func(e *outbox.Effect) { e.SourceID = "" }), "source_id", "empty"},
		{"long source", with(func(e *outbox.Effect) { e.SourceID = strings.Repeat("s", 256) }), "source_id", "limit is 255"},
		{"nul in source", with(func(e *outbox.Effect) { e.SourceID = "a\x00b" }), "source_id", "NUL"},
		{"bad utf8 source", with(func(e *outbox.Effect) { e.SourceID = "a\xffb" }), "source_id", "UTF-8"},
		{"empty kind", with(func(e *outbox.Effect) { e.Kind = "" }), "kind", "empty"},
		{"upper kind", with(func(e *outbox.Effect) { e.Kind = "Email.Receipt" }), "kind", "lowercase"},
		{"sql in kind", with(func(e *outbox.Effect) { e.Kind = "k'; DROP TABLE side_effects; --" }), "kind", "lowercase"},
		{"nil payload", with(func(e *outbox.Effect) { e.Payload = nil }), "payload", "missing"},
		{"array payload", with(func(e *outbox.Effect) { e.Payload = []int{1, 2} }), "payload", "array"},
		{"string payload", with(func(e *outbox.Effect) { e.Payload = json.RawMessage(`"hi"`) }), "payload", "string"},
		{"number payload", with(func(e *outbox.Effect) { e.Payload = 42 }), "payload", "number"},
		{"null payload", with(func(e *outbox.Effect) { e.Payload = json.RawMessage(`null`) }), "payload", "null"},
		{"broken json", with(func(e *outbox.Effect) { e.Payload = json.RawMessage(`{"a":`) }), "payload", "not valid JSON"},
		{"nul escape", with(func(e *outbox.Effect) { e.Payload = json.RawMessage(`{"a":"x\u0000y"}`) }), "payload", `\u0000`},
		{"lone surrogate", with(func(e *outbox.Effect) { e.Payload = json.RawMessage(`{"a":"x\ud800y"}`) }), "payload", "surrogate"},
		{"bad utf8 payload", with(func(e *outbox.Effect) { e.Payload = []byte("{\"a\":\"\xff\"}") }), "payload", "UTF-8"},
		{"unmarshalable", with(func(e *outbox.Effect) { e.Payload = map[string]any{"f": func() {}} }), "payload", "cannot be encoded"},
		{"oversize", with(func(e *outbox.Effect) {
			e.Payload = map[string]string{"a": strings.Repeat("x", outbox.DefaultMaxPayloadBytes)}
		}), "payload", "limit is 262144"},
		{"negative attempts", with(func(e *outbox.Effect) { e.MaxAttempts = -1 }), "max_attempts", "positive"},
		{"not_before year 1", with(func(e *outbox.Effect) { e.NotBefore = time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC) }),
			"not_before", "is 0001-01-02T00:00:00Z, want a time from 2000-01-01T00:00:00Z to one year from now"},
		{"not_before 1999", with(func(e *outbox.Effect) { e.NotBefore = time.Date(1999, 12, 31, 23, 59, 59, 0, time.UTC) }),
			"not_before", "is 1999-12-31T23:59:59Z"},
		{"not_before in two years", with(func(e *outbox.Effect) { e.NotBefore = time.Now().AddDate(2, 0, 0) }),
			"not_before", "to one year from now"},
		{"not_before as milliseconds read as seconds", with(func(e *outbox.Effect) { e.NotBefore = time.Unix(time.Now().UnixMilli(), 0) }),
			"not_before", "want a time from"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := outbox.Enqueue(b.ctx, noSQL{t}, c.e)
			var ve *effects.ValidationError
			if !errors.Is(err, outbox.ErrInvalid) || !errors.As(err, &ve) {
				t.Fatalf("err = %v, want a ValidationError", err)
			}
			if ve.Field != c.field || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("err = %q, want field %s saying %q", err, c.field, c.says)
			}
			// In a batch, the error names the item's index.
			_, err = outbox.EnqueueMany(b.ctx, noSQL{t}, []outbox.Effect{ok, c.e})
			if !errors.As(err, &ve) || ve.Index != 1 || !strings.Contains(err.Error(), "index 1") {
				t.Fatalf("batch err = %v, want index 1", err)
			}
			// And against the real database, nothing is written.
			if _, err := outbox.EnqueueMany(b.ctx, b.pool, []outbox.Effect{ok, c.e}); !errors.Is(err, outbox.ErrInvalid) {
				t.Fatalf("real batch err = %v", err)
			}
		})
	}
	if n := count(t, b); n != 0 {
		t.Fatalf("rows after invalid input = %d", n)
	}
	// An escaped backslash before u0000 is an ordinary string, not a NUL.
	if _, err := outbox.Enqueue(b.ctx, b.pool, with(func(e *outbox.Effect) { e.Payload = json.RawMessage(`{"a":"\\u0000"}`) })); err != nil {
		t.Fatalf(`payload with \\u0000: %v`, err)
	}
}

func TestEnqueueMany_OneStatementPerBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "o-5", Kind: "email.receipt", Payload: map[string]int{"n": 5}}); err != nil {
		t.Fatal(err)
	}
	var batch []outbox.Effect
	for i := range 100 {
		batch = append(batch, outbox.Effect{SourceID: fmt.Sprintf("o-%d", i), Kind: "email.receipt", Payload: map[string]int{"n": i}})
	}
	batch = append(batch, batch[7]) // a duplicate inside the batch
	counter := &countingDB{DB: b.pool}
	res, err := outbox.EnqueueMany(b.ctx, counter, batch)
	if err != nil {
		t.Fatal(err)
	}
	if counter.n != 1 {
		t.Fatalf("%d statements for one batch, want 1", counter.n)
	}
	if len(res) != len(batch) {
		t.Fatalf("%d results for %d items", len(res), len(batch))
	}
	for i, r := range res {
		wantInserted := i != 5 && i != 100
		if r.Inserted != wantInserted || r.Key != derive.Key(batch[i].SourceID, "email.receipt") {
			t.Errorf("item %d = %+v, want inserted %v", i, r, wantInserted)
		}
	}
	if res[100].ID != res[7].ID {
		t.Errorf("the in-batch duplicate got id %d, the original %d", res[100].ID, res[7].ID)
	}
	if n := count(t, b); n != 100 {
		t.Fatalf("rows = %d, want 100", n)
	}
}

type countingDB struct {
	outbox.DB
	n int
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n++
	return c.DB.Query(ctx, sql, args...)
}

func TestEnqueueMany_MismatchInsertsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "o-3", Kind: "k", Payload: map[string]int{"v": 1}}); err != nil {
		t.Fatal(err)
	}
	batch := []outbox.Effect{
		{SourceID: "o-1", Kind: "k", Payload: map[string]int{"v": 1}},
		{SourceID: "o-2", Kind: "k", Payload: map[string]int{"v": 1}},
		{SourceID: "o-3", Kind: "k", Payload: map[string]int{"v": 2}},
	}
	_, err := outbox.EnqueueMany(b.ctx, b.pool, batch)
	var pm *effects.PayloadMismatchError
	if !errors.As(err, &pm) || pm.Index != 2 || pm.SourceID != "o-3" {
		t.Fatalf("err = %v, want a mismatch at index 2", err)
	}
	if n := count(t, b); n != 1 {
		t.Fatalf("rows = %d, want only the first enqueue", n)
	}
	// A mismatch between two items of one batch is caught the same way.
	_, err = outbox.EnqueueMany(b.ctx, b.pool, []outbox.Effect{batch[0], {SourceID: "o-1", Kind: "k", Payload: map[string]int{"v": 9}}})
	if !errors.As(err, &pm) || pm.Index != 1 {
		t.Fatalf("in-batch mismatch: %v", err)
	}
	if n := count(t, b); n != 1 {
		t.Fatalf("rows = %d after an in-batch mismatch", n)
	}
}

// listen holds a connection listening on the public schema's channel until
// the test ends.
func listen(t *testing.T, b bundle) *pgxpool.Conn {
	t.Helper()
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	if _, err := conn.Exec(b.ctx, `LISTEN "sidefx_public"`); err != nil {
		t.Fatal(err)
	}
	return conn
}

// Enqueue notifies nobody: NOTIFY would serialize the commits of every
// enqueueing transaction (dispatchers look for due effects themselves).
// The first notification the channel carries after three enqueueing
// transactions commit is the test's own.
func TestEnqueue_SendsNoNotification(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := listen(t, b)
	for i, kind := range []string{"email.receipt", "email.receipt", "webhook.paid"} {
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.Enqueue(b.ctx, tx, outbox.Effect{SourceID: fmt.Sprintf("o-%d", i), Kind: kind, Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "o-9", Kind: "sms.send", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `SELECT pg_notify('sidefx_public', 'end')`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(ctx)
	if err != nil || n.Payload != "end" {
		t.Fatalf("first notification = %+v, %v; want the test's own: enqueue notifies nobody", n, err)
	}
	if n := count(t, b); n != 4 {
		t.Fatalf("rows = %d, want 4", n)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "o-1", Kind: "email.receipt", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Cancel(b.ctx, b.pool, "o-1", "email.receipt"); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Cancel(b.ctx, b.pool, "o-1", "email.receipt"); !errors.Is(err, outbox.ErrWrongState) {
		t.Fatalf("second cancel: %v", err)
	}
	if err := outbox.Cancel(b.ctx, b.pool, "o-2", "email.receipt"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("cancel missing: %v", err)
	}
	if err := outbox.Cancel(b.ctx, noSQL{t}, "", "email.receipt"); !errors.Is(err, outbox.ErrInvalid) {
		t.Fatalf("cancel empty source: %v", err)
	}
	// A cancelled effect still holds its (source_id, kind): enqueuing it again
	// is a duplicate, not a new effect.
	res, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "o-1", Kind: "email.receipt", Payload: json.RawMessage(`{}`)})
	if err != nil || res.Inserted {
		t.Fatalf("re-enqueue of a cancelled effect = %+v, %v", res, err)
	}
}

func TestNew_Config(t *testing.T) {
	t.Parallel()
	if _, err := outbox.New(&outbox.Config{MaxPayloadBytes: -1}); err == nil {
		t.Error("negative MaxPayloadBytes accepted")
	}
	if _, err := outbox.New(&outbox.Config{Schema: "bad-schema"}); err == nil {
		t.Error("bad schema accepted")
	}
	b := setup(t)
	small, err := outbox.New(&outbox.Config{MaxPayloadBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := small.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "s", Kind: "k", Payload: map[string]string{"a": "0123456789abcdef"}}); !errors.Is(err, outbox.ErrInvalid) {
		t.Fatalf("over a 16-byte limit: %v", err)
	}
	// A larger limit than the database's only lowers nothing: the
	// database's (256 KiB) is the producer's ceiling (issue 34), and says
	// so.
	big, err := outbox.New(&outbox.Config{MaxPayloadBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	_, err = big.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "s", Kind: "k", Payload: map[string]string{"a": strings.Repeat("x", 300<<10)}})
	if !errors.Is(err, outbox.ErrInvalid) || !strings.Contains(err.Error(), "the limit is 262144") {
		t.Fatalf("300 KiB with a 1 MiB limit of the producer's own: %v, want refused at the database's 262144 bytes", err)
	}
}

func TestOutbox_RefusesUnknownKindsWhenAsked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	known, err := outbox.New(&outbox.Config{Kinds: []string{"charge.create", "email.receipt"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = known.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "o1", Kind: "sms.send", Payload: map[string]any{}})
	var uk *effects.UnknownKindError
	if !errors.As(err, &uk) || !errors.Is(err, outbox.ErrUnknownKind) || uk.Kind != "sms.send" ||
		!strings.Contains(err.Error(), "charge.create, email.receipt") {
		t.Fatalf("an unknown kind: %v", err)
	}
	_, err = known.EnqueueMany(b.ctx, b.pool, []outbox.Effect{
		{SourceID: "o1", Kind: "charge.create", Payload: map[string]any{}},
		{SourceID: "o1", Kind: "pager.page", Payload: map[string]any{}},
	})
	if !errors.As(err, &uk) || uk.Index != 1 {
		t.Fatalf("a batch with an unknown kind: %v", err)
	}
	if _, err := outbox.New(&outbox.Config{Kinds: []string{"Not A Kind"}}); err == nil {
		t.Fatal("a bad kind in Config.Kinds was accepted")
	}

	// The registry: only what a live dispatcher serves.
	served, err := outbox.New(&outbox.Config{RequireServed: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := served.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "o2", Kind: "charge.create", Payload: map[string]any{}}); !errors.Is(err, outbox.ErrUnknownKind) || !strings.Contains(err.Error(), "live dispatcher serves (none)") {
		t.Fatalf("no dispatcher at all: %v", err)
	}
	eng, _ := engine.New(b.pool, "")
	if err := eng.Heartbeat(b.ctx, "w", []string{"charge.create"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if res, err := served.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "o2", Kind: "charge.create", Payload: map[string]any{}}); err != nil || !res.Inserted {
		t.Fatalf("a served kind: %+v, %v", res, err)
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM side_effects WHERE kind IN ('sms.send', 'pager.page')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused kinds were written: %d, %v", n, err)
	}
}

// The SQL functions other languages call refuse what Go refuses, and the
// infinities Go cannot send: SQLSTATE 22023 naming the value, the range and
// the field. A time inside the range is taken.
func TestEnqueueSQL_RefusesTimesItCannotSchedule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, c := range []struct{ nb, says string }{
		{"'-infinity'", "not_before is -infinity, want a time from 2000-01-01"},
		{"'infinity'", "not_before is infinity, want a time from 2000-01-01"},
		{"'1999-12-31 23:59:59+00'", "not_before is 1999-12-31 23:59:59+00"},
		{"now() + interval '1 year 1 day'", "to one year from now"},
	} {
		for _, call := range []string{
			`SELECT * FROM sidefx_enqueue('s', 'email.receipt', '{}', p_not_before => ` + c.nb + `)`,
			`SELECT * FROM sidefx_enqueue_many(ARRAY['s', 't'], ARRAY['email.receipt', 'email.receipt'], ARRAY['{}', '{}']::jsonb[],
				p_not_before => ARRAY[now(), ` + c.nb + `])`,
			`SELECT * FROM sidefx_enqueue_many_traced('00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
				ARRAY['s'], ARRAY['email.receipt'], ARRAY['{}']::jsonb[], p_not_before => ARRAY[(` + c.nb + `)::timestamptz])`,
		} {
			_, err := b.pool.Exec(b.ctx, call)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "22023" || !strings.Contains(pe.Message, c.says) || !strings.Contains(pe.Detail, `"field" : "not_before"`) {
				t.Errorf("%s: err = %v (detail %v), want 22023 saying %q", call, err, pe, c.says)
			}
		}
	}
	if n := count(t, b); n != 0 {
		t.Fatalf("rows after refused times = %d", n)
	}
	if _, err := b.pool.Exec(b.ctx, `SELECT * FROM sidefx_enqueue('s', 'email.receipt', '{}', p_not_before => now() + interval '364 days')`); err != nil {
		t.Fatalf("a time 364 days ahead: %v", err)
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash, next_attempt_at)
		VALUES ('raw', 'email.receipt', 'k', '{}', sha256('{}'), '-infinity')`); err == nil || !strings.Contains(err.Error(), "side_effects_finite_times_check") {
		t.Fatalf("a raw insert of -infinity: %v, want the table's check to refuse it", err)
	}
}
