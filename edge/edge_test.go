package edge_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sidefx/sidefx/edge"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/migrations"
	"github.com/sidefx/sidefx/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type counts struct {
	mu                                    sync.Mutex
	keyed, replayed, mismatched, conflict int
}

func (c *counts) Keyed(string)      { c.mu.Lock(); c.keyed++; c.mu.Unlock() }
func (c *counts) Replayed(string)   { c.mu.Lock(); c.replayed++; c.mu.Unlock() }
func (c *counts) Mismatched(string) { c.mu.Lock(); c.mismatched++; c.mu.Unlock() }
func (c *counts) Conflicted(string) { c.mu.Lock(); c.conflict++; c.mu.Unlock() }

// api is a service with POST /orders (a key required) and POST /notes (a
// key optional), behind the edge.
type api struct {
	*httptest.Server
	pool    *pgxpool.Pool
	e       *edge.Edge
	obs     *counts
	calls   atomic.Int32
	hold    chan struct{} // when set, the handler waits on it
	entered chan struct{}
	fail    atomic.Bool // answer 500 after writing
	// answer, when set, is the status the handler answers after writing,
	// having called edge.Commit (decide 1) or edge.Abort (decide 2).
	answer, decide atomic.Int32
	edgeDB         io.Closer // the edge's database: a pool or a *sql.DB
}

// families runs f with an api on pgx and one on database/sql, their
// edges' Config changed by opts.
func families(t *testing.T, f func(t *testing.T, a *api), opts ...func(*edge.Config)) {
	for _, useSQL := range []bool{false, true} {
		t.Run(map[bool]string{false: "pgx", true: "database-sql"}[useSQL], func(t *testing.T) { f(t, newAPI(t, useSQL, opts...)) })
	}
}

// poolCloser closes a pool as an io.Closer.
type poolCloser struct{ *pgxpool.Pool }

func (p poolCloser) Close() error { p.Pool.Close(); return nil }

func newAPI(t *testing.T, useSQL bool, opts ...func(*edge.Config)) *api {
	t.Helper()
	pool := pgtest.DB(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE orders (id text PRIMARY KEY, tenant text, item text)`); err != nil {
		t.Fatal(err)
	}
	a := &api{pool: pool, obs: &counts{}}
	// The edge's own pool, wide enough for 32 requests at once.
	pc := pool.Config().Copy()
	pc.MaxConns = 40
	wide, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wide.Close)
	cfg := &edge.Config{Pool: wide, Observer: a.obs, Tenant: func(r *http.Request) string { return r.Header.Get("X-Tenant") }}
	a.edgeDB = poolCloser{wide}
	if useSQL {
		db := stdlib.OpenDBFromPool(wide)
		t.Cleanup(func() { db.Close() })
		cfg.Pool, cfg.DB = nil, db
		a.edgeDB = db
	}
	for _, o := range opts {
		o(cfg)
	}
	e, err := edge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.e = e
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.calls.Add(1)
		if a.hold != nil {
			a.entered <- struct{}{}
			<-a.hold
		}
		ctx := r.Context()
		// The request's transaction, as pgx's or database/sql's.
		var tx interface {
			Exec(context.Context, string, ...any) error
		} = pgxExec{edge.Tx(ctx)}
		var handle any = edge.Tx(ctx)
		if useSQL {
			tx, handle = sqlExec{edge.SQLTx(ctx)}, edge.SQLTx(ctx)
		}
		var req struct{ Item string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		id := e.DomainID(r)
		if id == "" {
			id = fmt.Sprintf("anon-%d", a.calls.Load())
		}
		if err := tx.Exec(ctx, `INSERT INTO orders (id, tenant, item) VALUES ($1, $2, $3)`, id, r.Header.Get("X-Tenant"), req.Item); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := outbox.Enqueue(ctx, handle, outbox.Effect{SourceID: id, Kind: "email.receipt", Payload: map[string]string{"item": req.Item}}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// A handler that ends the middleware's transaction itself.
		switch a.decide.Load() {
		case 3:
			if useSQL {
				_ = edge.SQLTx(ctx).Commit()
			} else {
				_ = edge.Tx(ctx).Commit(ctx)
			}
		case 4:
			if useSQL {
				_ = edge.SQLTx(ctx).Rollback()
			} else {
				_ = edge.Tx(ctx).Rollback(ctx)
			}
		}
		if a.fail.Load() {
			http.Error(w, "upstream failed", http.StatusInternalServerError)
			return
		}
		if status := a.answer.Load(); status != 0 {
			switch a.decide.Load() {
			case 1:
				edge.Commit(ctx)
			case 2:
				edge.Abort(ctx)
			}
			w.WriteHeader(int(status))
			fmt.Fprintf(w, `{"id":%q,"call":%d,"status":%d}`, id, a.calls.Load(), status)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+id)
		w.Header().Set("X-Request-Time", time.Now().String())
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"call":%d}`, id, a.calls.Load())
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Require(create))
	mux.Handle("POST /notes", e.Handler(create))
	mux.Handle("POST /tracked", e.With(edge.Route{IgnoreQuery: true}).Require(create))
	mux.Handle("POST /items/{id}", e.Require(create))
	a.Server = httptest.NewServer(mux)
	t.Cleanup(a.Close)
	return a
}

