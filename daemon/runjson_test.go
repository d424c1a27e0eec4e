package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/effects"
)

// noUpperKeys fails the test if a key anywhere in the JSON documents of out
// (one or more, one after another) has an uppercase letter: sidefx's JSON
// is snake_case, never Go's field names. The fixtures' own data (payloads,
// details) are lowercase too, so every key is walked.
func noUpperKeys(t *testing.T, name, out string) {
	t.Helper()
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if strings.IndexFunc(k, unicode.IsUpper) >= 0 {
					t.Errorf("%s: key %q at %s has an uppercase letter", name, k, path)
				}
				walk(path+"."+k, x)
			}
		case []any:
			for i, x := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), x)
			}
		}
	}
	dec := json.NewDecoder(strings.NewReader(out))
	n := 0
	for ; ; n++ {
		var v any
		if err := dec.Decode(&v); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		walk("$", v)
	}
	if n == 0 {
		t.Errorf("%s: no JSON", name)
	}
}

// The times and durations a run takes from the clock, in the output of
// drift run and reconcile run: checked for their form, then replaced, so
// that the golden files pin the rest.
var (
	clockTime     = regexp.MustCompile(`("(?:started_at|finished_at)": )("[^"]*"|null)`)
	clockDuration = regexp.MustCompile(`("duration_ms": )([^,\n]*)`)
	timeForm      = regexp.MustCompile(`^"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"$`)
)

// fromClock replaces in out the times and durations of a run made now,
// failing the test for one not in sidefx's form (a time in UTC with six
// fractional digits, whole milliseconds).
func fromClock(t *testing.T, name, out string) string {
	t.Helper()
	out = clockTime.ReplaceAllStringFunc(out, func(m string) string {
		sub := clockTime.FindStringSubmatch(m)
		if !timeForm.MatchString(sub[2]) {
			t.Errorf("%s: %s is not a time in sidefx's form", name, m)
		}
		return sub[1] + `"(now)"`
	})
	return clockDuration.ReplaceAllStringFunc(out, func(m string) string {
		sub := clockDuration.FindStringSubmatch(m)
		if !regexp.MustCompile(`^\d+$`).MatchString(sub[2]) {
			t.Errorf("%s: %s is not whole milliseconds", name, m)
		}
		return sub[1] + `"(ms)"`
	})
}

// execAll runs a fixture's SQL statements.
func execAll(t *testing.T, pool *pgxpool.Pool, qs ...string) {
	t.Helper()
	for _, q := range qs {
		if _, err := pool.Exec(context.Background(), q); err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
	}
}

