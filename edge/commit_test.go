package edge_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/edge"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/internal/lab/syncbuf"
	"github.com/sidefx/sidefx/outbox"
)

// rows counts what a request's work leaves: orders, effects and key
// records.
func (a *api) rows(t *testing.T) [3]int {
	t.Helper()
	return [3]int{a.count(t, `SELECT count(*) FROM orders`), a.count(t, `SELECT count(*) FROM side_effects`), a.count(t, `SELECT count(*) FROM sidefx_edge_keys`)}
}

// A 4xx rolls back by default: the handler's order row and its effect do
// not commit (half a request), the answer is not stored, and the key is
// released: a retry with it executes. The same holds without a key.
func TestEdge_4xxRollsBackByDefault(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		a.answer.Store(http.StatusUnprocessableEntity)
		if r, body := a.post(t, "/orders", "k-422", "acme", `{"item":"mug"}`); r.StatusCode != 422 || !strings.Contains(body, `"status":422`) {
			t.Fatalf("first: %d %s", r.StatusCode, body)
		}
		if n := a.rows(t); n != [3]int{} {
			t.Fatalf("a 4xx left %v orders, effects and keys", n)
		}
		a.answer.Store(0)
		if r, body := a.post(t, "/orders", "k-422", "acme", `{"item":"mug"}`); r.StatusCode != 201 || r.Header.Get(edge.HeaderReplayed) != "" {
			t.Fatalf("retry: %d %s, want it executed", r.StatusCode, body)
		}
		if a.calls.Load() != 2 || a.rows(t) != [3]int{1, 1, 1} {
			t.Errorf("calls %d, rows %v; want 2 calls, one order, effect and key", a.calls.Load(), a.rows(t))
		}
		// Without a key: rolled back too.
		a.answer.Store(http.StatusConflict)
		if r, _ := a.post(t, "/notes", "", "acme", `{"item":"note"}`); r.StatusCode != 409 {
			t.Fatalf("without a key: %d", r.StatusCode)
		}
		if a.count(t, `SELECT count(*) FROM orders`) != 1 {
			t.Errorf("a 4xx without a key committed its row")
		}
	})
}

// A handler that marks its 4xx final (edge.Commit) commits its work with
// the key's record, and a retry gets the stored 4xx replayed, the handler
// not run again; without a key, the work commits too.
func TestEdge_CommitMakesA4xxFinal(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		a.answer.Store(http.StatusConflict)
		a.decide.Store(1)
		first, body := a.post(t, "/orders", "k-409", "acme", `{"item":"mug"}`)
		if first.StatusCode != 409 {
			t.Fatalf("first: %d %s", first.StatusCode, body)
		}
		if n := a.rows(t); n != [3]int{1, 1, 1} {
			t.Fatalf("a committed 4xx left %v orders, effects and keys; want one of each", n)
		}
		again, body2 := a.post(t, "/orders", "k-409", "acme", `{"item":"mug"}`)
		if again.StatusCode != 409 || body2 != body || again.Header.Get(edge.HeaderReplayed) != "true" {
			t.Fatalf("retry: %d %s, want the replay of %s", again.StatusCode, body2, body)
		}
		if a.calls.Load() != 1 {
			t.Errorf("the handler ran %d times", a.calls.Load())
		}
		if r, _ := a.post(t, "/notes", "", "acme", `{"item":"note"}`); r.StatusCode != 409 || a.count(t, `SELECT count(*) FROM orders`) != 2 {
			t.Errorf("a committed 4xx without a key: %d, %d orders", r.StatusCode, a.count(t, `SELECT count(*) FROM orders`))
		}
	})
}

// A handler that aborts its 2xx (edge.Abort) rolls its work back with the
// key's record: the client gets the answer, unstored, and a retry
// executes.
func TestEdge_AbortRollsBackA2xx(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		a.answer.Store(http.StatusOK)
		a.decide.Store(2)
		if r, body := a.post(t, "/orders", "k-dry", "acme", `{"item":"mug"}`); r.StatusCode != 200 || !strings.Contains(body, `"status":200`) {
			t.Fatalf("first: %d %s", r.StatusCode, body)
		}
		if n := a.rows(t); n != [3]int{} {
			t.Fatalf("an aborted 2xx left %v orders, effects and keys", n)
		}
		a.answer.Store(0)
		if r, _ := a.post(t, "/orders", "k-dry", "acme", `{"item":"mug"}`); r.StatusCode != 201 || r.Header.Get(edge.HeaderReplayed) != "" {
			t.Fatalf("retry: %d, want it executed", r.StatusCode)
		}
		if a.calls.Load() != 2 || a.rows(t) != [3]int{1, 1, 1} {
			t.Errorf("calls %d, rows %v", a.calls.Load(), a.rows(t))
		}
	})
}

