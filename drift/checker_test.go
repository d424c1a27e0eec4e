package drift_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

type reports struct {
	mu sync.Mutex
	n  int
}

func (r *reports) Reported(drift.Report) { r.mu.Lock(); r.n++; r.mu.Unlock() }
func (r *reports) count() int            { r.mu.Lock(); defer r.mu.Unlock(); return r.n }

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestChecker_TwoSchedulersOneRunPerTick(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 5, 0)
	var obs [2]reports
	var stops []func()
	for i := range obs {
		c, refused, err := drift.NewChecker(ctx, pool, &drift.Config{Rules: []drift.Rule{receipts}, Schedule: "@every 1s",
			Runner: fmt.Sprintf("replica-%d", i), Logger: quietLog, Observer: &obs[i]})
		if err != nil || len(refused) != 0 {
			t.Fatalf("checker: %v %v", refused, err)
		}
		stops = append(stops, c.Start(ctx))
	}
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var runs int
	for runs < 4 {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM sidefx_drift_runs WHERE finished_at IS NOT NULL`).Scan(&runs); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d runs in 30s", runs)
		}
		<-tick.C
	}
	for _, stop := range stops {
		stop()
	}
	var total, ticks int
	var first, last time.Time
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT tick), min(tick), max(tick) FROM sidefx_drift_runs`).Scan(&total, &ticks, &first, &last); err != nil {
		t.Fatal(err)
	}
	span := int(last.Sub(first)/time.Second) + 1
	if total != ticks || ticks != span {
		t.Fatalf("%d runs for %d ticks over %d seconds: want one run per tick, none skipped", total, ticks, span)
	}
	// A run stop cut short (it had claimed its tick, then its context
	// ended) stays stored unfinished, as a replica that died leaves it,
	// and is never reported: the observers heard of every finished run.
	var finished int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sidefx_drift_runs WHERE finished_at IS NOT NULL`).Scan(&finished); err != nil {
		t.Fatal(err)
	}
	if got := obs[0].count() + obs[1].count(); got != finished || total-finished > len(stops) {
		t.Fatalf("the replicas reported %d runs for %d finished of %d stored", got, finished, total)
	}
	if first.Nanosecond() != 0 {
		t.Fatalf("tick %s is not aligned to the second", first)
	}
}

// receiver records what Alertmanager would be sent.
type receiver struct {
	mu    sync.Mutex
	posts [][]drift.Alert
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var alerts []drift.Alert
	if req.Method != http.MethodPost || json.NewDecoder(req.Body).Decode(&alerts) != nil {
		http.Error(w, "want a JSON array of alerts", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.posts = append(r.posts, alerts)
	r.mu.Unlock()
}

func (r *receiver) last() []drift.Alert {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.posts) == 0 {
		return nil
	}
	return r.posts[len(r.posts)-1]
}

func TestChecker_AlertsFireThenResolve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 5, 0)
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	c, _, err := drift.NewChecker(ctx, pool, &drift.Config{Rules: []drift.Rule{receipts}, AlertURL: srv.URL + "/api/v2/alerts", Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM side_effects WHERE source_id = '3'`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunNow(ctx); err != nil {
		t.Fatal(err)
	}
	fired := rcv.last()
	if len(fired) != 1 {
		t.Fatalf("alerts posted: %+v", fired)
	}
	a := fired[0]
	if a.Labels["alertname"] != "SidefxDriftMissing" || a.Labels["rule"] != receipts.Name || a.Labels["kind"] != "email.receipt" ||
		!a.EndsAt.IsZero() || a.StartsAt.IsZero() || !strings.Contains(a.Annotations["description"], "3") {
		t.Fatalf("firing alert = %+v", a)
	}
	// The receipt comes back: the alert resolves, with the same start.
	if _, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "3", Kind: "email.receipt", Payload: map[string]int{"order": 3}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunNow(ctx); err != nil {
		t.Fatal(err)
	}
	resolved := rcv.last()
	if len(resolved) != 1 || resolved[0].Labels["alertname"] != "SidefxDriftMissing" || resolved[0].EndsAt.IsZero() || !resolved[0].StartsAt.Equal(a.StartsAt) {
		t.Fatalf("resolved alert = %+v", resolved)
	}
	// Nothing firing, nothing to resolve: nothing posted.
	n := len(rcv.posts)
	if _, err := c.RunNow(ctx); err != nil {
		t.Fatal(err)
	}
	if len(rcv.posts) != n {
		t.Fatalf("a clean run posted alerts: %+v", rcv.last())
	}
}