// The JSON of sidefx drift run and drift list is pinned by
// testdata/drift-*.golden: a rule that finds a missing receipt, a rule
// refused for its SQL (its error's text), stuck effects of three reasons;
// drift list with the run's times fixed, one run scheduled, one by hand.
func TestJSON_GoldenDrift(t *testing.T) {
	t.Parallel()
	c, pool, _ := newCLI(t)
	execAll(t, pool, `CREATE TABLE orders (id text PRIMARY KEY, paid_at timestamptz);
		INSERT INTO orders SELECT 'order-' || i, now() - interval '1 hour' FROM generate_series(1, 3) i`)
	for _, src := range []string{"order-1", "order-2"} {
		c.ok("enqueue", "--any-kind", "--source", src, "--kind", "email.receipt", "--payload", "{}")
	}
	c.ok("enqueue", "--any-kind", "--source", "s", "--kind", "k.uncertain", "--payload", "{}")
	c.ok("enqueue", "--any-kind", "--source", "s", "--kind", "k.failed", "--payload", "{}")
	operate(t, c.eng, "k.uncertain", effects.Uncertain)
	operate(t, c.eng, "k.failed", effects.Failed)
	execAll(t, pool, `UPDATE side_effects SET next_attempt_at = now() - interval '2 hours' WHERE source_id = 'order-1'`)
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	if err := os.WriteFile(cfg, []byte(`providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY}
kinds:
  email.receipt: {provider: mail}
drift:
  rules:
    - name: paid_orders_have_receipts
      kind: email.receipt
      sql: SELECT id FROM orders WHERE paid_at < :due_before AND paid_at >= :window_start
    - name: typo
      kind: email.receipt
      sql: SELECT id FROM orders WHERE paid_at < :due_befor
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var runs []string
	for range 2 {
		// The typo rule fails the run: exit 1, as in text, the JSON written.
		out, _, err := c.run("", "drift", "run", "--config", cfg, "--json")
		if err == nil || err.Error() != "1 rules refused, 0 failed" {
			t.Fatalf("drift run --json of a run with a failed rule: %v, want its failure\n%s", err, out)
		}
		runs = append(runs, out)
	}
	noUpperKeys(t, "drift run --json", runs[0])
	golden(t, "drift-run.golden", fromClock(t, "drift run --json", runs[0]))

	execAll(t, pool, `UPDATE sidefx_drift_runs SET
		started_at = '2026-11-25T10:00:00.123456Z'::timestamptz + id * interval '1 hour',
		finished_at = '2026-11-25T10:00:01.5Z'::timestamptz + id * interval '1 hour',
		tick = CASE WHEN id = 1 THEN '2026-11-25T11:00:00Z'::timestamptz END,
		runner = 'host-' || id`)
	list := c.ok("drift", "list", "--json")
	noUpperKeys(t, "drift list --json", list)
	golden(t, "drift-list.golden", list)
}

// fakeStripe answers GET /v1/charges as Stripe does, with the charges
// listed (created half an hour ago), or with a 400 when broken.
func fakeStripe(t *testing.T, broken bool, charges map[string]string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if broken || r.URL.Path != "/v1/charges" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"type":"invalid_request_error","message":"this account cannot list charges"}}`)
			return
		}
		// Stripe's mark: the provider reads no list without it.
		w.Header().Set("Request-Id", "req_fake")
		created := time.Now().Add(-30 * time.Minute).Unix()
		var data []string
		for _, ref := range []string{"ch_settled", "ch_orphan"} {
			data = append(data, fmt.Sprintf(`{"id":%q,"object":"charge","created":%d,"status":"succeeded","metadata":{"sidefx_key":%q}}`, ref, created, charges[ref]))
		}
		fmt.Fprintf(w, `{"object":"list","url":"/v1/charges","has_more":false,"data":[%s]}`, strings.Join(data, ","))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// The JSON of sidefx reconcile run and reconcile list is pinned by
// testdata/reconcile-*.golden: against a Stripe that lists two charges,
// an uncertain charge it has (settled), one it never got (absent), a
// charge no effect has (extra), a confirmed one it does not list
// (missing); a second provider whose listing fails (error).
func TestJSON_GoldenReconcile(t *testing.T) {
	t.Parallel()
	c, pool, store := newCLI(t)
	c.env = map[string]string{"STRIPE_API_KEY": "sk_test_golden"}
	ctx := context.Background()
	for _, src := range []string{"order-1", "order-2", "order-3"} {
		c.ok("enqueue", "--any-kind", "--source", src, "--kind", "charge.create", "--payload", `{"amount":1200,"currency":"eur"}`)
	}
	var keys []string
	for range 3 {
		keys = append(keys, operate(t, c.eng, "charge.create", effects.Uncertain).Key)
	}
	c.ok("resolve", "3", "--as", "confirmed", "--ref", "ch_gone", "--actor", "ops", "--no-note")
	execAll(t, pool, `UPDATE side_effects SET first_fired_at = now() - interval '1 hour', fired_at = now() - interval '1 hour'`)
	good := fakeStripe(t, false, map[string]string{"ch_settled": keys[0], "ch_orphan": "sfx1_orphan"})
	bad := fakeStripe(t, true, nil)
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	if err := os.WriteFile(cfg, []byte(`providers:
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY, base_url: "`+good.URL+`", consistency_delay: 1m}
  other: {type: stripe, api_key_env: STRIPE_API_KEY, base_url: "`+bad.URL+`", consistency_delay: 1m}
kinds:
  charge.create: {provider: stripe, operation: charges.create}
  payment.create: {provider: other, operation: charges.create}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The failing listing fails the run: exit 1, as in text, the JSON written.
	out, _, err := c.run("", "reconcile", "run", "--config", cfg, "--json")
	if err == nil || err.Error() != "1 lookups or listings failed" {
		t.Fatalf("reconcile run --json of a run with a failed listing: %v, want its failure\n%s", err, out)
	}
	if e, _ := store.Get(ctx, 1); e.State != effects.Confirmed || e.ProviderRef != "ch_settled" {
		t.Errorf("the settled charge: %s %s", e.State, e.ProviderRef)
	}
	noUpperKeys(t, "reconcile run --json", out)
	golden(t, "reconcile-run.golden", fromClock(t, "reconcile run --json", out))

	execAll(t, pool, `UPDATE sidefx_reconcile_runs SET
		started_at = '2026-11-25T10:00:00.123456Z', finished_at = '2026-11-25T10:00:02.25Z', tick = NULL`)
	list := c.ok("reconcile", "list", "--json", "--findings", "3")
	noUpperKeys(t, "reconcile list --json", list)
	golden(t, "reconcile-list.golden", list)
	if !bytes.Contains([]byte(list), []byte(`"error": 1`)) {
		t.Errorf("reconcile list --json does not count the error:\n%s", list)
	}
}