type pgxExec struct{ tx pgx.Tx }

func (e pgxExec) Exec(ctx context.Context, q string, args ...any) error {
	_, err := e.tx.Exec(ctx, q, args...)
	return err
}

type sqlExec struct{ tx *sql.Tx }

func (e sqlExec) Exec(ctx context.Context, q string, args ...any) error {
	_, err := e.tx.ExecContext(ctx, q, args...)
	return err
}

func (a *api) post(t *testing.T, path, key, tenant, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, a.URL+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set(edge.HeaderKey, key)
	}
	req.Header.Set("X-Tenant", tenant)
	// A bound, so that a request that waits where it must not fails the
	// test rather than hanging it.
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func (a *api) count(t *testing.T, q string) int {
	t.Helper()
	var n int
	if err := a.pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A retry with the key is answered from the record: the same status,
// allow-listed headers and body, marked replayed; the work (a row and an
// effect) was done once, in the transaction that recorded the answer.
func TestEdge_ReplaysTheStoredAnswer(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		first, body := a.post(t, "/orders", "k-1", "acme", `{"item":"mug"}`)
		if first.StatusCode != 201 || first.Header.Get(edge.HeaderReplayed) != "" {
			t.Fatalf("first: %d %s", first.StatusCode, body)
		}
		again, body2 := a.post(t, "/orders", "k-1", "acme", `{"item":"mug"}`)
		if again.StatusCode != 201 || body2 != body || again.Header.Get(edge.HeaderReplayed) != "true" ||
			again.Header.Get("Location") != first.Header.Get("Location") || again.Header.Get("Content-Type") != "application/json" ||
			again.Header.Get("X-Request-Time") != "" {
			t.Fatalf("replay: %d %v %s; first %s", again.StatusCode, again.Header, body2, body)
		}
		if a.calls.Load() != 1 || a.count(t, `SELECT count(*) FROM orders`) != 1 || a.count(t, `SELECT count(*) FROM side_effects`) != 1 {
			t.Errorf("handler ran %d times; orders and effects not once", a.calls.Load())
		}
		// Another tenant's, or another route's, key of the same name is not this one.
		if r, _ := a.post(t, "/orders", "k-1", "globex", `{"item":"mug"}`); r.StatusCode != 201 || r.Header.Get(edge.HeaderReplayed) != "" {
			t.Errorf("another tenant: %d replayed=%q", r.StatusCode, r.Header.Get(edge.HeaderReplayed))
		}
		if r, _ := a.post(t, "/notes", "k-1", "acme", `{"item":"mug"}`); r.StatusCode == 201 && r.Header.Get(edge.HeaderReplayed) != "" {
			t.Errorf("another route replayed the first route's answer")
		}
		if a.obs.replayed != 1 || a.obs.keyed != 4 {
			t.Errorf("observer: %+v", a.obs)
		}
	})
}

