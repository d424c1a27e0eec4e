package daemon

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/migrations"
	"github.com/sidefx/sidefx/outbox"
)

// cli runs the sidefx command in-process against a database.
type cli struct {
	t   *testing.T
	url string
	env map[string]string // more of the environment (secrets)
	eng *engine.Engine    // the dispatcher's statements, to bring effects into each state
}

func newCLI(t *testing.T) (*cli, *pgxpool.Pool, *engine.Store) {
	t.Helper()
	url := pgtest.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(pool, "")
	if err != nil {
		t.Fatal(err)
	}
	return &cli{t: t, url: url, eng: eng}, pool, store
}

// run runs sidefx args with stdin, returning stdout, stderr and the error.
func (c *cli) run(stdin string, args ...string) (string, string, error) {
	c.t.Helper()
	var out, errOut bytes.Buffer
	env := map[string]string{"SIDEFX_DATABASE_URL": c.url}
	maps.Copy(env, c.env)
	err := Run(context.Background(), args, &IO{In: strings.NewReader(stdin), Out: &out, Err: &errOut, Getenv: func(k string) string { return env[k] }})
	return out.String(), errOut.String(), err
}

func (c *cli) ok(args ...string) string {
	c.t.Helper()
	out, errOut, err := c.run("", args...)
	if err != nil {
		c.t.Fatalf("sidefx %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// refuse runs a command that must fail, and returns its error.
func (c *cli) refuse(args ...string) error {
	c.t.Helper()
	_, _, err := c.run("", args...)
	if err == nil {
		c.t.Fatalf("sidefx %s succeeded; want a refusal", strings.Join(args, " "))
	}
	return err
}

func TestCLI_UsageAndExitCodes(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	io := &IO{Out: &out, Err: &errOut, Getenv: func(string) string { return "" }}
	if err := Run(context.Background(), nil, io); exitCode(err, &errOut) != 2 {
		t.Fatalf("no command: %v", err)
	}
	if err := Run(context.Background(), []string{"frobnicate"}, io); exitCode(err, &errOut) != 2 || !strings.Contains(err.Error(), "frobnicate") {
		t.Fatalf("unknown command: %v", err)
	}
	if err := Run(context.Background(), []string{"status"}, io); exitCode(err, &errOut) != 2 || !strings.Contains(err.Error(), "SIDEFX_DATABASE_URL") {
		t.Fatalf("status without a database: %v", err)
	}
	if err := Run(context.Background(), []string{"help"}, io); err != nil || !strings.Contains(out.String(), "resolve") {
		t.Fatalf("help: %v\n%s", err, out.String())
	}
	// bulk's help is help, not "-h is not an action".
	errOut.Reset()
	if err := Run(context.Background(), []string{"bulk", "-h"}, io); err != nil || !strings.Contains(errOut.String(), "usage: sidefx bulk ACTION") {
		t.Fatalf("bulk -h: %v\n%s", err, errOut.String())
	}
}

func TestCLI_MigrateEnqueueStatusInspect(t *testing.T) {
	t.Parallel()
	c, _, store := newCLI(t)
	if out := c.ok("migrate", "--schema", "opsdemo"); !strings.Contains(out, fmt.Sprintf("now at version %d", migrations.Latest())) {
		t.Fatalf("migrate: %s", out)
	}
	if out := c.ok("migrate", "--schema", "opsdemo"); !strings.Contains(out, "is current") {
		t.Fatalf("migrate again: %s", out)
	}
	out := c.ok("enqueue", "--any-kind", "--source", "order-1", "--kind", "email.receipt", "--payload", `{"to":"a@example.com"}`)
	if !strings.Contains(out, "inserted effect") {
		t.Fatalf("enqueue: %s", out)
	}
	if out := c.ok("enqueue", "--any-kind", "--source", "order-1", "--kind", "email.receipt", "--payload", `{"to":"a@example.com"}`); !strings.Contains(out, "already present") {
		t.Fatalf("enqueue again: %s", out)
	}
	err := c.refuse("enqueue", "--any-kind", "--source", "order-1", "--kind", "email.receipt", "--payload", `{"to":"b@example.com"}`)
	if !errors.Is(err, effects.ErrPayloadMismatch) {
		t.Fatalf("enqueue with another payload: %v", err)
	}
	// A missing flag is named as missing: an absent payload is not "not
	// valid JSON".
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--source", "order-2", "--kind", "email.receipt"}, "--payload is required: the effect's payload, a JSON object ('{}' for none)"},
		{[]string{"--source", "order-2", "--payload", "{}"}, "--kind is required"},
		{[]string{"--kind", "email.receipt", "--payload", "{}"}, "--source is required"},
	} {
		err := c.refuse(append([]string{"enqueue", "--any-kind"}, tc.args...)...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || exitCode(err, &bytes.Buffer{}) != 2 {
			t.Errorf("enqueue %v: %v, want a usage error %q", tc.args, err, tc.want)
		}
	}

	out = c.ok("status")
	if !strings.Contains(out, "email.receipt") || !strings.Contains(out, "pending") {
		t.Fatalf("status: %s", out)
	}
	var st struct {
		Kinds []struct {
			Kind   string           `json:"kind"`
			States map[string]int64 `json:"states"`
		} `json:"kinds"`
	}
	if err := json.Unmarshal([]byte(c.ok("status", "--json")), &st); err != nil || len(st.Kinds) != 1 || st.Kinds[0].States["pending"] != 1 {
		t.Fatalf("status --json: %+v, %v", st, err)
	}

	e, err := store.GetBySource(context.Background(), "order-1", "email.receipt")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"inspect", fmt.Sprint(e.ID)}, {"inspect", e.Key}, {"inspect", "--source", "order-1"}} {
		out := c.ok(args...)
		if !strings.Contains(out, e.Key) || !strings.Contains(out, "pending") || !strings.Contains(out, `"to": "a@example.com"`) {
			t.Fatalf("%v: %s", args, out)
		}
	}
	if err := c.refuse("inspect", "999999"); !errors.Is(err, effects.ErrNotFound) {
		t.Fatalf("inspect a missing effect: %v", err)
	}
	if err := c.refuse("inspect", "not-an-id"); exitCode(err, &bytes.Buffer{}) != 2 {
		t.Fatalf("inspect garbage: %v", err)
	}
}

func TestCLI_EnqueueFromLines(t *testing.T) {
	t.Parallel()
	c, _, store := newCLI(t)
	lines := strings.Join([]string{
		`{"source_id":"o-1","kind":"email.receipt","payload":{"n":1}}`,
		`{"source_id":"o-2","kind":"email.receipt","payload":{"n":2}}`,
		`this is not json`,
		`{"source_id":"o-3","kind":"Email Receipt","payload":{}}`,
		``,
		`{"source_id":"o-1","kind":"email.receipt","payload":{"n":1}}`,
		`{"source_id":"o-2","kind":"email.receipt","payload":{"n":99}}`,
		`{"source_id":"o-4","kind":"email.receipt","payload":[1]}`,
		`{"source_id":"o-5","kind":"email.receipt","payload":{"n":5},"extra":true}`,
		`{"source_id":"o-6","kind":"email.receipt","payload":{"n":6}}`,
	}, "\n")
	path := filepath.Join(t.TempDir(), "effects.jsonl")
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, src := range []struct {
		name, stdin string
		args        []string
	}{
		{"file", "", []string{"enqueue", "--any-kind", "--from", path, "--batch", "3"}},
	} {
		out, _, err := c.run(src.stdin, src.args...)
		if err == nil || !strings.Contains(err.Error(), "5 bad lines") {
			t.Fatalf("%s: err = %v\n%s", src.name, err, out)
		}
		if i1, i3, i10 := strings.Index(out, "line 1:"), strings.Index(out, "line 3:"), strings.Index(out, "line 10:"); i1 > i3 || i3 > i10 {
			t.Fatalf("%s: lines reported out of order:\n%s", src.name, out)
		}
		for _, want := range []string{
			"line 1: inserted", "line 2: inserted", "line 3: error", "line 4: error: invalid effect: kind",
			"line 6: already present", "line 7: error", "payload hash", "line 8: error", "not an object",
			"line 9: error", "line 10: inserted", "3 inserted, 1 already present, 5 bad lines",
		} {
			if !strings.Contains(out, want) {
				t.Fatalf("%s: output lacks %q:\n%s", src.name, want, out)
			}
		}
	}
	got, err := store.StateCounts(context.Background())
	if err != nil || got[effects.Pending] != 3 {
		t.Fatalf("pending effects = %v, %v; want o-1, o-2, o-6", got, err)
	}
	// Standard input works the same.
	out, _, err := c.run(`{"source_id":"o-7","kind":"email.receipt","payload":{}}`+"\n", "enqueue", "--any-kind", "--from", "-")
	if err != nil || !strings.Contains(out, "1 inserted") {
		t.Fatalf("stdin: %v\n%s", err, out)
	}
}

// operate moves the effect of kind through a claim to st.
func operate(t *testing.T, eng *engine.Engine, kind string, st effects.State) *effects.Effect {
	t.Helper()
	ctx := context.Background()
	got, err := eng.Claim(ctx, engine.ClaimParams{Kinds: []string{kind}, Limit: 1, Lease: time.Minute, Worker: "test"})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim %s: %d, %v", kind, len(got), err)
	}
	if _, err := eng.Complete(ctx, []engine.Outcome{{ID: got[0].ID, Attempt: 1, State: st, Error: "provider down"}}); err != nil {
		t.Fatal(err)
	}
	return got[0]
}