func TestChecker_StoresRunsAndRefusesBrokenRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 4, 0)
	broken := drift.Rule{Name: "broken", Kind: "email.receipt", SQL: `SELECT id FROM no_such_table`}
	c, refused, err := drift.NewChecker(ctx, pool, &drift.Config{Rules: []drift.Rule{broken, receipts}, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if len(refused) != 1 || !strings.Contains(refused["broken"].Error(), "no_such_table") || len(c.Rules()) != 1 {
		t.Fatalf("refused = %v, rules = %v", refused, c.Rules())
	}
	if _, err := pool.Exec(ctx, `DELETE FROM side_effects WHERE source_id IN ('1', '2')`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.RunNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	runs, err := drift.Recent(ctx, pool, "", 10)
	if err != nil || len(runs) != 2 {
		t.Fatalf("recent = %+v, %v", runs, err)
	}
	// The refused rule is in every run, as an error: findings by rule name.
	r := runs[0]
	if r.Finished.IsZero() || !r.Tick.IsZero() || r.Errors != 1 || len(r.Findings) != 2 || r.Stuck == nil {
		t.Fatalf("stored run = %+v", r)
	}
	if f := r.Findings[0]; f.Rule != "broken" || !f.Refused || f.Err == nil || !strings.Contains(f.Err.Error(), "no_such_table") {
		t.Fatalf("refused rule's finding = %+v", f)
	}
	if f := r.Findings[1]; f.Err != nil || f.Missing != 2 || strings.Join(f.MissingIDs, ",") != "1,2" {
		t.Fatalf("good rule's finding = %+v", f)
	}
}

// lastReport keeps the last report a checker made.
type lastReport struct {
	mu  sync.Mutex
	rep drift.Report
}

func (l *lastReport) Reported(rep drift.Report) { l.mu.Lock(); l.rep = rep; l.mu.Unlock() }

// A rule refused at start is an error of every run: in the report the
// observer (metrics) sees, and in the alerts posted.
func TestChecker_RefusedRuleIsAnErrorOfEveryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 2, 0)
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	var obs lastReport
	typo := drift.Rule{Name: "typo", Kind: "email.receipt", SQL: `SELECT id FROM orders WHERE paid_at < :due_befor`}
	c, refused, err := drift.NewChecker(ctx, pool, &drift.Config{Rules: []drift.Rule{receipts, typo},
		AlertURL: srv.URL + "/api/v2/alerts", Logger: quietLog, Observer: &obs})
	if err != nil || len(refused) != 1 || refused["typo"] == nil {
		t.Fatalf("refused = %v, %v", refused, err)
	}
	for range 2 {
		rep, err := c.RunNow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Errors() != 1 || len(rep.Findings) != 2 || !rep.Findings[1].Refused {
			t.Fatalf("report = %+v", rep)
		}
		obs.mu.Lock()
		seen := obs.rep.Errors()
		obs.mu.Unlock()
		if seen != 1 {
			t.Fatalf("the observer saw %d errors, want 1", seen)
		}
		alerts := rcv.last()
		if len(alerts) != 1 || alerts[0].Labels["alertname"] != "SidefxDriftRunErrors" || alerts[0].Labels["rule"] != "typo" ||
			!strings.Contains(alerts[0].Annotations["description"], ":due_befor") {
			t.Fatalf("alerts posted: %+v", alerts)
		}
	}
}

// NULL ids from a rule's SQL are a problem of the rule, stored, logged,
// alerted and counted as an error beside its findings, which stand.
func TestChecker_NullIDsAreAProblemBesideTheFindings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	if _, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "a", Kind: "email.receipt", Payload: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	var obs lastReport
	var logs strings.Builder
	rule := drift.Rule{Name: "with_nulls", Kind: "email.receipt", SQL: `SELECT id FROM (VALUES ('a'), (NULL), ('b'), (NULL), (NULL)) v(id)`}
	c, refused, err := drift.NewChecker(ctx, pool, &drift.Config{Rules: []drift.Rule{rule},
		AlertURL: srv.URL + "/api/v2/alerts", Logger: slog.New(slog.NewTextHandler(&logs, nil)), Observer: &obs})
	if err != nil || len(refused) != 0 {
		t.Fatalf("checker: %v, %v", refused, err)
	}
	if _, err := c.RunNow(ctx); err != nil {
		t.Fatal(err)
	}
	const problem = "the rule's query returned 3 NULL ids: they were left out"
	obs.mu.Lock()
	seen := obs.rep
	obs.mu.Unlock()
	if seen.Errors() != 1 || seen.Findings[0].Problem != problem {
		t.Fatalf("the observer saw %+v", seen)
	}
	runs, err := drift.Recent(ctx, pool, "", 1)
	if err != nil || len(runs) != 1 || len(runs[0].Findings) != 1 {
		t.Fatalf("recent = %+v, %v", runs, err)
	}
	if r, f := runs[0], runs[0].Findings[0]; r.Errors != 1 || f.Err != nil || f.Problem != problem ||
		f.Missing != 1 || strings.Join(f.MissingIDs, ",") != "b" || f.Extra != 0 {
		t.Fatalf("stored run = %+v, finding = %+v", r, f)
	}
	if !strings.Contains(logs.String(), `problem="`+problem+`"`) {
		t.Fatalf("logs lack the problem:\n%s", logs.String())
	}
	names := map[string]drift.Alert{}
	for _, a := range rcv.last() {
		names[a.Labels["alertname"]] = a
	}
	if a, ok := names["SidefxDriftRunErrors"]; !ok || a.Labels["rule"] != rule.Name || !strings.Contains(a.Annotations["description"], problem) {
		t.Fatalf("alerts posted: %+v", rcv.last())
	}
	if _, ok := names["SidefxDriftMissing"]; !ok || len(names) != 2 {
		t.Fatalf("alerts posted: %+v", rcv.last())
	}
}