func TestEdge_AnotherRequestUnderTheKeyIs422(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		a.post(t, "/orders", "k-2", "acme", `{"item":"mug"}`)
		r, body := a.post(t, "/orders", "k-2", "acme", `{"item":"plate"}`)
		var p map[string]any
		if r.StatusCode != 422 || r.Header.Get("Content-Type") != "application/problem+json" || json.Unmarshal([]byte(body), &p) != nil || p["status"] != float64(422) {
			t.Fatalf("another body: %d %s", r.StatusCode, body)
		}
		if a.calls.Load() != 1 || a.obs.mismatched != 1 {
			t.Errorf("calls %d, mismatches %d", a.calls.Load(), a.obs.mismatched)
		}
	})
}

// The query string is in the fingerprint: the same key with another query
// is another request, refused with 422, unless the route ignores it.
func TestEdge_AnotherQueryUnderTheKeyIs422(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		first, body := a.post(t, "/orders?amount=10", "k-q", "acme", `{"item":"mug"}`)
		if first.StatusCode != 201 {
			t.Fatalf("first: %d %s", first.StatusCode, body)
		}
		if r, b := a.post(t, "/orders?amount=10", "k-q", "acme", `{"item":"mug"}`); r.StatusCode != 201 || b != body || r.Header.Get(edge.HeaderReplayed) != "true" {
			t.Errorf("the same query: %d %s, want the replay", r.StatusCode, b)
		}
		for _, path := range []string{"/orders?amount=999999", "/orders", "/orders?amount=10&amount=999999"} {
			if r, b := a.post(t, path, "k-q", "acme", `{"item":"mug"}`); r.StatusCode != 422 || !strings.Contains(b, "query") {
				t.Errorf("%s under the key: %d %s, want 422", path, r.StatusCode, b)
			}
		}
		// No query the first time, one the second: refused too.
		a.post(t, "/orders", "k-q2", "acme", `{"item":"mug"}`)
		if r, b := a.post(t, "/orders?amount=999999", "k-q2", "acme", `{"item":"mug"}`); r.StatusCode != 422 {
			t.Errorf("a query added under the key: %d %s, want 422", r.StatusCode, b)
		}
		if a.calls.Load() != 2 || a.obs.mismatched != 4 {
			t.Errorf("calls %d, mismatches %d", a.calls.Load(), a.obs.mismatched)
		}

		// A route that ignores the query replays whatever the query.
		first, body = a.post(t, "/tracked?utm=a", "k-t", "acme", `{"item":"cup"}`)
		if first.StatusCode != 201 {
			t.Fatalf("first on /tracked: %d %s", first.StatusCode, body)
		}
		for _, path := range []string{"/tracked?utm=b", "/tracked"} {
			if r, b := a.post(t, path, "k-t", "acme", `{"item":"cup"}`); r.StatusCode != 201 || b != body || r.Header.Get(edge.HeaderReplayed) != "true" {
				t.Errorf("%s on a route ignoring the query: %d %s, want the replay", path, r.StatusCode, b)
			}
		}
		if r, _ := a.post(t, "/tracked?utm=b", "k-t", "acme", `{"item":"plate"}`); r.StatusCode != 422 {
			t.Errorf("another body on a route ignoring the query: %d, want 422", r.StatusCode)
		}
	})
}