func TestCLI_OperatorCommandsAndRefusals(t *testing.T) {
	t.Parallel()
	c, _, store := newCLI(t)
	for _, k := range []string{"k.failed", "k.uncertain", "k.refire", "k.pending"} {
		c.ok("enqueue", "--any-kind", "--source", "s", "--kind", k, "--payload", "{}")
	}
	failed := operate(t, c.eng, "k.failed", effects.Failed)
	unsure := operate(t, c.eng, "k.uncertain", effects.Uncertain)
	refire := operate(t, c.eng, "k.refire", effects.Uncertain)
	pending, _ := store.GetBySource(context.Background(), "s", "k.pending")
	id := func(e *effects.Effect) string { return fmt.Sprint(e.ID) }

	// Refusals: the wrong state, named, and nothing changed.
	for _, args := range [][]string{
		{"retry", id(pending), "--no-note"},
		{"retry", id(unsure), "--no-note"},
		{"resolve", id(failed), "--as", "confirmed", "--no-note"},
		{"resolve", id(pending), "--as", "failed", "--no-note"},
		{"resolve", id(failed), "--refire", "--no-note"},
		{"cancel", id(unsure), "--no-note"},
	} {
		err := c.refuse(args...)
		if !errors.Is(err, effects.ErrWrongState) || !strings.Contains(err.Error(), "it is") {
			t.Errorf("%v: %v, want a wrong-state refusal", args, err)
		}
	}
	// The states wanted read as words.
	if err, want := c.refuse("resolve", id(failed), "--as", "confirmed", "--note", "n"), fmt.Sprintf("resolve effect %d: it is failed, not uncertain", failed.ID); err == nil || err.Error() != want {
		t.Errorf("resolve a failed effect: %v, want %q", err, want)
	}
	for _, args := range [][]string{
		{"resolve", id(unsure)},                                  // neither --as nor --refire
		{"resolve", id(unsure), "--as", "confirmed", "--refire"}, // both
		{"resolve", id(unsure), "--as", "pending", "--note", "n"},
		{"retry", "--note", "n"},
		{"cancel", "--source", "s", "--note", "n"},
	} {
		if err := c.refuse(args...); exitCode(err, &bytes.Buffer{}) != 2 {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}

	if out := c.ok("retry", id(failed), "--attempts", "2", "--note", "provider fixed", "--actor", "ops"); !strings.Contains(out, "now pending") {
		t.Fatalf("retry: %s", out)
	}
	if out := c.ok("resolve", id(unsure), "--as", "confirmed", "--ref", "msg_77", "--note", "seen in the provider's activity"); !strings.Contains(out, "now confirmed") {
		t.Fatalf("resolve: %s", out)
	}
	if out := c.ok("resolve", id(refire), "--refire", "--note", "customer never got it"); !strings.Contains(out, "now pending") || !strings.Contains(out, "duplicate") {
		t.Fatalf("refire: %s", out)
	}
	// The verb says the state: not "cancelled, now cancelled".
	if out, want := c.ok("cancel", "--source", "s", "--kind", "k.pending", "--note", "order voided"), fmt.Sprintf("effect %d (k.pending s): cancelled\n", pending.ID); out != want {
		t.Fatalf("cancel: %q, want %q", out, want)
	}
	// Each action is in the effect's history, with who and why.
	out := c.ok("inspect", id(unsure))
	for _, want := range []string{"confirmed", "msg_77", "resolve uncertain → confirmed", "seen in the provider's activity", "sidefx cli"} {
		if !strings.Contains(out, want) {
			t.Fatalf("inspect after resolve lacks %q:\n%s", want, out)
		}
	}
	if out := c.ok("inspect", id(failed)); !strings.Contains(out, "retry failed → pending by ops: provider fixed") {
		t.Fatalf("inspect after retry:\n%s", out)
	}
}

// An effect whose answer was lost may have been performed: sidefx cancel
// refuses it and says why; past its provider's key window, a refire needs
// --past-key-window.
func TestCLI_MaybePerformedAndKeyWindow(t *testing.T) {
	t.Parallel()
	c, pool, _ := newCLI(t)
	ctx := context.Background()
	c.ok("enqueue", "--any-kind", "--source", "o1", "--kind", "charge.create", "--payload", `{"amount": 1}`)
	got, err := c.eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"charge.create"}, Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %v, %v", got, err)
	}
	id := fmt.Sprint(got[0].ID)
	if _, err := c.eng.Complete(ctx, []engine.Outcome{{ID: got[0].ID, Attempt: 1, State: effects.Pending,
		MaybePerformed: true, RetryIn: time.Hour, Error: "attempt 1 of 25: unknown: timeout"}}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"cancel", id, "--note", "n"}, {"cancel", "--source", "o1", "--kind", "charge.create", "--no-note"}} {
		err := c.refuse(args...)
		if !errors.Is(err, effects.ErrMaybePerformed) || !strings.Contains(err.Error(), "may have been performed") ||
			!strings.Contains(err.Error(), "attempt 1 reached the provider without a definite answer") {
			t.Fatalf("sidefx %v: %v", args, err)
		}
	}
	if out := c.ok("inspect", id); !strings.Contains(out, "maybe: attempt 1 reached the provider") ||
		!strings.Contains(out, "why pending      waiting for a dispatcher: no live dispatcher serves charge.create") {
		t.Fatalf("inspect:\n%s", out)
	}
	if err := c.eng.Heartbeat(ctx, "w", []string{"charge.create"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("inspect", id); !strings.Contains(out, "backing off after attempt 1: next attempt at") {
		t.Fatalf("inspect with a dispatcher:\n%s", out)
	}

	// Uncertain, and first fired 25 hours ago: past Stripe's window.
	if _, err := pool.Exec(ctx, `UPDATE side_effects SET state = 'uncertain', first_fired_at = now() - interval '25 hours' WHERE id = $1`, got[0].ID); err != nil {
		t.Fatal(err)
	}
	err = c.refuse("resolve", id, "--refire", "--note", "nothing at Stripe")
	if !errors.Is(err, effects.ErrPastKeyWindow) || !strings.Contains(err.Error(), "forgets keys after 24h0m0s") {
		t.Fatalf("refire past the window: %v", err)
	}
	if out := c.ok("resolve", id, "--refire", "--past-key-window", "--note", "nothing at Stripe"); !strings.Contains(out, "now pending") {
		t.Fatalf("refire with --past-key-window: %s", out)
	}
	// The history says the window started again, which, and who logged in.
	if out := c.ok("inspect", id); !strings.Contains(out, "[past the key window of 24h0m0s: window and key epoch started again] [login ") {
		t.Fatalf("inspect after a refire past the window: %s", out)
	}
}

// A kind nothing serves is refused by sidefx enqueue, unless --any-kind;
// status names the pending effects no live dispatcher serves.
func TestCLI_UnservedKinds(t *testing.T) {
	t.Parallel()
	c, _, _ := newCLI(t)
	ctx := context.Background()
	err := c.refuse("enqueue", "--source", "o1", "--kind", "pager.page", "--payload", `{}`)
	if !errors.Is(err, effects.ErrUnknownKind) || !strings.Contains(err.Error(), `kind "pager.page" is not one of the kinds a live dispatcher serves (none)`) ||
		!strings.Contains(err.Error(), "give --any-kind to enqueue it anyway") {
		t.Fatalf("enqueue of an unserved kind: %v", err)
	}
	c.ok("enqueue", "--any-kind", "--source", "o1", "--kind", "pager.page", "--payload", `{}`)
	if err := c.eng.Heartbeat(ctx, "w", []string{"charge.create"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	c.ok("enqueue", "--source", "o2", "--kind", "charge.create", "--payload", `{}`)

	// With a configuration, its kinds are the known ones.
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	doc := "database_url: " + c.url + "\nproviders:\n  mail: {type: sendgrid, api_key_env: SG_KEY}\nkinds:\n  email.receipt: {provider: mail}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.refuse("enqueue", "--config", cfg, "--source", "o3", "--kind", "charge.create", "--payload", `{}`); !strings.Contains(err.Error(), "known kinds (email.receipt)") {
		t.Fatalf("enqueue of a kind the configuration lacks: %v", err)
	}

	out := c.ok("status")
	if !strings.Contains(out, "1 pending pager.page effects wait for a dispatcher: no live dispatcher serves pager.page") || strings.Contains(out, "charge.create effects wait") {
		t.Fatalf("status:\n%s", out)
	}
	// What to do depends on why: a kind never served is added to a
	// daemon's configuration (or is a typo of a known one); a kind a
	// dispatcher served before, or the configuration has, wants its daemon
	// started.
	if !strings.Contains(out, "Add the kind to a daemon's configuration, or check its spelling.") {
		t.Errorf("status of a kind never served:\n%s", out)
	}
	if err := c.eng.RegisterKinds(ctx, engine.Beat{Kinds: []string{"pager.page"}}); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("status"); !strings.Contains(out, "A dispatcher served it before: start the daemon that serves it") {
		t.Errorf("status of a kind served before:\n%s", out)
	}
	cfgPager := filepath.Join(t.TempDir(), "pager.yaml")
	if err := os.WriteFile(cfgPager, []byte("database_url: "+c.url+"\nproviders:\n  hooks: {type: webhook, url: \"http://127.0.0.1:1/h\", secret_env: HOOK_SECRET}\nkinds:\n  pager.page: {provider: hooks}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.env = map[string]string{"HOOK_SECRET": "whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw=="}
	if out := c.ok("status", "--config", cfgPager); !strings.Contains(out, "The configuration serves it: start sidefx run with it") {
		t.Errorf("status of a configured kind:\n%s", out)
	}
	var st struct {
		Unserved map[string]int64 `json:"unserved_pending"`
	}
	if err := json.Unmarshal([]byte(c.ok("status", "--json")), &st); err != nil || st.Unserved["pager.page"] != 1 || len(st.Unserved) != 1 {
		t.Fatalf("status --json: %+v, %v", st, err)
	}
}

// With a configuration, sidefx enqueue checks a payload as the kind's
// provider would before sending it: a misspelled Stripe parameter or a mail
// without a recipient is refused at once, naming the problem.
func TestCLI_EnqueueChecksPayloads(t *testing.T) {
	t.Parallel()
	c, pool, _ := newCLI(t)
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	doc := "database_url: " + c.url + `
providers:
  stripe: {type: stripe, api_key_env: STRIPE_KEY}
  mail: {type: sendgrid, api_key_env: SG_KEY}
  partner: {type: webhook, url: "https://partner.example/hooks", secret_env: HOOK_SECRET}
kinds:
  charge.create: {provider: stripe, operation: charges.create}
  email.receipt: {provider: mail}
  webhook.paid: {provider: partner}
`
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	err := c.refuse("enqueue", "--config", cfg, "--source", "o1", "--kind", "charge.create", "--payload", `{"ammount": 100, "currency": "usd"}`)
	if !errors.Is(err, effects.ErrInvalid) || !strings.Contains(err.Error(), "ammount") {
		t.Fatalf("a misspelled Stripe parameter: %v", err)
	}
	err = c.refuse("enqueue", "--config", cfg, "--source", "o1", "--kind", "email.receipt", "--payload", `{"subject": "hi"}`)
	if !errors.Is(err, effects.ErrInvalid) || !strings.Contains(err.Error(), "email.receipt") {
		t.Fatalf("a mail body without recipients: %v", err)
	}
	c.ok("enqueue", "--config", cfg, "--source", "o1", "--kind", "charge.create", "--payload", `{"amount": 100, "currency": "usd", "source": "tok_visa"}`)
	c.ok("enqueue", "--config", cfg, "--source", "o1", "--kind", "webhook.paid", "--payload", `{"anything": true}`)
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM side_effects`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d effects stored, want the 2 good ones: %v", n, err)
	}
}

// sidefx supersede replaces a failed effect's payload under a new key,
// checks the correction against the provider's parameters first, shows the
// revision in inspect, and refuses an effect that may have been performed.
func TestCLI_Supersede(t *testing.T) {
	t.Parallel()
	c, _, store := newCLI(t)
	ctx := context.Background()
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	doc := "database_url: " + c.url + `
providers:
  stripe: {type: stripe, api_key_env: STRIPE_KEY}
kinds:
  charge.create: {provider: stripe, operation: charges.create}
`
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	c.ok("enqueue", "--any-kind", "--source", "o1", "--kind", "charge.create", "--payload", `{"amount": 100, "currency": "usd", "source": "tok_chargeDeclined"}`)
	c.ok("enqueue", "--any-kind", "--source", "o2", "--kind", "charge.create", "--payload", `{"amount": 200, "currency": "usd", "source": "tok_visa"}`)
	got, err := c.eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"charge.create"}, Limit: 2, Lease: time.Minute, Worker: "w"})
	if err != nil || len(got) != 2 {
		t.Fatalf("claim: %v, %v", got, err)
	}
	declined, lost := got[0], got[1]
	if declined.SourceID != "o1" {
		declined, lost = lost, declined
	}
	if _, err := c.eng.Complete(ctx, []engine.Outcome{
		{ID: declined.ID, Attempt: 1, State: effects.Failed, Settles: true, Error: "rejected: card_declined"},
		{ID: lost.ID, Attempt: 1, State: effects.Pending, MaybePerformed: true, RetryIn: time.Hour, Error: "unknown: timeout"},
	}); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprint(declined.ID)

	if err := c.refuse("supersede", id, "--note", "n"); !strings.Contains(err.Error(), "--payload") {
		t.Fatalf("no payload: %v", err)
	}
	// The correction is checked as Stripe would check it.
	err = c.refuse("supersede", "--config", cfg, id, "--payload", `{"amount": 100, "currency": "usd", "sourse": "tok_visa"}`, "--note", "n")
	if !errors.Is(err, effects.ErrInvalid) || !strings.Contains(err.Error(), "sourse") {
		t.Fatalf("a misspelled correction: %v", err)
	}
	if e, _ := store.Get(ctx, declined.ID); e.Revision != 0 || e.State != effects.Failed {
		t.Fatalf("a refused correction changed the effect: %+v", e)
	}
	err = c.refuse("supersede", fmt.Sprint(lost.ID), "--payload", `{"amount": 1}`, "--note", "n")
	if !errors.Is(err, effects.ErrMaybePerformed) || !strings.Contains(err.Error(), "attempt 1 reached the provider") {
		t.Fatalf("supersede what may have been performed: %v", err)
	}

	payload := filepath.Join(t.TempDir(), "fixed.json")
	if err := os.WriteFile(payload, []byte(`{"amount": 100, "currency": "usd", "source": "tok_visa"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := c.ok("supersede", "--config", cfg, id, "--payload-file", payload, "--actor", "ops@host", "--note", "another card")
	newKey := derive.Revision(declined.Key, 1)
	if !strings.Contains(out, "superseded (revision 1, key "+newKey+" replaces "+declined.Key+"; payload hash ") || !strings.Contains(out, "now pending") {
		t.Fatalf("supersede said:\n%s", out)
	}
	out = c.ok("inspect", newKey)
	for _, want := range []string{"(revision 1: superseded", "supersede failed → pending by ops@host key " + declined.Key + " → " + newKey, ": another card", `"tok_visa"`} {
		if !strings.Contains(out, want) {
			t.Fatalf("inspect lacks %q:\n%s", want, out)
		}
	}
	// The producer's event replayed: a duplicate, under the new key.
	if out := c.ok("enqueue", "--any-kind", "--source", "o1", "--kind", "charge.create", "--payload", `{"amount": 100, "currency": "usd", "source": "tok_chargeDeclined"}`); !strings.Contains(out, "already present: effect "+id+" key "+newKey) {
		t.Fatalf("replay of the old payload: %s", out)
	}
}

// sidefx supersede --expect-hash corrects the payload inspect showed: an
// operator who read the effect before another corrected it is refused,
// naming both versions, and changes nothing.
func TestCLI_SupersedeRefusesAStaleExpectedHash(t *testing.T) {
	t.Parallel()
	c, _, store := newCLI(t)
	ctx := context.Background()
	c.ok("enqueue", "--any-kind", "--source", "o1", "--kind", "email.receipt", "--payload", `{"template": "old"}`)
	e, err := store.GetBySource(ctx, "o1", "email.receipt")
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprint(e.ID)
	m := regexp.MustCompile(`payload hash\s+([0-9a-f]{64}) `).FindStringSubmatch(c.ok("inspect", id))
	if m == nil || m[1] != hex.EncodeToString(e.PayloadHash) {
		t.Fatalf("inspect shows no payload hash, or another: %v", m)
	}
	seen := m[1]
	if out := c.ok("inspect", "--json", id); !strings.Contains(out, `"payload_hash": "`+seen+`"`) {
		t.Fatalf("inspect --json lacks the payload hash in hex:\n%s", out)
	}
	// Two operators saw the same payload; the first corrects it.
	c.ok("supersede", id, "--expect-hash", seen, "--payload", `{"template": "new"}`, "--actor", "first", "--note", "renamed")
	first, err := store.Get(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	err = c.refuse("supersede", id, "--expect-hash", seen, "--payload", `{"template": "newer"}`, "--actor", "second", "--note", "renamed")
	if !errors.Is(err, effects.ErrChanged) || !strings.Contains(err.Error(), "its payload hash is "+hex.EncodeToString(first.PayloadHash)+", not "+seen) {
		t.Fatalf("a stale --expect-hash: %v, want ErrChanged naming the hash expected", err)
	}
	if after, _ := store.Get(ctx, e.ID); after.Revision != 1 || !strings.Contains(string(after.Payload), `"new"`) {
		t.Fatalf("after the refusal: %s (revision %d), want the first correction", after.Payload, after.Revision)
	}
	if err := c.refuse("supersede", id, "--expect-hash", "abc", "--payload", `{"template": "x"}`, "--note", "n"); !strings.Contains(err.Error(), "--expect-hash") {
		t.Fatalf("a malformed hash: %v", err)
	}
}

// sidefx version (and --version) says the build's version and schema
// version, and the database's when one is given: current, behind, or
// without sidefx's tables.
func TestCLI_Version(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := Run(context.Background(), []string{"--version"}, &IO{Out: &out, Err: &out, Getenv: func(string) string { return "" }}); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.HasPrefix(s, "sidefx ") || !strings.Contains(s, fmt.Sprintf("schema version %d (", migrations.Latest())) || strings.Contains(s, "database:") {
		t.Fatalf("sidefx --version without a database:\n%s", s)
	}
	c, pool, _ := newCLI(t)
	if s := c.ok("version"); !strings.Contains(s, fmt.Sprintf("database: schema public at version %d, current", migrations.Latest())) {
		t.Fatalf("sidefx version with a migrated database:\n%s", s)
	}
	if _, err := pool.Exec(context.Background(), "CREATE SCHEMA bare"); err != nil {
		t.Fatal(err)
	}
	// A test binary is never stamped: the version line says how to stamp one.
	if s := c.ok("version"); Version() == "dev" && !strings.Contains(s, "go build -buildvcs=true ./cmd/sidefx") {
		t.Errorf("version of an unstamped build does not say how to stamp one:\n%s", s)
	}
	if s := c.ok("version", "--schema", "bare"); !strings.Contains(s, "database: schema bare has no sidefx tables: run sidefx migrate") {
		t.Fatalf("sidefx version on a bare schema:\n%s", s)
	}
}

// sidefx list: filters, paging and JSON; a state that is not one is a
// usage error naming the states.
func TestCLI_List(t *testing.T) {
	t.Parallel()
	c, _, _ := newCLI(t)
	for i := range 5 {
		c.ok("enqueue", "--any-kind", "--source", fmt.Sprintf("order-%d", i), "--kind", "email.receipt", "--payload", "{}")
	}
	c.ok("enqueue", "--any-kind", "--source", "refund-1", "--kind", "refund.create", "--payload", "{}")
	u1 := operate(t, c.eng, "email.receipt", effects.Uncertain)
	u2 := operate(t, c.eng, "email.receipt", effects.Uncertain)
	out := c.ok("list", "--state", "uncertain")
	if !strings.Contains(out, fmt.Sprintf("%d ", u1.ID)) || !strings.Contains(out, fmt.Sprintf("%d ", u2.ID)) || !strings.Contains(out, "2 shown of 2 matching") || strings.Contains(out, "refund") {
		t.Fatalf("list --state uncertain:\n%s", out)
	}
	if out := c.ok("list", "--source-prefix", "refund-"); !strings.Contains(out, "refund.create") || !strings.Contains(out, "1 shown of 1 matching") {
		t.Fatalf("list --source-prefix refund-:\n%s", out)
	}
	first := c.ok("list", "--kind", "email.receipt", "--limit", "2")
	if !strings.Contains(first, "2 shown of 5 matching; next page: --after ") {
		t.Fatalf("first page:\n%s", first)
	}
	after := first[strings.LastIndex(first, "--after ")+len("--after "):]
	after = strings.TrimSpace(after)
	second := c.ok("list", "--kind", "email.receipt", "--limit", "2", "--after", after)
	var ids []int
	for _, l := range strings.Split(strings.TrimSpace(second), "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[1] == "email.receipt" {
			ids = append(ids, mustAtoi(t, f[0]))
		}
	}
	if !strings.Contains(second, "2 shown of 5 matching") || len(ids) != 2 || ids[0] <= mustAtoi(t, after) {
		t.Fatalf("second page after %s:\n%s", after, second)
	}
	js := c.ok("list", "--state", "pending", "--kind", "email.receipt", "--json")
	lines := strings.Split(strings.TrimSpace(js), "\n")
	var e effects.EffectJSON
	if len(lines) != 3 || json.Unmarshal([]byte(lines[0]), &e) != nil || e.State != effects.Pending || e.SourceID == "" {
		t.Fatalf("list --json:\n%s", js)
	}
	if out := c.ok("list", "--created-after", "1h", "--created-before", "2999-01-01T00:00:00Z", "--kind", "refund.create"); !strings.Contains(out, "1 shown of 1") {
		t.Fatalf("list with a created span:\n%s", out)
	}
	if err := c.refuse("list", "--state", "lost"); !strings.Contains(err.Error(), `--state "lost" is not a state (want pending`) {
		t.Fatalf("a state that is not one: %v", err)
	}
	if err := c.refuse("list", "--due-before", "yesterday"); !strings.Contains(err.Error(), "RFC 3339") {
		t.Fatalf("a bad time: %v", err)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// sidefx bulk: a preview without --yes, a refusal over --max, then the
// action on every matching effect with one history entry each.
func TestCLI_Bulk(t *testing.T) {
	t.Parallel()
	c, _, store := newCLI(t)
	ctx := context.Background()
	for i := range 4 {
		c.ok("enqueue", "--any-kind", "--source", fmt.Sprintf("order-%d", i), "--kind", "email.receipt", "--payload", "{}")
	}
	var ids []int64
	for range 3 {
		ids = append(ids, operate(t, c.eng, "email.receipt", effects.Uncertain).ID)
	}
	// A preview needs no note; the action does.
	out := c.ok("bulk", "resolve", "--as", "confirmed", "--kind", "email.receipt")
	if !strings.Contains(out, "3 uncertain effects match (cap 100); the first 3:") || !strings.Contains(out, "nothing done: add --yes and --note WHY to resolve these 3 effects") {
		t.Fatalf("preview:\n%s", out)
	}
	if err := c.refuse("bulk", "resolve", "--as", "confirmed", "--kind", "email.receipt", "--yes"); err == nil || !strings.Contains(err.Error(), "needs --note") {
		t.Fatalf("bulk --yes without a note: %v", err)
	}
	if e, _ := store.Get(ctx, ids[0]); e.State != effects.Uncertain {
		t.Fatalf("the preview changed effect %d: %s", ids[0], e.State)
	}
	if err := c.refuse("bulk", "resolve", "--as", "confirmed", "--kind", "email.receipt", "--note", "x", "--max", "2", "--yes"); !strings.Contains(err.Error(), "more than --max 2") {
		t.Fatalf("over the cap: %v", err)
	}
	if err := c.refuse("bulk", "resolve", "--as", "confirmed", "--yes"); !strings.Contains(err.Error(), "--note") {
		t.Fatalf("without a note: %v", err)
	}
	if err := c.refuse("bulk", "resolve", "--note", "x"); !strings.Contains(err.Error(), "--as confirmed") {
		t.Fatalf("resolve without --as: %v", err)
	}
	out = c.ok("bulk", "resolve", "--as", "confirmed", "--kind", "email.receipt", "--note", "seen in SendGrid's activity", "--actor", "ops@example", "--yes")
	if !strings.Contains(out, "resolve: 3 done, 0 skipped") {
		t.Fatalf("apply:\n%s", out)
	}
	for _, id := range ids {
		e, _ := store.Get(ctx, id)
		h, _ := store.History(ctx, id)
		if e.State != effects.Confirmed || len(h) != 1 || h[0].Actor != "ops@example" || h[0].Note != "seen in SendGrid's activity" {
			t.Errorf("effect %d: %s, history %+v", id, e.State, h)
		}
	}
	// A settled effect has no next attempt to show.
	if out := c.ok("inspect", fmt.Sprint(ids[0])); strings.Contains(out, "next attempt") {
		t.Errorf("inspect of a confirmed effect shows a next attempt:\n%s", out)
	}
	if out := c.ok("bulk", "cancel", "--source-prefix", "order-", "--note", "the orders were voided", "--yes"); !strings.Contains(out, "cancel: 1 done") {
		t.Fatalf("bulk cancel:\n%s", out)
	}
}

// sidefx pause and resume: a note required, shown by status (text and
// JSON) while paused, resume of what is not paused refused.
func TestCLI_PauseResume(t *testing.T) {
	t.Parallel()
	c, pool, store := newCLI(t)
	// What the dispatchers recorded: the names a pause may take.
	if _, err := pool.Exec(context.Background(), `INSERT INTO sidefx_kinds (kind, provider) VALUES ('email.receipt', 'sendgrid'), ('charge.create', 'stripe')`); err != nil {
		t.Fatal(err)
	}
	// A typo pauses nothing: refused, naming the close ones.
	for _, args := range [][]string{
		{"pause", "--provider", "sendgird", "--note", "incident"},
		{"pause", "--kind", "email.reciept", "--note", "incident"},
	} {
		err := c.refuse(args...)
		if err == nil || !strings.Contains(err.Error(), "is not one the configuration, the dispatchers or a pending effect knows (did you mean") ||
			!strings.Contains(err.Error(), "--any-name") {
			t.Errorf("%v: %v", args, err)
		}
	}
	if ps, _ := store.Pauses(context.Background()); len(ps) != 0 {
		t.Fatalf("a refused pause paused %+v", ps)
	}
	if out := c.ok("pause", "--kind", "not.yet.deployed", "--note", "before its first run", "--any-name"); !strings.Contains(out, "kind not.yet.deployed paused") {
		t.Fatalf("pause --any-name:\n%s", out)
	}
	c.ok("resume", "--kind", "not.yet.deployed", "--note", "x")
	if err := c.refuse("resume", "--provider", "sendgird", "--note", "x"); err == nil || !strings.Contains(err.Error(), "provider sendgird is not paused") {
		t.Errorf("resume of a typo: %v", err)
	}
	if err := c.refuse("pause", "--provider", "sendgrid"); !strings.Contains(err.Error(), "--note") {
		t.Fatalf("pause without a note: %v", err)
	}
	if err := c.refuse("pause", "--note", "x"); !strings.Contains(err.Error(), "--kind KIND or --provider NAME") {
		t.Fatalf("pause of nothing: %v", err)
	}
	if err := c.refuse("pause", "--kind", "email.receipt", "--provider", "sendgrid", "--note", "x"); !strings.Contains(err.Error(), "not both") {
		t.Fatalf("pause of a kind and a provider at once: %v", err)
	}
	// A filter's kind typo is no empty result: list and bulk refuse it,
	// naming the close ones; a known kind with nothing matching is one.
	for _, args := range [][]string{{"list", "--kind", "email.reciept"}, {"list", "--kind", "email.reciept", "--json"},
		{"bulk", "retry", "--kind", "email.reciept", "--note", "x"}} {
		if err := c.refuse(args...); !strings.Contains(err.Error(), "kind email.reciept: no effect has it") || !strings.Contains(err.Error(), "did you mean email.receipt") {
			t.Errorf("%v: %v", args, err)
		}
	}
	if err := c.refuse("list", "--kind", "Bad.Kind"); !strings.Contains(err.Error(), "is not lowercase words") {
		t.Errorf("list of a kind no effect can have: %v", err)
	}
	if err := c.refuse("pause", "--kind", "NO.such", "--note", "x", "--any-name"); !strings.Contains(err.Error(), "is not lowercase words") {
		t.Errorf("pause --any-name of a kind no effect can have: %v", err)
	}
	if out := c.ok("list", "--kind", "email.receipt"); !strings.Contains(out, "no effects match") {
		t.Errorf("list of a known kind without effects:\n%s", out)
	}
	if out := c.ok("pause", "--provider", "sendgrid", "--note", "SendGrid's incident 4711", "--actor", "ops@example"); !strings.Contains(out, "provider sendgrid paused") {
		t.Fatalf("pause:\n%s", out)
	}
	if out := c.ok("pause", "--provider", "sendgrid", "--note", "again"); !strings.Contains(out, "was paused already") {
		t.Fatalf("a second pause:\n%s", out)
	}
	if out := c.ok("status"); !strings.Contains(out, "provider sendgrid is paused since") || !strings.Contains(out, "by ops@example (SendGrid's incident 4711)") {
		t.Fatalf("status:\n%s", out)
	}
	var st struct {
		Paused []struct{ Scope, Name, Actor string }
	}
	if err := json.Unmarshal([]byte(c.ok("status", "--json")), &st); err != nil || len(st.Paused) != 1 || st.Paused[0].Name != "sendgrid" || st.Paused[0].Scope != "provider" {
		t.Fatalf("status --json paused: %+v, %v", st.Paused, err)
	}
	c.ok("enqueue", "--any-kind", "--source", "o-1", "--kind", "email.receipt", "--payload", "{}")
	if _, err := store.SetPause(context.Background(), effects.PauseKind, "email.receipt", true, effects.By{Actor: "ops", Note: "template broken"}); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("inspect", "--source", "o-1"); !strings.Contains(out, "its kind email.receipt is paused since") || !strings.Contains(out, "(template broken): sidefx resume --kind email.receipt") {
		t.Fatalf("inspect of a paused kind's effect:\n%s", out)
	}
	c.ok("resume", "--kind", "email.receipt", "--note", "fixed")
	if out := c.ok("resume", "--provider", "sendgrid", "--note", "resolved"); !strings.Contains(out, "provider sendgrid resumed") {
		t.Fatalf("resume:\n%s", out)
	}
	if ps, _ := store.Pauses(context.Background()); len(ps) != 0 {
		t.Fatalf("pauses after the resume: %+v", ps)
	}
	if err := c.refuse("resume", "--kind", "email.receipt", "--note", "x"); !strings.Contains(err.Error(), "kind email.receipt is not paused") {
		t.Fatalf("resume of what is not paused: %v", err)
	}
}

// sidefx inspect says how many attempts an effect may make: its own
// max_attempts, else its kind's as the live dispatchers or the
// configuration have it, else the default, never "the kind's policy".
func TestCLI_InspectSaysMaxAttempts(t *testing.T) {
	t.Parallel()
	c, _, _ := newCLI(t)
	ctx := context.Background()
	c.ok("enqueue", "--any-kind", "--source", "o1", "--kind", "email.receipt", "--payload", `{}`)
	out, _, err := c.run(`{"source_id":"o2","kind":"email.receipt","payload":{},"max_attempts":3}`+"\n", "enqueue", "--any-kind", "--from", "-")
	if err != nil {
		t.Fatalf("enqueue: %v\n%s", err, out)
	}
	attempts := func(args ...string) string {
		t.Helper()
		for l := range strings.Lines(c.ok(append([]string{"inspect"}, args...)...)) {
			if rest, ok := strings.CutPrefix(l, "attempts"); ok {
				return strings.TrimSpace(rest)
			}
		}
		t.Fatalf("inspect %v shows no attempts", args)
		return ""
	}
	check := func(got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("attempts %q, want %q", got, want)
		}
	}
	// Nothing says: the default.
	check(attempts("--source", "o1", "--kind", "email.receipt"), fmt.Sprintf("0 of %d (the default)", dispatcher.DefaultMaxAttempts))
	check(attempts("--source", "o2", "--kind", "email.receipt"), "0 of 3")

	// The configuration says.
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	doc := "database_url: " + c.url + "\nproviders:\n  mail: {type: sendgrid, api_key_env: SG_KEY}\nkinds:\n  email.receipt: {provider: mail, max_attempts: 9}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	check(attempts("--config", cfg, "--source", "o1", "--kind", "email.receipt"), "0 of 9 (the kind's, in the configuration)")

	// The live dispatchers say, and they win: they decide.
	beat := func(worker string, n int) {
		t.Helper()
		if err := c.eng.Beat(ctx, engine.Beat{Worker: worker, Kinds: []string{"email.receipt"}, Interval: time.Minute,
			Status: []engine.KindBeat{{Kind: "email.receipt", Provider: "mail", MaxAttempts: n}}}); err != nil {
			t.Fatal(err)
		}
	}
	beat("w1", 7)
	check(attempts("--config", cfg, "--source", "o1", "--kind", "email.receipt"), "0 of 7 (the kind's)")
	check(attempts("--source", "o2", "--kind", "email.receipt"), "0 of 3")
	beat("w2", 12)
	check(attempts("--source", "o1", "--kind", "email.receipt"), "0 of 7 to 12 (the kind's: its dispatchers differ)")
}

// sidefx status says when nothing of a kind is pending (null in JSON) and
// when nothing pending is due yet, and names an unmigrated schema as sidefx
// run does, not with PostgreSQL's words.
func TestCLI_StatusSaysWhatIsPending(t *testing.T) {
	t.Parallel()
	c, pool, _ := newCLI(t)
	ctx := context.Background()
	c.ok("enqueue", "--any-kind", "--source", "o1", "--kind", "k.due", "--payload", `{}`)
	c.ok("enqueue", "--any-kind", "--source", "o1", "--kind", "k.done", "--payload", `{}`)
	c.ok("cancel", "--source", "o1", "--kind", "k.done", "--note", "voided")
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if out, _, err := c.run(`{"source_id":"o1","kind":"k.later","payload":{},"not_before":"`+later+`"}`+"\n", "enqueue", "--any-kind", "--from", "-"); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, out)
	}
	// The due effect has waited a second or more: no sleep, its due time
	// moved back.
	moved := time.Now()
	if _, err := pool.Exec(ctx, `UPDATE side_effects SET next_attempt_at = now() - interval '90 seconds' WHERE kind = 'k.due'`); err != nil {
		t.Fatal(err)
	}

	oldest := map[string]string{}
	out := c.ok("status")
	// The due effect's wait is 90 s plus the time status took to run: a
	// loaded machine adds a second or two, never less than 90 s.
	waited := 90*time.Second + time.Since(moved)
	for l := range strings.Lines(out) {
		f := strings.Fields(l)
		if len(f) > 1 && strings.HasPrefix(f[0], "k.") {
			oldest[f[0]] = strings.Join(f[1+len(effects.States):], " ")
		}
	}
	if d, err := time.ParseDuration(oldest["k.due"]); err != nil || d < 90*time.Second || d > waited.Round(time.Second) {
		t.Errorf("status: k.due's oldest pending %q, want between 1m30s and %s", oldest["k.due"], waited.Round(time.Second))
	}
	for kind, want := range map[string]string{"k.done": "nothing pending", "k.later": "none due yet"} {
		if oldest[kind] != want {
			t.Errorf("status: %s's oldest pending %q, want %q", kind, oldest[kind], want)
		}
	}
	var st struct {
		Kinds []struct {
			Kind   string   `json:"kind"`
			Oldest *float64 `json:"oldest_pending_seconds"`
		} `json:"kinds"`
	}
	raw := c.ok("status", "--json")
	if err := json.Unmarshal([]byte(raw), &st); err != nil || len(st.Kinds) != 3 {
		t.Fatalf("status --json: %v\n%s", err, raw)
	}
	for _, k := range st.Kinds {
		switch {
		case k.Kind == "k.done" && k.Oldest != nil:
			t.Errorf("status --json: k.done's oldest_pending_seconds is %v, want null: nothing is pending", *k.Oldest)
		case k.Kind == "k.later" && (k.Oldest == nil || *k.Oldest != 0):
			t.Errorf("status --json: k.later's oldest_pending_seconds is %v, want 0: it is pending, not due", k.Oldest)
		case k.Kind == "k.due" && (k.Oldest == nil || *k.Oldest < 90):
			t.Errorf("status --json: k.due's oldest_pending_seconds is %v, want at least 90", k.Oldest)
		}
	}
	if !strings.Contains(raw, `"oldest_pending_seconds": null`) {
		t.Errorf("status --json does not hold the field as null:\n%s", raw)
	}

	// A schema sidefx migrate never ran in, and one it ran in before
	// sidefx_dispatchers existed (version 6).
	if err := c.refuse("status", "--schema", "bare"); err == nil || err.Error() != "schema bare has no sidefx tables: run sidefx migrate" {
		t.Errorf("status of a schema without sidefx's tables: %v", err)
	}
	// Every other command says so too, through the error sidefx prints
	// (exitCode): none shows PostgreSQL's words alone.
	for _, args := range [][]string{{"list"}, {"inspect", "1"}, {"drift", "list"}, {"reconcile", "list"}, {"enqueue", "--source", "a", "--kind", "b", "--payload", "{}"}} {
		err := c.refuse(append(args, "--schema", "bare")...)
		var printed bytes.Buffer
		exitCode(err, &printed)
		if !strings.Contains(printed.String(), "run sidefx migrate") {
			t.Errorf("sidefx %s on a schema without sidefx's tables printed %q, which does not say to run sidefx migrate", strings.Join(args, " "), printed.String())
		}
	}
	c.ok("migrate", "--schema", "partial")
	if _, err := pool.Exec(ctx, `DROP TABLE partial.sidefx_dispatchers; DELETE FROM partial.sidefx_migrations WHERE version = 6`); err != nil {
		t.Fatal(err)
	}
	if err := c.refuse("status", "--schema", "partial"); err == nil || err.Error() != "schema partial lacks migrations [6]: run sidefx migrate" {
		t.Errorf("status of a schema behind: %v", err)
	}
	// One migrated before the pauses (version 13).
	c.ok("migrate", "--schema", "nopauses")
	if _, err := pool.Exec(ctx, `DROP TABLE nopauses.sidefx_pauses, nopauses.sidefx_pause_log; DELETE FROM nopauses.sidefx_migrations WHERE version = 13`); err != nil {
		t.Fatal(err)
	}
	if err := c.refuse("status", "--schema", "nopauses"); err == nil || err.Error() != "schema nopauses lacks migrations [13]: run sidefx migrate" {
		t.Errorf("status of a schema without the pauses: %v", err)
	}
}

// sidefx status stays a screenful however many kinds producers wrote:
// past twenty, the kinds no live dispatcher serves are summed in one row
// and one line; the JSON has them all.
func TestCLI_StatusIsBoundedHoweverManyKinds(t *testing.T) {
	t.Parallel()
	c, pool, _ := newCLI(t)
	var batch []outbox.Effect
	for i := range 2000 {
		batch = append(batch, outbox.Effect{SourceID: "o", Kind: fmt.Sprintf("made.up.kind%d", i), Payload: map[string]int{"n": i}})
	}
	if _, err := outbox.EnqueueMany(context.Background(), pool, batch); err != nil {
		t.Fatal(err)
	}
	out := c.ok("status")
	if n := strings.Count(out, "\n"); n > 80 {
		t.Fatalf("sidefx status printed %d lines for 2000 kinds nothing serves:\n%.2000s", n, out)
	}
	if !strings.Contains(out, "(1980 more unserved kinds)") || !strings.Contains(out, "1980 pending effects of 1980 more kinds wait for a dispatcher") {
		t.Fatalf("sidefx status does not sum the rest:\n%s", out)
	}
	if js := c.ok("status", "--json"); strings.Count(js, "made.up.kind") < 2000 {
		t.Fatal("sidefx status --json left kinds out")
	}
}

// Every command of the CLI an operator runs works as a role holding only
// deploy/postgres/operator-role.sql's grants.
func TestCLI_EveryCommandAsTheOperatorRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, url := pgtest.Owner(t)
	_, role := pgtest.Role(t, owner, url, "operator")
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.User(role)
	eng, err := engine.New(owner, "")
	if err != nil {
		t.Fatal(err)
	}
	c := &cli{t: t, url: u.String(), eng: eng}
	for _, k := range []string{"k.failed", "k.uncertain", "k.refire", "k.pending", "k.super", "k.backoff"} {
		c.ok("enqueue", "--any-kind", "--source", "s", "--kind", k, "--payload", "{}")
	}
	backing := backOff(t, eng, "k.backoff")
	failed := operate(t, eng, "k.failed", effects.Failed)
	unsure := operate(t, eng, "k.uncertain", effects.Uncertain)
	refire := operate(t, eng, "k.refire", effects.Uncertain)
	super := operate(t, eng, "k.super", effects.Failed)
	id := func(e *effects.Effect) string { return fmt.Sprint(e.ID) }
	// A kind a dispatcher served, without effects: a bulk action over it
	// matches nothing and is no typo.
	if _, err := owner.Exec(ctx, `INSERT INTO sidefx_kinds (kind) VALUES ('k.none')`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"status"},
		{"status", "--json"},
		{"list"},
		{"list", "--state", "failed"},
		{"inspect", id(failed)},
		{"inspect", "--source", "s", "--kind", "k.pending"},
		{"inspect", failed.Key},
		{"version"},
		{"retry", id(failed), "--note", "provider fixed"},
		{"resolve", id(unsure), "--as", "confirmed", "--ref", "msg_1", "--note", "seen"},
		{"resolve", id(refire), "--refire", "--note", "never arrived"},
		{"supersede", id(super), "--payload", `{"fixed": true}`, "--note", "corrected"},
		{"cancel", "--source", "s", "--kind", "k.pending", "--note", "voided"},
		{"pause", "--kind", "k.failed", "--note", "incident"},
		{"resume", "--kind", "k.failed", "--note", "over", "--now"},
		{"retry", "--now", id(backing), "--note", "provider recovered"},
		{"bulk", "cancel", "--kind", "k.none", "--note", "nothing to do", "--yes"},
		{"drift", "list"},
		{"reconcile", "list"},
	} {
		c.ok(args...)
	}
	var events int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM side_effect_events`).Scan(&events); err != nil || events != 6 {
		t.Errorf("the operator's six actions left %d events, %v", events, err)
	}
}

// enqueue --from says what was wrong with a line's not_before, counts
// "1 bad line", and does not say "the others were enqueued" when none was.
func TestCLI_EnqueueFromLinesSaysWhatWasWrong(t *testing.T) {
	t.Parallel()
	c, _, _ := newCLI(t)
	out, _, err := c.run(`{"source_id": "o-1", "kind": "email.receipt", "payload": {}, "not_before": "-infinity"}`+"\n", "enqueue", "--any-kind", "--from", "-")
	if err == nil || err.Error() != "1 bad line (each reported above); nothing was enqueued" {
		t.Errorf("one bad line: %v", err)
	}
	if !strings.Contains(out, `not_before "-infinity" is not an RFC 3339 time`) || !strings.Contains(out, "0 inserted, 0 already present, 1 bad line\n") {
		t.Errorf("one bad line said:\n%s", out)
	}
}

// sidefx enqueue as a role that may not enqueue (the daemon's, whose URL a
// configuration often holds) says which role may, not PostgreSQL's words
// alone.
func TestCLI_EnqueueAsTheDaemonRoleSaysWhoMay(t *testing.T) {
	t.Parallel()
	owner, url := pgtest.Owner(t)
	_, role := pgtest.Role(t, owner, url, "daemon")
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.User(role)
	c := &cli{t: t, url: u.String()}
	err = c.refuse("enqueue", "--any-kind", "--source", "s", "--kind", "k", "--payload", "{}")
	if err == nil || !strings.Contains(err.Error(), "this URL's role may not enqueue; a producer's role may") {
		t.Errorf("enqueue as the daemon's role: %v", err)
	}
}