// The failures the middleware answers with 503 are logged with their
// cause: the schema lacking sidefx_edge_keys (saying to run sidefx
// migrate), the database closed. The log names the route and the
// request's DomainID, never its key or body.
func TestEdge_LogsTheCauseOfA503(t *testing.T) {
	var logs *syncbuf.Buffer
	families(t, func(t *testing.T, a *api) {
		ctx := context.Background()
		key, body := "k-secret-4711", `{"item":"confidential-item"}`
		if _, err := a.pool.Exec(ctx, `DROP TABLE sidefx_edge_keys`); err != nil {
			t.Fatal(err)
		}
		r, _ := a.post(t, "/orders", key, "acme", body)
		if r.StatusCode != 503 || r.Header.Get("Retry-After") == "" {
			t.Fatalf("without sidefx_edge_keys: %d", r.StatusCode)
		}
		req, _ := http.NewRequest(http.MethodPost, "/orders", nil)
		req.Header.Set(edge.HeaderKey, key)
		req.Header.Set("X-Tenant", "acme")
		got := logs.String()
		for _, want := range []string{"level=ERROR", "Database unavailable", "sidefx_edge_keys", "run sidefx migrate", `route="POST /orders"`, "domain_id=" + a.e.DomainID(req)} {
			if !strings.Contains(got, want) {
				t.Errorf("the log lacks %q:\n%s", want, got)
			}
		}
		if strings.Contains(got, key) || strings.Contains(got, "confidential-item") {
			t.Errorf("the log holds the key or the body:\n%s", got)
		}

		a.edgeDB.Close()
		if r, _ := a.post(t, "/notes", "", "acme", body); r.StatusCode != 503 {
			t.Fatalf("the database closed: %d", r.StatusCode)
		}
		if got := logs.String(); !strings.Contains(got, "the request's transaction could not begin") || !strings.Contains(got, "closed") {
			t.Errorf("the log lacks the closed database:\n%s", got)
		}
	}, func(c *edge.Config) {
		logs = &syncbuf.Buffer{}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
}

// With DomainIDScope ScopeRoute, the domain id is scoped as the key's
// record is: the same key on two routes is two requests with two domain
// ids, each executed (no 500 on the orders' primary key), each its id
// derive.ScopedDomainID of tenant, key, method and route.
func TestEdge_ScopeRouteGivesOneDomainIDPerRoute(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		for _, path := range []string{"/orders", "/notes"} {
			if r, body := a.post(t, path, "k-shared", "acme", `{"item":"mug"}`); r.StatusCode != 201 || r.Header.Get(edge.HeaderReplayed) != "" {
				t.Fatalf("%s with the key: %d %s, want it executed", path, r.StatusCode, body)
			}
		}
		want := []string{
			derive.ScopedDomainID("acme", "k-shared", "POST POST /notes").String(),
			derive.ScopedDomainID("acme", "k-shared", "POST POST /orders").String(),
		}
		rows, err := a.pool.Query(context.Background(), `SELECT id FROM orders ORDER BY id = $1 DESC`, want[0])
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids, want) {
			t.Errorf("orders %v, want one per route %v", ids, want)
		}
		if a.count(t, `SELECT count(DISTINCT source_id) FROM side_effects`) != 2 {
			t.Errorf("the effects do not have one source per route")
		}
		// Retried, each route replays its own answer.
		for _, path := range []string{"/orders", "/notes"} {
			if r, _ := a.post(t, path, "k-shared", "acme", `{"item":"mug"}`); r.StatusCode != 201 || r.Header.Get(edge.HeaderReplayed) != "true" {
				t.Errorf("%s retried: %d, want its replay", path, r.StatusCode)
			}
		}
		if a.calls.Load() != 2 {
			t.Errorf("the handler ran %d times, want once per route", a.calls.Load())
		}
	}, func(c *edge.Config) { c.DomainIDScope = edge.ScopeRoute })
}