// Method, path, query and body are told apart wherever their bytes fall:
// on a route with a path parameter, a NUL in the path (%00) moved into
// the body makes another request, refused with 422, not a replay.
func TestEdge_AFingerprintsPartsAreToldApart(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		first, body := a.post(t, "/items/a%00x", "k-nul", "acme", "y")
		if first.StatusCode != 201 {
			t.Fatalf("first: %d %s", first.StatusCode, body)
		}
		if r, b := a.post(t, "/items/a%00x", "k-nul", "acme", "y"); r.StatusCode != 201 || b != body || r.Header.Get(edge.HeaderReplayed) != "true" {
			t.Errorf("the same request: %d %s, want the replay", r.StatusCode, b)
		}
		for _, c := range []struct{ path, body string }{
			{"/items/a", "x\x00y"},   // the path's tail moved into the body
			{"/items/a%00x%00y", ""}, // the body moved into the path
			{"/items/a%00x?", "y"},   // an empty query is no query
			{"/items/a%00x?q", "y"},  // a query
		} {
			r, b := a.post(t, c.path, "k-nul", "acme", c.body)
			want := 422
			if c.path == "/items/a%00x?" {
				want = 201
			}
			if r.StatusCode != want {
				t.Errorf("%q with body %q under the key: %d %s, want %d", c.path, c.body, r.StatusCode, b, want)
			}
		}
		if a.calls.Load() != 1 {
			t.Errorf("the handler ran %d times, want once", a.calls.Load())
		}
	})
}

// Keys stored by earlier versions, whose fingerprints were made the old
// way (method, path and body joined by NUL; with a query, length-prefixed
// after a version tag), still replay after an upgrade, and another request
// under them is still refused; what this version stores is pinned.
func TestEdge_AKeyStoredByAnEarlierVersionStillReplays(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		ctx := context.Background()
		body := `{"item":"mug"}`
		v1 := sha256.Sum256([]byte("POST\x00/orders\x00" + body))
		v2 := sha256.Sum256([]byte("sidefx-edge-fingerprint/2\x00" + "4:POST\x00" + "7:/orders\x00" + "9:amount=10\x00" + body))
		// The records an earlier version left, their answers stored.
		for key, fp := range map[string][]byte{"k-old": v1[:], "k-old-q": v2[:]} {
			if _, err := a.pool.Exec(ctx, `INSERT INTO sidefx_edge_keys (scope, key, fingerprint, expires_at, status, headers, body, completed_at)
				VALUES ('4:acme POST POST /orders', $1, $2, now() + interval '1 hour', 201, '{"Content-Type": ["application/json"]}', '{"id":"before"}', now())`, key, fp); err != nil {
				t.Fatal(err)
			}
		}
		for key, path := range map[string]string{"k-old": "/orders", "k-old-q": "/orders?amount=10"} {
			r, b := a.post(t, path, key, "acme", body)
			if r.StatusCode != 201 || b != `{"id":"before"}` || r.Header.Get(edge.HeaderReplayed) != "true" {
				t.Errorf("the earlier version's key %s: %d %s, want its replay", key, r.StatusCode, b)
			}
			if r, b := a.post(t, path, key, "acme", `{"item":"cup"}`); r.StatusCode != 422 {
				t.Errorf("another body under the earlier version's key %s: %d %s, want 422", key, r.StatusCode, b)
			}
		}
		if a.calls.Load() != 0 {
			t.Errorf("the handler ran %d times", a.calls.Load())
		}
		// What this version stores: a version byte, then the SHA-256 of
		// its tag and the length-prefixed parts. Pinned: a change would
		// make every stored key answer its retries 422.
		a.post(t, "/orders", "k-new", "acme", body)
		var got []byte
		if err := a.pool.QueryRow(ctx, `SELECT fingerprint FROM sidefx_edge_keys WHERE key = 'k-new'`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := "031eec1cbb7974ee08b08e7b03d67f506f842afc680d992b56040fbaca3cab368e"; hex.EncodeToString(got) != want {
			t.Errorf("the stored fingerprint is %x, want %s", got, want)
		}
	})
}

