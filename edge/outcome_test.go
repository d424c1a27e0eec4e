package edge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/edge"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/internal/lab/syncbuf"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers/providertest"
)

const chargeKind = "charge.create"

// startDispatcher runs a dispatcher with a fake payment provider until the
// returned stop is called.
func startDispatcher(t *testing.T, pool *pgxpool.Pool) (stop func()) {
	return startNotifying(t, pool, false)
}

// startNotifying is startDispatcher whose kind announces its outcomes, or
// not.
func startNotifying(t *testing.T, pool *pgxpool.Pool, notify bool) (stop func()) {
	t.Helper()
	return startWith(t, pool, providertest.New(providertest.Config{Name: "payments", Idempotent: true, Latency: 30 * time.Millisecond}), notify)
}

// startWith is startNotifying with the payment provider given.
func startWith(t *testing.T, pool *pgxpool.Pool, payments *providertest.Fake, notify bool) (stop func()) {
	t.Helper()
	d, err := dispatcher.New(pool, &dispatcher.Config{PollInterval: 10 * time.Millisecond, Kinds: map[string]dispatcher.Kind{
		chargeKind: {Provider: payments, NotifyOutcome: notify},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("dispatcher: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

// A route whose answer is a charge's outcome: the handler enqueues the
// charge and says 202; the middleware answers with the outcome once the
// charge is settled, and stores that. If the wait ends first, the client
// gets the 202, a retry gets 409 until the charge settles, then the
// outcome, stored for every later retry.
func TestEdge_AnswersWithTheEffectsOutcome(t *testing.T) {
	for _, useSQL := range []bool{false, true} {
		t.Run(map[bool]string{false: "pgx", true: "database-sql"}[useSQL], func(t *testing.T) {
			pool := pgtest.DB(t)
			cfg := &edge.Config{Pool: pool}
			if useSQL {
				db := stdlib.OpenDBFromPool(pool)
				t.Cleanup(func() { db.Close() })
				cfg.Pool, cfg.DB = nil, db
			}
			e, err := edge.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx := r.Context()
				var tx any = edge.Tx(ctx)
				if useSQL {
					tx = edge.SQLTx(ctx)
				}
				if _, err := outbox.Enqueue(ctx, tx, outbox.Effect{SourceID: e.DomainID(r), Kind: chargeKind, Payload: map[string]int{"amount": 1200}}); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusAccepted)
				fmt.Fprint(w, `{"status":"processing"}`)
			})
			answer := func(w http.ResponseWriter, eff *effects.Effect) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				json.NewEncoder(w).Encode(map[string]string{"status": string(eff.State), "ref": eff.ProviderRef})
			}
			mux := http.NewServeMux()
			mux.Handle("POST /charges", e.RequireOutcome(charge, edge.Outcome{Kind: chargeKind, Wait: 10 * time.Second, Answer: answer}))
			mux.Handle("POST /slow-charges", e.RequireOutcome(charge, edge.Outcome{Kind: chargeKind, Wait: 100 * time.Millisecond, Answer: answer}))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			post := func(path, key string) (int, string, string) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{"amount":1200}`))
				req.Header.Set(edge.HeaderKey, key)
				resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var b strings.Builder
				_, _ = fmt.Fprint(&b, readAll(resp))
				return resp.StatusCode, strings.TrimSpace(b.String()), resp.Header.Get(edge.HeaderReplayed)
			}

			// Settled within the wait: the outcome, stored.
			stop := startDispatcher(t, pool)
			code, body, _ := post("/charges", "k-fast")
			if code != 201 || !strings.Contains(body, `"status":"confirmed"`) || !strings.Contains(body, `"ref":"`) {
				t.Fatalf("within the wait: %d %s", code, body)
			}
			if c, b, replayed := post("/charges", "k-fast"); c != 201 || b != body || replayed != "true" {
				t.Errorf("a retry: %d %s replayed=%q, want the stored outcome", c, b, replayed)
			}
			stop()

			// Not settled within the wait: the provisional answer, then
			// 409 until the charge settles, then the outcome.
			if c, b, _ := post("/slow-charges", "k-slow"); c != 202 || b != `{"status":"processing"}` {
				t.Fatalf("past the wait: %d %s", c, b)
			}
			if c, b, _ := post("/slow-charges", "k-slow"); c != 409 || !strings.Contains(b, "not known yet") {
				t.Fatalf("a retry while pending: %d %s", c, b)
			}
			startDispatcher(t, pool)
			deadline := time.Now().Add(30 * time.Second)
			var final string
			for {
				c, b, replayed := post("/slow-charges", "k-slow")
				if c == 201 {
					if replayed != "true" || !strings.Contains(b, `"status":"confirmed"`) {
						t.Fatalf("the outcome after the wait: %s replayed=%q", b, replayed)
					}
					final = b
					break
				}
				if c != 409 || time.Now().After(deadline) {
					t.Fatalf("a retry: %d %s", c, b)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if c, b, _ := post("/slow-charges", "k-slow"); c != 201 || b != final {
				t.Errorf("later: %d %s, want the stored %s", c, b, final)
			}
			var charges int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM side_effects WHERE kind = $1`, chargeKind).Scan(&charges); err != nil || charges != 2 {
				t.Errorf("%d charges, want 2 (one per key): %v", charges, err)
			}
		})
	}
}

func readAll(resp *http.Response) string {
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// The wait is woken by the dispatcher's announcement of the outcome
// (notify_outcome), not by its polls: with polls an hour apart, an
// announced outcome is the answer within the wait; an unannounced one is
// not, and the client gets the provisional answer when the wait ends.
func TestEdge_OutcomeWaitIsWokenByTheAnnouncement(t *testing.T) {
	for _, name := range []string{"pgx", "database-sql-with-listen-pool"} {
		t.Run(name, func(t *testing.T) {
			pool := pgtest.DB(t)
			cfg := &edge.Config{Pool: pool}
			if name != "pgx" {
				db := stdlib.OpenDBFromPool(pool)
				t.Cleanup(func() { db.Close() })
				cfg.Pool, cfg.DB, cfg.ListenPool = nil, db, pool
			}
			e, err := edge.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(e.Close)
			edge.SetPolls(e, time.Hour, time.Hour, time.Hour)
			charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var tx any = edge.Tx(r.Context())
				if cfg.DB != nil {
					tx = edge.SQLTx(r.Context())
				}
				if _, err := outbox.Enqueue(r.Context(), tx, outbox.Effect{SourceID: e.DomainID(r), Kind: chargeKind, Payload: map[string]int{"amount": 1200}}); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusAccepted)
			})
			answer := func(w http.ResponseWriter, eff *effects.Effect) {
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, eff.State)
			}
			mux := http.NewServeMux()
			mux.Handle("POST /charges", e.RequireOutcome(charge, edge.Outcome{Kind: chargeKind, Wait: 20 * time.Second, Answer: answer}))
			mux.Handle("POST /quick-charges", e.RequireOutcome(charge, edge.Outcome{Kind: chargeKind, Wait: time.Second, Answer: answer}))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			post := func(path, key string) (int, string) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
				req.Header.Set(edge.HeaderKey, key)
				resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				return resp.StatusCode, readAll(resp)
			}

			stop := startNotifying(t, pool, true)
			if c, b := post("/charges", "k-announced"); c != 201 || b != "confirmed" {
				t.Fatalf("an announced outcome: %d %q, want 201 confirmed", c, b)
			}
			stop()
			startNotifying(t, pool, false)
			if c, b := post("/quick-charges", "k-quiet"); c != 202 {
				t.Fatalf("an unannounced outcome with polls an hour apart: %d %q, want the provisional 202", c, b)
			}
		})
	}
}

// A stored outcome answer never outlives the outcome it was made from: a
// charge declined, answered 402 and stored, then retried by an operator
// and confirmed, answers the next retry under the key with the
// confirmation (stored in place of the decline), not the decline, which
// would have the client pay again under a new key. While the charge is
// pending again the retry gets 409.
func TestEdge_StoredOutcomeFollowsTheEffect(t *testing.T) {
	for _, useSQL := range []bool{false, true} {
		t.Run(map[bool]string{false: "pgx", true: "database-sql"}[useSQL], func(t *testing.T) {
			ctx := context.Background()
			pool := pgtest.DB(t)
			cfg := &edge.Config{Pool: pool}
			if useSQL {
				db := stdlib.OpenDBFromPool(pool)
				t.Cleanup(func() { db.Close() })
				cfg.Pool, cfg.DB, cfg.ListenPool = nil, db, pool
			}
			e, err := edge.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(e.Close)
			charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var tx any = edge.Tx(r.Context())
				if useSQL {
					tx = edge.SQLTx(r.Context())
				}
				if _, err := outbox.Enqueue(r.Context(), tx, outbox.Effect{SourceID: e.DomainID(r), Kind: chargeKind, Payload: map[string]int{"amount": 1200}}); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusAccepted)
			})
			answer := func(w http.ResponseWriter, eff *effects.Effect) {
				status := http.StatusCreated
				if eff.State != effects.Confirmed {
					status = http.StatusPaymentRequired
				}
				w.WriteHeader(status)
				fmt.Fprint(w, eff.State)
			}
			mux := http.NewServeMux()
			mux.Handle("POST /charges", e.RequireOutcome(charge, edge.Outcome{Kind: chargeKind, Wait: 20 * time.Second, Answer: answer}))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			post := func() (int, string, string) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{}`))
				req.Header.Set(edge.HeaderKey, "k-declined")
				resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				return resp.StatusCode, readAll(resp), resp.Header.Get(edge.HeaderReplayed)
			}
			stored := func() (status int) {
				t.Helper()
				if err := pool.QueryRow(ctx, `SELECT coalesce(status, 0) FROM sidefx_edge_keys`).Scan(&status); err != nil {
					t.Fatal(err)
				}
				return status
			}

			// The first call is declined; the same fake confirms the next.
			payments := providertest.New(providertest.Config{Name: "payments", Idempotent: true,
				Faults: providertest.FailFirst(1, providertest.Reject("card declined"))})
			stop := startWith(t, pool, payments, true)
			if c, b, _ := post(); c != 402 || b != "failed" {
				t.Fatalf("the declined charge: %d %q, want 402 failed", c, b)
			}
			if c, b, replayed := post(); c != 402 || b != "failed" || replayed != "true" {
				t.Fatalf("a retry: %d %q replayed=%q, want the stored 402 failed", c, b, replayed)
			}
			stop()

			store, err := engine.NewStore(pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			var id int64
			if err := pool.QueryRow(ctx, `SELECT id FROM side_effects WHERE kind = $1`, chargeKind).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Retry(ctx, id, 1, effects.RefireOptions{}, effects.By{Actor: "ops@test", Note: "the customer topped up"}); err != nil {
				t.Fatal(err)
			}
			if c, b, _ := post(); c != 409 {
				t.Fatalf("a retry while the retried charge is pending: %d %q, want 409, not the stale decline", c, b)
			}

			// Wait for the dispatcher's announcement that the charge settled.
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, `LISTEN `+engine.OutcomeChannel("public")); err != nil {
				t.Fatal(err)
			}
			startWith(t, pool, payments, true)
			wait, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if _, err := conn.Conn().WaitForNotification(wait); err != nil {
				t.Fatalf("the retried charge's outcome: %v", err)
			}
			if eff, err := store.Get(ctx, id); err != nil || eff.State != effects.Confirmed {
				t.Fatalf("the retried charge: %+v, %v; want confirmed", eff, err)
			}

			if c, b, replayed := post(); c != 201 || b != "confirmed" || replayed != "true" {
				t.Fatalf("a retry after the charge was confirmed: %d %q replayed=%q, want 201 confirmed, not the stale decline", c, b, replayed)
			}
			if s := stored(); s != 201 {
				t.Errorf("stored status %d, want the confirmation's 201 in place of the decline", s)
			}
			if c, b, _ := post(); c != 201 || b != "confirmed" {
				t.Errorf("a later retry: %d %q, want 201 confirmed", c, b)
			}
			var charges int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM side_effects`).Scan(&charges); err != nil || charges != 1 {
				t.Errorf("%d charges, want 1: %v", charges, err)
			}
		})
	}
}

// A RequireOutcome handler that answers 2xx without enqueuing the effect
// its route awaits (a bug: another source id, another kind, no enqueue)
// gets a 500 naming the effect at once, its work rolled back and the
// bug logged; no key is kept waiting, and answering 409, for an effect
// that never comes. A retry after the fix executes.
func TestEdge_OutcomeRouteRefusesAHandlerThatDidNotEnqueue(t *testing.T) {
	for _, useSQL := range []bool{false, true} {
		t.Run(map[bool]string{false: "pgx", true: "database-sql"}[useSQL], func(t *testing.T) {
			ctx := context.Background()
			pool := pgtest.DB(t)
			var logs syncbuf.Buffer
			cfg := &edge.Config{Pool: pool, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
			if useSQL {
				db := stdlib.OpenDBFromPool(pool)
				t.Cleanup(func() { db.Close() })
				cfg.Pool, cfg.DB = nil, db
			}
			e, err := edge.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var fixed atomic.Bool
			var calls atomic.Int32
			charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				var tx any = edge.Tx(r.Context())
				if useSQL {
					tx = edge.SQLTx(r.Context())
				}
				// Work of its own, and the charge under the wrong
				// source id until fixed.
				source := "order-" + e.DomainID(r)
				if fixed.Load() {
					source = e.DomainID(r)
				}
				if _, err := outbox.EnqueueMany(r.Context(), tx, []outbox.Effect{
					{SourceID: e.DomainID(r), Kind: "email.receipt", Payload: map[string]int{"amount": 1200}},
					{SourceID: source, Kind: chargeKind, Payload: map[string]int{"amount": 1200}}}); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusAccepted)
			})
			answer := func(w http.ResponseWriter, eff *effects.Effect) { fmt.Fprint(w, eff.State) }
			mux := http.NewServeMux()
			mux.Handle("POST /charges", e.RequireOutcome(charge, edge.Outcome{Kind: chargeKind, Wait: 50 * time.Millisecond, Answer: answer}))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			post := func() (*http.Response, string) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{}`))
				req.Header.Set(edge.HeaderKey, "k-bug")
				resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				return resp, readAll(resp)
			}
			count := func(table string) (n int) {
				t.Helper()
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			source := derive.DomainID("", "k-bug").String()

			resp, body := post()
			if resp.StatusCode != 500 || resp.Header.Get("Content-Type") != "application/problem+json" ||
				!strings.Contains(body, `without enqueuing the effect this route awaits (kind \"`+chargeKind+`\", source \"`+source+`\")`) {
				t.Fatalf("a handler that did not enqueue the awaited effect: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			if n, k := count("side_effects"), count("sidefx_edge_keys"); n != 0 || k != 0 {
				t.Errorf("%d effects and %d keys committed, want none: the handler's transaction rolls back", n, k)
			}
			if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "kind="+chargeKind) || !strings.Contains(l, "source_id="+source) {
				t.Errorf("log %q, want an error naming the kind and source id", l)
			}
			if resp, body := post(); resp.StatusCode != 500 || calls.Load() != 2 {
				t.Fatalf("a retry: %d %s after %d calls, want it executed, and refused, again", resp.StatusCode, body, calls.Load())
			}

			// Fixed: the retry executes, and waits for the charge.
			fixed.Store(true)
			if resp, body := post(); resp.StatusCode != 202 || calls.Load() != 3 {
				t.Fatalf("a retry after the fix: %d %s after %d calls, want the provisional 202 of a third call", resp.StatusCode, body, calls.Load())
			}
			if n := count("side_effects"); n != 2 {
				t.Errorf("%d effects, want the charge and the receipt", n)
			}
		})
	}
}