// By default DomainID is the released derivation, of tenant and key alone
// (derive.DomainID's golden vector): an upgrade does not change the ids an
// existing deployment derives.
func TestEdge_DomainIDDefaultIsTheReleasedOne(t *testing.T) {
	pool := pgtest.DB(t)
	e, err := edge.New(&edge.Config{Pool: pool, Tenant: func(r *http.Request) string { return r.Header.Get("X-Tenant") }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, path := range []string{"/orders", "/refunds"} {
		r := httptest.NewRequest(http.MethodPost, path, nil)
		r.Header.Set(edge.HeaderKey, "client-req-123")
		r.Header.Set("X-Tenant", "tenant-7")
		if got := e.DomainID(r); got != "296deb59-4fe2-827c-87d5-39977e31ce66" {
			t.Errorf("DomainID on %s = %s, released as 296deb59-4fe2-827c-87d5-39977e31ce66", path, got)
		}
	}
	if _, err := edge.New(&edge.Config{Pool: pool, DomainIDScope: 7}); err == nil {
		t.Error("an unknown DomainIDScope was taken")
	}
}

// A handler that commits the request's transaction itself (the
// middleware's to end) gets its answer stored: its work committed with the
// key's record, so a retry replays the answer instead of meeting a key "in
// progress" until it expires, and an error log says what to do instead. One
// that rolls it back gets a 500 saying nothing was committed, and a retry
// executes.
func TestEdge_AHandlerThatEndsTheTransactionItself(t *testing.T) {
	var logs *syncbuf.Buffer
	families(t, func(t *testing.T, a *api) {
		for _, status := range []int32{0, http.StatusConflict} {
			clearRequests(t, a)
			a.calls.Store(0)
			a.answer.Store(status)
			a.decide.Store(3)
			key := fmt.Sprintf("k-own-%d", status)
			first, body := a.post(t, "/orders", key, "acme", `{"item":"mug"}`)
			want := 201
			if status != 0 {
				want = int(status)
			}
			if first.StatusCode != want {
				t.Fatalf("a handler that committed itself, answering %d: %d %s", want, first.StatusCode, body)
			}
			if n := a.rows(t); n != [3]int{1, 1, 1} {
				t.Fatalf("rows %v, want the committed order, effect and key", n)
			}
			again, body2 := a.post(t, "/orders", key, "acme", `{"item":"mug"}`)
			if again.StatusCode != want || body2 != body || again.Header.Get(edge.HeaderReplayed) != "true" || a.calls.Load() != 1 {
				t.Fatalf("retry: %d %s (calls %d), want the replay of %d %s", again.StatusCode, body2, a.calls.Load(), want, body)
			}
			if !strings.Contains(logs.String(), "the handler committed the request's transaction itself") {
				t.Errorf("no error logged: %s", logs.String())
			}
		}

		clearRequests(t, a)
		a.calls.Store(0)
		a.answer.Store(0)
		a.decide.Store(4)
		if r, body := a.post(t, "/orders", "k-rb", "acme", `{"item":"mug"}`); r.StatusCode != 500 || !strings.Contains(body, "nothing was committed") {
			t.Fatalf("a handler that rolled back itself: %d %s", r.StatusCode, body)
		}
		if n := a.rows(t); n != [3]int{} {
			t.Fatalf("rows %v after a rollback", n)
		}
		a.decide.Store(0)
		if r, body := a.post(t, "/orders", "k-rb", "acme", `{"item":"mug"}`); r.StatusCode != 201 || r.Header.Get(edge.HeaderReplayed) != "" || a.calls.Load() != 2 {
			t.Fatalf("retry after the handler's rollback: %d %s, want it executed", r.StatusCode, body)
		}
	}, func(c *edge.Config) {
		logs = &syncbuf.Buffer{}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
}

// clearRequests deletes what requests left: orders, effects and key records.
func clearRequests(t *testing.T, a *api) {
	t.Helper()
	if _, err := a.pool.Exec(context.Background(), `TRUNCATE orders, side_effects, sidefx_edge_keys CASCADE`); err != nil {
		t.Fatal(err)
	}
}

// A handler that rolled the request's transaction back itself, and answers
// late, never stores its answer under the key: a retry may have recorded
// the key meanwhile (here, on a RequireOutcome route, with its answer
// awaiting the effect), and the late answer is not that retry's. Retries
// get the effect's outcome, not the rolled-back request's answer.
func TestEdge_ALateAnswerOfARolledBackRequestIsNotStored(t *testing.T) {
	pool := pgtest.DB(t)
	e, err := edge.New(&edge.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var calls atomic.Int32
	inside, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := edge.Tx(r.Context())
		if calls.Add(1) == 1 {
			_ = tx.Rollback(r.Context()) // the middleware's to end
			close(inside)
			<-release
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprint(w, "stale: the answer of a rolled-back request")
			return
		}
		if _, err := outbox.Enqueue(r.Context(), tx, outbox.Effect{SourceID: e.DomainID(r), Kind: chargeKind, Payload: map[string]int{"amount": 1}}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprint(w, "provisional")
	})
	mux := http.NewServeMux()
	mux.Handle("POST /charges", e.RequireOutcome(h, edge.Outcome{Kind: chargeKind, Wait: 50 * time.Millisecond,
		Answer: func(w http.ResponseWriter, eff *effects.Effect) { fmt.Fprint(w, "outcome: ", eff.State) }}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	post := func() (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{}`))
		req.Header.Set(edge.HeaderKey, "k-late")
		resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	first := make(chan string, 1)
	go func() { s, b := post(); first <- fmt.Sprint(s, " ", b) }()
	<-inside
	if s, b := post(); s != http.StatusAccepted || b != "provisional" {
		t.Fatalf("the retry while the first request is in its handler: %d %s", s, b)
	}
	close(release)
	if got := <-first; !strings.HasPrefix(got, "500 ") || !strings.Contains(got, "nothing was committed") {
		t.Fatalf("the first request, rolled back by its handler: %s", got)
	}
	stop := startDispatcher(t, pool)
	defer stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(15 * time.Second); ; <-tick.C {
		s, b := post()
		if strings.Contains(b, "stale") {
			t.Fatalf("a retry got the rolled-back request's answer: %d %s", s, b)
		}
		if b == "outcome: confirmed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no outcome within 15s: %d %s", s, b)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2 (the rolled-back request and its retry)", n)
	}
}

// A handler that ends the request's transaction with SQL (ROLLBACK), which
// the driver does not see, gets a 500, and its late answer is never stored
// over the record of a retry that committed meanwhile.
func TestEdge_AHandlerThatRollsBackInSQLStoresNothing(t *testing.T) {
	pool := pgtest.DB(t)
	e, err := edge.New(&edge.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var calls atomic.Int32
	inside, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := edge.Tx(r.Context())
		if calls.Add(1) == 1 {
			if _, err := tx.Exec(r.Context(), "ROLLBACK"); err != nil {
				t.Error(err)
			}
			close(inside)
			<-release
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, "stale: the answer of a rolled-back request")
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "fresh")
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Require(h))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	first := make(chan string, 1)
	go func() { s, b := postKey(t, srv.URL+"/orders", "k-sql", "{}"); first <- fmt.Sprint(s, " ", b) }()
	<-inside
	if s, b := postKey(t, srv.URL+"/orders", "k-sql", "{}"); s != http.StatusCreated || b != "fresh" {
		t.Fatalf("the retry while the first request is in its handler: %d %s", s, b)
	}
	close(release)
	if got := <-first; !strings.HasPrefix(got, "500 ") {
		t.Errorf("the request whose handler rolled back in SQL: %s, want a 500", got)
	}
	if s, b := postKey(t, srv.URL+"/orders", "k-sql", "{}"); s != http.StatusCreated || b != "fresh" {
		t.Errorf("a later retry: %d %s, want the retry's stored answer", s, b)
	}
}

// A request that awaits its outcome past its key's expiry does not store
// its outcome over the answer of the request that took the expired key
// over.
func TestEdge_ALateOutcomeIsNotStoredOverATakeOver(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.DB(t)
	e, err := edge.New(&edge.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if string(body) == `{"bad":true}` {
			edge.Commit(r.Context())
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprint(w, "B: rejected")
			return
		}
		if _, err := outbox.Enqueue(r.Context(), edge.Tx(r.Context()), outbox.Effect{SourceID: e.DomainID(r), Kind: chargeKind, Payload: map[string]int{"amount": 1}}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprint(w, "A: provisional")
	})
	mux := http.NewServeMux()
	mux.Handle("POST /charges", e.RequireOutcome(h, edge.Outcome{Kind: chargeKind, Wait: 10 * time.Second,
		Answer: func(w http.ResponseWriter, eff *effects.Effect) { fmt.Fprint(w, "A's outcome: ", eff.State) }}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	first := make(chan string, 1)
	go func() { s, b := postKey(t, srv.URL+"/charges", "k-late", `{}`); first <- fmt.Sprint(s, " ", b) }()
	// A committed (its effect exists) and awaits its outcome: its key
	// expires (as the tables' owner may make it).
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(10 * time.Second); ; <-tick.C {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM side_effects`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("request A never committed its effect")
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE sidefx_edge_keys SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if s, b := postKey(t, srv.URL+"/charges", "k-late", `{"bad":true}`); s != http.StatusUnprocessableEntity {
		t.Fatalf("B, taking the expired key over: %d %s", s, b)
	}
	stop := startDispatcher(t, pool)
	defer stop()
	if got := <-first; !strings.Contains(got, "A's outcome: confirmed") {
		t.Fatalf("A: %s", got)
	}
	if s, b := postKey(t, srv.URL+"/charges", "k-late", `{"bad":true}`); s != http.StatusUnprocessableEntity || b != "B: rejected" {
		t.Errorf("B's retry: %d %s, want B's stored answer", s, b)
	}
}

// postKey posts body to url with an Idempotency-Key.
func postKey(t *testing.T, url, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set(edge.HeaderKey, key)
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