// A retry while the first request runs is answered 409 at once, with
// Retry-After; once the first finishes, the retry gets its answer.
func TestEdge_InFlightIs409AtOnce(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		a.hold, a.entered = make(chan struct{}), make(chan struct{}, 1)
		done := make(chan int, 1)
		go func() {
			r, _ := a.post(t, "/orders", "k-3", "acme", `{"item":"mug"}`)
			done <- r.StatusCode
		}()
		select {
		case <-a.entered:
		case code := <-done:
			t.Fatalf("the first request ended with %d before its handler ran", code)
		}
		start := time.Now()
		r, body := a.post(t, "/orders", "k-3", "acme", `{"item":"mug"}`)
		if r.StatusCode != 409 || r.Header.Get("Retry-After") == "" || !strings.Contains(body, "in progress") {
			t.Fatalf("in flight: %d %s", r.StatusCode, body)
		}
		if waited := time.Since(start); waited > 5*time.Second {
			t.Errorf("the 409 took %s: it waited for the first request", waited)
		}
		close(a.hold)
		if code := <-done; code != 201 {
			t.Fatalf("first: %d", code)
		}
		a.hold = nil
		if r, _ := a.post(t, "/orders", "k-3", "acme", `{"item":"mug"}`); r.StatusCode != 201 || r.Header.Get(edge.HeaderReplayed) != "true" {
			t.Errorf("after: %d", r.StatusCode)
		}
		if a.calls.Load() != 1 || a.obs.conflict != 1 {
			t.Errorf("calls %d conflicts %d", a.calls.Load(), a.obs.conflict)
		}
	})
}

// 32 requests with one key at once: the work is done once; each other
// request is answered 409 at once (the first in flight) or with the replay
// of its answer; retried, every one gets that same answer.
func TestEdge_32ConcurrentRequestsWithOneKey(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		const n = 32
		type answer struct {
			code     int
			body     string
			replayed bool
			retry    string
			err      error
		}
		post := func() answer {
			req, _ := http.NewRequest(http.MethodPost, a.URL+"/orders", strings.NewReader(`{"item":"lamp"}`))
			req.Header.Set(edge.HeaderKey, "k-32")
			req.Header.Set("X-Tenant", "acme")
			resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
			if err != nil {
				return answer{err: err}
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return answer{resp.StatusCode, string(b), resp.Header.Get(edge.HeaderReplayed) == "true", resp.Header.Get("Retry-After"), err}
		}
		answers := make([]answer, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				answers[i] = post()
			})
		}
		close(start)
		wg.Wait()
		executed, conflicts := "", 0
		for i, ans := range answers {
			switch {
			case ans.err != nil:
				t.Fatalf("request %d: %v", i, ans.err)
			case ans.code == 201 && !ans.replayed:
				if executed != "" {
					t.Fatalf("two requests executed: %s and %s", executed, ans.body)
				}
				executed = ans.body
			case ans.code == 409 && ans.retry != "":
				conflicts++
			case ans.code == 201 && ans.replayed:
			default:
				t.Fatalf("request %d: %d %s", i, ans.code, ans.body)
			}
		}
		if executed == "" {
			t.Fatal("no request executed")
		}
		for i, ans := range answers {
			if ans.code == 201 && ans.body != executed {
				t.Errorf("request %d: %s, want the executed answer %s", i, ans.body, executed)
			}
		}
		for i := range conflicts {
			if ans := post(); ans.code != 201 || !ans.replayed || ans.body != executed {
				t.Errorf("retry %d of a 409: %d %s replayed=%t, want the replay of %s", i, ans.code, ans.body, ans.replayed, executed)
			}
		}
		if a.calls.Load() != 1 || a.count(t, `SELECT count(*) FROM orders`) != 1 || a.count(t, `SELECT count(*) FROM side_effects`) != 1 {
			t.Errorf("the handler ran %d times: %d orders, %d effects; want 1 of each",
				a.calls.Load(), a.count(t, `SELECT count(*) FROM orders`), a.count(t, `SELECT count(*) FROM side_effects`))
		}
		if a.obs.conflict != conflicts {
			t.Errorf("observed %d conflicts, answered %d", a.obs.conflict, conflicts)
		}
	})
}

