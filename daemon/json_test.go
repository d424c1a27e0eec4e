package daemon

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/reconcile"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the commands' output")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./daemon -run TestJSON -update writes it)", err)
	}
	if got != string(want) {
		t.Errorf("the output is not %s (go test ./daemon -run TestJSON -update rewrites it after a deliberate change):\n%s", path, got)
	}
}

// outbox.Enqueued has the names of sidefx's JSON output.
func TestJSON_Enqueued(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal([]outbox.Enqueued{{ID: 42, Key: "sfx1_abc", Inserted: true}, {ID: 43, Key: "sfx1_def"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `[{"id":42,"idempotency_key":"sfx1_abc","inserted":true},{"id":43,"idempotency_key":"sfx1_def","inserted":false}]`; string(b) != want {
		t.Errorf("got %s\nwant %s", b, want)
	}
}

// The CLI's help points to the description of the JSON in
// docs/operations.md, which exists.
func TestJSON_HelpPointsToTheDocs(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "\n## JSON output\n") {
		t.Fatal(`docs/operations.md has no "JSON output" section`)
	}
	var out, errOut strings.Builder
	io := &IO{Out: &out, Err: &errOut, Getenv: func(string) string { return "" }}
	if err := Run(context.Background(), []string{"help"}, io); err != nil || !strings.Contains(out.String(), `"JSON output" in docs/operations.md`) {
		t.Errorf("sidefx help: %v\n%s", err, out.String())
	}
	for _, cmd := range [][]string{{"list"}, {"inspect"}, {"status"}, {"drift", "run"}, {"drift", "list"}, {"reconcile", "run"}, {"reconcile", "list"}} {
		errOut.Reset()
		Run(context.Background(), append(cmd, "-h"), io) //nolint:errcheck // flag.ErrHelp
		if !strings.Contains(errOut.String(), `"JSON output" in docs/operations.md`) {
			t.Errorf("sidefx %s -h does not point to docs/operations.md:\n%s", strings.Join(cmd, " "), errOut.String())
		}
	}
}

// jsonFixture enqueues three effects and brings them where the JSON has
// something to say, with every time fixed:
//
//  1. order-1, email.receipt: pending, no dispatcher serves its kind, the
//     default attempt limit;
//  2. order-2, charge.create: its own max_attempts 3, an unknown outcome,
//     resolved confirmed by an operator, a provider's evidence;
//  3. refund-1, refund.create: failed, its kind served by two dispatchers
//     that allow 7 and 12 attempts, paused.
func jsonFixture(t *testing.T) *cli {
	t.Helper()
	c, pool, _ := newCLI(t)
	ctx := context.Background()
	c.ok("enqueue", "--any-kind", "--source", "order-1", "--kind", "email.receipt", "--payload", `{"to":"a@example.com"}`)
	if out, _, err := c.run(`{"source_id":"order-2","kind":"charge.create","payload":{"amount":1200,"currency":"eur"},"max_attempts":3}`+"\n",
		"enqueue", "--any-kind", "--from", "-"); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, out)
	}
	c.ok("enqueue", "--any-kind", "--source", "refund-1", "--kind", "refund.create", "--payload", `{}`)
	charge := operate(t, c.eng, "charge.create", effects.Uncertain)
	operate(t, c.eng, "refund.create", effects.Failed)
	c.ok("resolve", "2", "--as", "confirmed", "--ref", "ch_1", "--actor", "ops", "--note", "seen in the dashboard")
	at := time.Date(2026, 11, 25, 9, 59, 0, 250000000, time.UTC)
	if _, err := reconcile.Record(ctx, pool, "", charge.ID, charge.Key, "stripe", "lookup", "", providers.Evidence{
		Verdict: providers.Found, Ref: "ch_1", Succeeded: true, Status: "succeeded", At: at, Detail: json.RawMessage(`{"amount":1200}`),
	}); err != nil {
		t.Fatal(err)
	}
	for i, n := range []int{7, 12} {
		if err := c.eng.Beat(ctx, engine.Beat{Worker: []string{"w1", "w2"}[i], Kinds: []string{"refund.create"}, Interval: time.Minute,
			Status: []engine.KindBeat{{Kind: "refund.create", Provider: "stripe", MaxAttempts: n}}}); err != nil {
			t.Fatal(err)
		}
	}
	c.ok("pause", "--kind", "refund.create", "--actor", "ops", "--note", "incident 12", "--any-name")
	// Every time fixed: the effect's id minutes after 10:00, the pending
	// one not due before 2999 (so that nothing pending is overdue).
	for _, q := range []string{
		`UPDATE side_effects SET
			created_at = '2026-11-25T10:00:00.123456Z'::timestamptz + id * interval '1 minute',
			updated_at = '2026-11-25T10:00:30Z'::timestamptz + id * interval '1 minute',
			next_attempt_at = CASE WHEN state = 'pending' THEN '2999-01-01T00:00:00Z' ELSE '2026-11-25T10:00:10Z'::timestamptz + id * interval '1 minute' END,
			fired_at = fired_at - fired_at + '2026-11-25T10:00:20Z'::timestamptz + id * interval '1 minute',
			first_fired_at = first_fired_at - first_fired_at + '2026-11-25T10:00:20Z'::timestamptz + id * interval '1 minute',
			confirmed_at = confirmed_at - confirmed_at + '2026-11-25T10:00:30Z'::timestamptz + id * interval '1 minute',
			lease_until = lease_until - lease_until + '2026-11-25T10:01:20Z'::timestamptz + id * interval '1 minute'`,
		`UPDATE side_effect_events SET at = '2026-11-25T10:05:00Z'`,
		`UPDATE sidefx_evidence SET recorded_at = '2026-11-25T10:04:00Z'`,
		`UPDATE sidefx_pauses SET paused_at = '2026-11-25T10:06:00Z'`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// The JSON of sidefx list, inspect and status is pinned by
// testdata/*.golden, and none of its keys has an uppercase letter (drift
// and reconcile: runjson_test.go).
func TestJSON_Golden(t *testing.T) {
	t.Parallel()
	c := jsonFixture(t)
	list := c.ok("list", "--json")
	golden(t, "list.golden", list)
	var inspect strings.Builder
	for _, id := range []string{"1", "2", "3"} {
		inspect.WriteString(c.ok("inspect", id, "--json"))
	}
	golden(t, "inspect.golden", inspect.String())
	status := c.ok("status", "--json")
	golden(t, "status.golden", status)
	noUpperKeys(t, "list --json", list)
	noUpperKeys(t, "inspect --json", inspect.String())
	noUpperKeys(t, "status --json", status)

	// With a configuration that sets a kind's max_attempts, and no live
	// dispatcher that says otherwise, the configuration's is the limit.
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	doc := "database_url: " + c.url + "\nproviders:\n  mail: {type: sendgrid, api_key_env: SG_KEY}\nkinds:\n  email.receipt: {provider: mail, max_attempts: 9}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var e effects.EffectJSON
	out := c.ok("list", "--config", cfg, "--kind", "email.receipt", "--json")
	if err := json.Unmarshal([]byte(out), &e); err != nil || e.MaxAttempts != 9 || e.MaxAttemptsUpTo != 9 || e.MaxAttemptsSource != effects.LimitConfig {
		t.Errorf("list --config --json: %v\n%s", err, out)
	}
}
