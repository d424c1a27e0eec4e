package inbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sidefx/sidefx/inbox"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// counter is an Observer.
type counter struct {
	mu                           sync.Mutex
	firsts, duplicates, mismatch map[string]int
}

func newCounter() *counter {
	return &counter{firsts: map[string]int{}, duplicates: map[string]int{}, mismatch: map[string]int{}}
}

func (c *counter) Delivered(consumer string, first bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if first {
		c.firsts[consumer]++
	} else {
		c.duplicates[consumer]++
	}
}

func (c *counter) Mismatched(consumer string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mismatch[consumer]++
}

// tx is what a test runs Once and Record in: pgx's or database/sql's.
type tx interface {
	handle() any
	commit() error
	rollback()
}

type pgxTx struct{ pgx.Tx }

func (t pgxTx) handle() any   { return t.Tx }
func (t pgxTx) commit() error { return t.Commit(context.Background()) }
func (t pgxTx) rollback()     { _ = t.Rollback(context.Background()) }

type sqlTx struct{ *sql.Tx }

func (t sqlTx) handle() any   { return t.Tx }
func (t sqlTx) commit() error { return t.Commit() }
func (t sqlTx) rollback()     { _ = t.Rollback() }

func families(t *testing.T, pool *pgxpool.Pool) map[string]func() tx {
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	return map[string]func() tx{
		"pgx": func() tx {
			x, err := pool.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return pgxTx{x}
		},
		"database-sql": func() tx {
			x, err := db.BeginTx(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			return sqlTx{x}
		},
	}
}

// The first delivery is first; a redelivery returns the first's time and
// recorded result; another payload under the id is a mismatch naming both
// hashes, and aborts nothing but its own transaction.
func TestOnce_FirstRedeliveryResultMismatch(t *testing.T) {
	pool := pgtest.DB(t)
	ctx := context.Background()
	for name, begin := range families(t, pool) {
		t.Run(name, func(t *testing.T) {
			obs := newCounter()
			in, err := inbox.New(&inbox.Config{Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			consumer := "billing." + strings.ReplaceAll(name, "-", "_")
			msg := inbox.Message{Consumer: consumer, ID: "evt_1", Payload: []byte(`{"order":"o-1"}`)}

			x := begin()
			r, err := in.Once(ctx, x.handle(), msg)
			if err != nil || !r.First || r.Deliveries != 1 || r.Result != nil {
				t.Fatalf("first delivery: %+v %v", r, err)
			}
			if err := r.Record(ctx, x.handle(), map[string]string{"invoice": "inv_7"}); err != nil {
				t.Fatal(err)
			}
			if err := x.commit(); err != nil {
				t.Fatal(err)
			}

			x = begin()
			again, err := in.Once(ctx, x.handle(), msg)
			if err != nil || again.First || again.Deliveries != 2 || !again.ReceivedAt.Equal(r.ReceivedAt) {
				t.Fatalf("redelivery: %+v %v (first at %s)", again, err, r.ReceivedAt)
			}
			var res map[string]string
			if json.Unmarshal(again.Result, &res) != nil || res["invoice"] != "inv_7" {
				t.Errorf("redelivery's result %s, want the recorded one", again.Result)
			}
			if err := x.commit(); err != nil {
				t.Fatal(err)
			}

			x = begin()
			_, err = in.Once(ctx, x.handle(), inbox.Message{Consumer: consumer, ID: "evt_1", Payload: []byte(`{"order":"o-2"}`)})
			var pm *inbox.PayloadMismatchError
			if !errors.As(err, &pm) || !errors.Is(err, inbox.ErrPayloadMismatch) || len(pm.StoredHash) != 64 || len(pm.NewHash) != 64 || pm.StoredHash == pm.NewHash {
				t.Fatalf("another payload: %v", err)
			}
			x.rollback()

			// A record of one consumer is not another's.
			x = begin()
			other, err := in.Once(ctx, x.handle(), inbox.Message{Consumer: consumer + "-audit", ID: "evt_1", Payload: msg.Payload})
			if err != nil || !other.First {
				t.Fatalf("another consumer: %+v %v", other, err)
			}
			x.commit()

			if obs.firsts[consumer] != 1 || obs.duplicates[consumer] != 1 || obs.mismatch[consumer] != 1 {
				t.Errorf("observer: firsts %v duplicates %v mismatches %v", obs.firsts, obs.duplicates, obs.mismatch)
			}
		})
	}
}

// A delivery concurrent with an uncommitted first one waits for it: a
// redelivery once the first commits, the first once it rolls back.
func TestOnce_ConcurrentDeliveriesWaitForTheFirst(t *testing.T) {
	pool := pgtest.DB(t)
	ctx := context.Background()
	for name, begin := range families(t, pool) {
		for _, commit := range []bool{true, false} {
			t.Run(name, func(t *testing.T) {
				msg := inbox.Message{Consumer: "shipping", ID: name + "-" + map[bool]string{true: "commit", false: "rollback"}[commit], Payload: []byte("p")}
				first := begin()
				r, err := inbox.Once(ctx, first.handle(), msg)
				if err != nil || !r.First {
					t.Fatalf("first: %+v %v", r, err)
				}
				type out struct {
					r   inbox.Receipt
					err error
				}
				second := begin()
				defer second.rollback()
				done := make(chan out, 1)
				go func() {
					r, err := inbox.Once(ctx, second.handle(), msg)
					done <- out{r, err}
				}()
				// The second waits on the first's row lock.
				deadline := time.Now().Add(10 * time.Second)
				tick := time.NewTicker(5 * time.Millisecond)
				defer tick.Stop()
				for {
					var waiting bool
					if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%sidefx_inbox_once%')`).Scan(&waiting); err != nil {
						t.Fatal(err)
					}
					if waiting {
						break
					}
					select {
					case o := <-done:
						t.Fatalf("the second delivery did not wait: %+v %v", o.r, o.err)
					default:
					}
					if time.Now().After(deadline) {
						t.Fatal("the second delivery never waited")
					}
					<-tick.C
				}
				if commit {
					if err := first.commit(); err != nil {
						t.Fatal(err)
					}
				} else {
					first.rollback()
				}
				o := <-done
				if o.err != nil || o.r.First == commit {
					t.Fatalf("after the first %s: %+v %v", map[bool]string{true: "committed", false: "rolled back"}[commit], o.r, o.err)
				}
			})
		}
	}
}

// 32 deliveries of one message at once (a rebalance that hands it to every
// member), each in its own transaction on its own connection: one is first
// and does the work; the other 31 are redeliveries that return its
// recorded result. The work is done once.
func TestOnce_32ConcurrentDeliveries(t *testing.T) {
	base := pgtest.DB(t)
	ctx := context.Background()
	if _, err := base.Exec(ctx, `CREATE TABLE invoices (message_id text PRIMARY KEY, worker int)`); err != nil {
		t.Fatal(err)
	}
	cfg := base.Config().Copy()
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for name, begin := range families(t, pool) {
		t.Run(name, func(t *testing.T) {
			obs := newCounter()
			in, err := inbox.New(&inbox.Config{Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			msg := inbox.Message{Consumer: "billing", ID: "evt-" + name, Payload: []byte(`{"order":"o-1"}`)}
			const n = 32
			type out struct {
				r   inbox.Receipt
				err error
			}
			outs := make([]out, n)
			start := make(chan struct{})
			var ready, wg sync.WaitGroup
			for i := range n {
				ready.Add(1)
				wg.Go(func() {
					x := begin() // a connection each, before the start
					defer x.rollback()
					ready.Done()
					<-start
					r, err := in.Once(ctx, x.handle(), msg)
					if err == nil && r.First {
						switch h := x.handle().(type) {
						case pgx.Tx:
							_, err = h.Exec(ctx, `INSERT INTO invoices VALUES ($1, $2)`, msg.ID, i)
						case *sql.Tx:
							_, err = h.ExecContext(ctx, `INSERT INTO invoices VALUES ($1, $2)`, msg.ID, i)
						}
						if err == nil {
							err = r.Record(ctx, x.handle(), map[string]int{"worker": i})
						}
					}
					if err == nil {
						err = x.commit()
					}
					outs[i] = out{r, err}
				})
			}
			ready.Wait()
			close(start)
			wg.Wait()
			firsts, worker := 0, -1
			for i, o := range outs {
				if o.err != nil {
					t.Fatalf("delivery %d: %v", i, o.err)
				}
				if o.r.First {
					firsts++
					worker = i
				}
			}
			if firsts != 1 {
				t.Fatalf("%d deliveries were first, want 1", firsts)
			}
			want := fmt.Sprintf(`{"worker": %d}`, worker)
			for i, o := range outs {
				if !o.r.First && string(o.r.Result) != want {
					t.Errorf("redelivery %d: result %s, want the first's %s", i, o.r.Result, want)
				}
			}
			var rows int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM invoices WHERE message_id = $1`, msg.ID).Scan(&rows); err != nil || rows != 1 {
				t.Fatalf("invoices for the message: %d, %v; want 1", rows, err)
			}
			if obs.firsts["billing"] != 1 || obs.duplicates["billing"] != n-1 {
				t.Errorf("observed %d first and %d duplicates, want 1 and %d", obs.firsts["billing"], obs.duplicates["billing"], n-1)
			}
		})
	}
}

func TestOnce_RefusesWhatItCannotRecord(t *testing.T) {
	pool := pgtest.DB(t)
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	msg := inbox.Message{Consumer: "billing", ID: "evt_1", Payload: []byte("p")}
	for name, h := range map[string]any{"a pool": pool, "a *sql.DB": db, "nil": nil, "a string": "tx"} {
		if _, err := inbox.Once(ctx, h, msg); !errors.Is(err, inbox.ErrInvalid) {
			t.Errorf("Once on %s: %v, want ErrInvalid", name, err)
		}
	}
	x, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Rollback(ctx)
	for _, m := range []inbox.Message{{Consumer: "Billing", ID: "1"}, {Consumer: "billing", ID: ""}, {Consumer: "billing", ID: strings.Repeat("x", 256)}} {
		if _, err := inbox.Once(ctx, x, m); !errors.Is(err, inbox.ErrInvalid) {
			t.Errorf("Once(%q, %d-character id): %v, want ErrInvalid", m.Consumer, len(m.ID), err)
		}
	}
	if err := (inbox.Receipt{}).Record(ctx, x, "r"); !errors.Is(err, inbox.ErrInvalid) {
		t.Errorf("Record on a zero Receipt: %v", err)
	}
	if _, err := inbox.New(&inbox.Config{Schema: "no-such schema"}); err == nil {
		t.Error("New accepted a schema that is not an identifier")
	}
	// The SQL function refuses what Go would have: other languages get
	// the same contract.
	_, err = x.Exec(ctx, `SELECT * FROM sidefx_inbox_once('Billing', 'evt', sha256('p'))`)
	if err == nil || !strings.Contains(err.Error(), "SQLSTATE 22023") {
		t.Errorf("sidefx_inbox_once with a bad consumer: %v", err)
	}
}

// Records expire after the consumer's retention.
func TestOnce_RetentionSetsTheExpiry(t *testing.T) {
	pool := pgtest.DB(t)
	ctx := context.Background()
	in, err := inbox.New(&inbox.Config{Retention: 36 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	x, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Once(ctx, x, inbox.Message{Consumer: "billing", ID: "evt_9", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	if err := x.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var span time.Duration
	if err := pool.QueryRow(ctx, `SELECT expires_at - received_at FROM sidefx_inbox WHERE message_id = 'evt_9'`).Scan(&span); err != nil {
		t.Fatal(err)
	}
	if span != 36*time.Hour {
		t.Errorf("record kept for %s, want 36h", span)
	}
}

// Each redelivery keeps the record for the retention after it: a message a
// broker still redelivers past the first delivery's retention is not
// trimmed and then handled as new. Time passes by moving the record's
// times back.
func TestOnce_RedeliveryExtendsTheRetention(t *testing.T) {
	pool := pgtest.DB(t)
	ctx := context.Background()
	in, err := inbox.New(&inbox.Config{Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(pool, "")
	if err != nil {
		t.Fatal(err)
	}
	deliver := func(in *inbox.Inbox) inbox.Receipt {
		t.Helper()
		x, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r, err := in.Once(ctx, x, inbox.Message{Consumer: "billing", ID: "evt_late", Payload: []byte("p")})
		if err != nil {
			t.Fatal(err)
		}
		if err := x.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return r
	}
	pass := func(d string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE sidefx_inbox SET received_at = received_at - $1::interval, last_at = last_at - $1::interval,
			expires_at = expires_at - $1::interval WHERE message_id = 'evt_late'`, d); err != nil {
			t.Fatal(err)
		}
	}
	expiry := func() time.Time {
		t.Helper()
		var at time.Time
		if err := pool.QueryRow(ctx, `SELECT expires_at FROM sidefx_inbox WHERE message_id = 'evt_late'`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	if r := deliver(in); !r.First {
		t.Fatal("the first delivery is not first")
	}
	pass("40 minutes")
	first := expiry()
	if r := deliver(in); r.First {
		t.Fatal("the redelivery is first")
	}
	again := expiry()
	var span time.Duration
	if err := pool.QueryRow(ctx, `SELECT expires_at - last_at FROM sidefx_inbox WHERE message_id = 'evt_late'`).Scan(&span); err != nil {
		t.Fatal(err)
	}
	if !again.After(first) || span != time.Hour {
		t.Fatalf("after a redelivery 40 minutes on: expires %s (was %s), %s after it; want an hour after the redelivery", again, first, span)
	}
	// 30 minutes on, the first delivery's expiry has passed, the
	// redelivery's has not: the reaper keeps the record.
	pass("30 minutes")
	if n, err := eng.TrimInbox(ctx, 100); err != nil || n != 0 {
		t.Fatalf("trim between the first delivery's expiry and the redelivery's: %d deleted, %v; want the record kept", n, err)
	}
	if r := deliver(in); r.First || r.Deliveries != 3 {
		t.Fatalf("the third delivery: first %v, deliveries %d; want a redelivery, the third", r.First, r.Deliveries)
	}
	// A redelivery through an Inbox of shorter retention never shortens it.
	before := expiry()
	short, err := inbox.New(&inbox.Config{Retention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	deliver(short)
	if after := expiry(); !after.Equal(before) {
		t.Errorf("a shorter retention moved the expiry from %s to %s", before, after)
	}
}