// A 5xx is not stored: the work rolls back with the key, and a retry
// executes.
func TestEdge_5xxIsNotStored(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		a.fail.Store(true)
		if r, _ := a.post(t, "/orders", "k-4", "acme", `{"item":"mug"}`); r.StatusCode != 500 {
			t.Fatalf("first: %d", r.StatusCode)
		}
		if n := a.count(t, `SELECT count(*) FROM orders`) + a.count(t, `SELECT count(*) FROM side_effects`) + a.count(t, `SELECT count(*) FROM sidefx_edge_keys`); n != 0 {
			t.Fatalf("a 5xx left %d rows", n)
		}
		a.fail.Store(false)
		if r, _ := a.post(t, "/orders", "k-4", "acme", `{"item":"mug"}`); r.StatusCode != 201 || r.Header.Get(edge.HeaderReplayed) != "" {
			t.Fatalf("retry: %d", r.StatusCode)
		}
		if a.calls.Load() != 2 || a.count(t, `SELECT count(*) FROM orders`) != 1 {
			t.Errorf("calls %d", a.calls.Load())
		}
	})
}

func TestEdge_MissingOrBadKey(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		if r, body := a.post(t, "/orders", "", "acme", `{}`); r.StatusCode != 400 || !strings.Contains(body, "Idempotency-Key required") {
			t.Errorf("required route without a key: %d %s", r.StatusCode, body)
		}
		if r, _ := a.post(t, "/notes", "", "acme", `{"item":"note"}`); r.StatusCode != 201 || a.count(t, `SELECT count(*) FROM orders`) != 1 {
			t.Errorf("optional route without a key: %d", r.StatusCode)
		}
		if r, body := a.post(t, "/orders", strings.Repeat("k", 256), "acme", `{}`); r.StatusCode != 400 || !strings.Contains(body, "too long") {
			t.Errorf("a 256-character key: %d %s", r.StatusCode, body)
		}
	})
}

func TestEdge_DomainIDIsDeterministic(t *testing.T) {
	families(t, func(t *testing.T, a *api) {
		req := func(key, tenant string) *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/orders", nil)
			r.Header.Set(edge.HeaderKey, key)
			r.Header.Set("X-Tenant", tenant)
			return r
		}
		one, two, other := a.e.DomainID(req("k", "acme")), a.e.DomainID(req("k", "acme")), a.e.DomainID(req("k", "globex"))
		if one == "" || one != two || one == other || a.e.DomainID(req("", "acme")) != "" {
			t.Errorf("DomainID: %q %q %q", one, two, other)
		}
	})
}

// New refuses a schema without sidefx's tables, and one behind this build,
// saying to run sidefx migrate, on pgx and on database/sql: a service
// deployed before its migrations learns it at start, not from every
// request's 503.
func TestNew_RefusesASchemaNotMigrated(t *testing.T) {
	for _, useSQL := range []bool{false, true} {
		t.Run(map[bool]string{false: "pgx", true: "database-sql"}[useSQL], func(t *testing.T) {
			pool := pgtest.DB(t)
			cfg := func(schema string) *edge.Config {
				if useSQL {
					db := stdlib.OpenDBFromPool(pool)
					t.Cleanup(func() { db.Close() })
					return &edge.Config{DB: db, Schema: schema}
				}
				return &edge.Config{Pool: pool, Schema: schema}
			}
			e, err := edge.New(cfg(""))
			if err != nil {
				t.Fatalf("the migrated schema: %v", err)
			}
			e.Close()
			if _, err := edge.New(cfg("app")); err == nil || err.Error() != "edge: schema app has no sidefx tables: run sidefx migrate" {
				t.Errorf("a schema without sidefx tables: %v", err)
			}
			var latest int
			if err := pool.QueryRow(context.Background(), `DELETE FROM sidefx_migrations WHERE version = (SELECT max(version) FROM sidefx_migrations) RETURNING version`).Scan(&latest); err != nil {
				t.Fatal(err)
			}
			_, err = edge.New(cfg(""))
			if _, ok := errors.AsType[*migrations.SchemaBehindError](err); !ok || !strings.Contains(err.Error(), fmt.Sprintf("lacks migrations [%d]: run sidefx migrate", latest)) {
				t.Errorf("a schema one version behind: %v", err)
			}
		})
	}
}
