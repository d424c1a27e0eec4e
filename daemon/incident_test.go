package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// backOff claims the due effect of kind and records a retryable answer:
// pending again, its next attempt an hour out.
func backOff(t *testing.T, eng *engine.Engine, kind string) *effects.Effect {
	t.Helper()
	ctx := context.Background()
	got, err := eng.Claim(ctx, engine.ClaimParams{Kinds: []string{kind}, Limit: 1, Lease: time.Minute, Worker: "test"})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim %s: %d, %v", kind, len(got), err)
	}
	e := got[0]
	if _, err := eng.Complete(ctx, []engine.Outcome{{ID: e.ID, Attempt: e.Attempts, State: effects.Pending, RetryIn: time.Hour,
		Error: fmt.Sprintf("attempt %d of 5: retryable: 503 Service Unavailable", e.Attempts)}}); err != nil {
		t.Fatal(err)
	}
	return e
}

// dueNowEvents counts the due_now entries in effect id's history with note.
func dueNowEvents(t *testing.T, pool *pgxpool.Pool, id int64, note string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM side_effect_events
		WHERE effect_id = $1 AND action = 'due_now' AND from_state = 'pending' AND to_state = 'pending' AND note = $2`, id, note).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// isDue says whether effect id is pending and due by the database's clock.
func isDue(t *testing.T, pool *pgxpool.Pool, id int64) bool {
	t.Helper()
	var due bool
	if err := pool.QueryRow(context.Background(), `SELECT state = 'pending' AND next_attempt_at <= now() FROM side_effects WHERE id = $1`, id).Scan(&due); err != nil {
		t.Fatal(err)
	}
	return due
}

// After a provider's outage, the effects backing off are brought forward
// (retry --now, bulk retry --now), each with a history entry; a retry
// without --now of a pending effect names --now; an effect scheduled by its
// producer, one due already and one failed are left to what they are.
func TestCLI_RetryNowBringsBackoffForward(t *testing.T) {
	t.Parallel()
	c, pool, store := newCLI(t)
	ctx := context.Background()
	for i := range 4 {
		c.ok("enqueue", "--any-kind", "--source", fmt.Sprintf("o%d", i), "--kind", "mail.receipt", "--payload", "{}")
	}
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if out, _, err := c.run(`{"source_id":"sched","kind":"mail.receipt","payload":{},"not_before":"`+later+`"}`+"\n", "enqueue", "--any-kind", "--from", "-"); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, out)
	}
	var ids []int64
	for range 3 {
		ids = append(ids, backOff(t, c.eng, "mail.receipt").ID)
	}
	failed := operate(t, c.eng, "mail.receipt", effects.Failed)
	sched, err := store.GetBySource(ctx, "sched", "mail.receipt")
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprint(ids[0])

	// The dead end a new user met: now it names the way on.
	err = c.refuse("retry", id, "--note", "provider back")
	if !errors.Is(err, effects.ErrWrongState) || !strings.Contains(err.Error(), "sidefx retry --now "+id) {
		t.Fatalf("retry of a pending effect: %v, want it to name retry --now", err)
	}
	out := c.ok("retry", "--now", id, "--note", "provider back", "--actor", "ops")
	if !strings.Contains(out, "due now (its next attempt was at") || !isDue(t, pool, ids[0]) || dueNowEvents(t, pool, ids[0], "provider back") != 1 {
		t.Fatalf("retry --now: %q; due %v, %d events", out, isDue(t, pool, ids[0]), dueNowEvents(t, pool, ids[0], "provider back"))
	}
	if e, _ := store.Get(ctx, ids[0]); e.Attempts != 1 || e.State != effects.Pending {
		t.Fatalf("retry --now changed more than the time: %+v", e)
	}
	// Due already: refused, nothing recorded.
	if err := c.refuse("retry", "--now", id, "--note", "again"); !errors.Is(err, admin.ErrNotBackingOff) || !strings.Contains(err.Error(), "due already") {
		t.Fatalf("retry --now of a due effect: %v", err)
	}
	// Scheduled by its producer: its time is the producer's.
	if err := c.refuse("retry", "--now", fmt.Sprint(sched.ID), "--note", "x"); !errors.Is(err, admin.ErrNotBackingOff) || !strings.Contains(err.Error(), "scheduled") {
		t.Fatalf("retry --now of a scheduled effect: %v", err)
	}
	// A failed effect is retried as without --now.
	if out := c.ok("retry", "--now", fmt.Sprint(failed.ID), "--note", "fixed"); !strings.Contains(out, "retried, now pending") {
		t.Fatalf("retry --now of a failed effect: %q", out)
	}

	// Many: shown first, then done with a note; by the provider the
	// dispatchers' registry names, without --config.
	if _, err := pool.Exec(ctx, `INSERT INTO sidefx_kinds (kind, provider) VALUES ('mail.receipt', 'mail')`); err != nil {
		t.Fatal(err)
	}
	out = c.ok("bulk", "retry", "--now", "--provider", "mail")
	if !strings.Contains(out, "2 pending effects backing off match (cap 100); the first 2:") || !strings.Contains(out, "nothing done: add --yes and --note WHY to make due now these 2 effects") ||
		strings.Contains(out, fmt.Sprintf("  %d  ", sched.ID)) {
		t.Fatalf("bulk retry --now preview:\n%s", out)
	}
	if isDue(t, pool, ids[1]) {
		t.Fatal("the preview made an effect due")
	}
	if err := c.refuse("bulk", "retry", "--now", "--provider", "mail", "--yes"); !strings.Contains(err.Error(), "needs --note") {
		t.Fatalf("bulk --yes without a note: %v", err)
	}
	if err := c.refuse("bulk", "retry", "--now", "--provider", "mial", "--note", "x", "--yes"); !strings.Contains(err.Error(), "no kind of it is known here") ||
		!strings.Contains(err.Error(), `did you mean "mail"`) && !strings.Contains(err.Error(), "did you mean mail") {
		t.Fatalf("bulk --provider with a typo: %v", err)
	}
	out = c.ok("bulk", "retry", "--now", "--provider", "mail", "--note", "mail provider recovered", "--yes")
	if !strings.Contains(out, "retry: 2 done, 0 skipped") {
		t.Fatalf("bulk retry --now:\n%s", out)
	}
	for _, id := range ids[1:] {
		if !isDue(t, pool, id) || dueNowEvents(t, pool, id, "mail provider recovered") != 1 {
			t.Errorf("effect %d after bulk retry --now: due %v, %d events", id, isDue(t, pool, id), dueNowEvents(t, pool, id, "mail provider recovered"))
		}
	}
	if isDue(t, pool, sched.ID) {
		t.Error("bulk retry --now made a scheduled effect due")
	}
	// --now is retry's, and acts on pending effects only.
	if err := c.refuse("bulk", "cancel", "--now", "--kind", "mail.receipt"); exitCode(err, &bytes.Buffer{}) != 2 {
		t.Errorf("bulk cancel --now: %v, want a usage error", err)
	}
	if err := c.refuse("bulk", "retry", "--now", "--state", "failed", "--kind", "mail.receipt"); exitCode(err, &bytes.Buffer{}) != 2 {
		t.Errorf("bulk retry --now --state failed: %v, want a usage error", err)
	}
}

// A provider paused for its outage: inspect says so without --config (the
// provider comes from the dispatchers' registry), status names the kinds
// it holds back, and resume --now makes due what backed off meanwhile.
func TestCLI_ResumeNowAndInspectKnowsTheProvider(t *testing.T) {
	t.Parallel()
	c, pool, store := newCLI(t)
	ctx := context.Background()
	for i := range 2 {
		c.ok("enqueue", "--any-kind", "--source", fmt.Sprintf("o%d", i), "--kind", "mail.receipt", "--payload", "{}")
	}
	c.ok("enqueue", "--any-kind", "--source", "o1", "--kind", "k.unknown", "--payload", "{}")
	a, b := backOff(t, c.eng, "mail.receipt"), backOff(t, c.eng, "mail.receipt")
	if err := c.eng.Heartbeat(ctx, "w", []string{"mail.receipt", "k.unknown"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO sidefx_kinds (kind, provider) VALUES ('mail.receipt', 'mail')`); err != nil {
		t.Fatal(err)
	}
	c.ok("pause", "--provider", "mail", "--note", "outage at the mail provider")
	if out := c.ok("inspect", fmt.Sprint(a.ID)); !strings.Contains(out, "its provider mail is paused since") {
		t.Fatalf("inspect of an effect whose provider is paused, without --config:\n%s", out)
	}
	unknown, err := store.GetBySource(ctx, "o1", "k.unknown")
	if err != nil {
		t.Fatal(err)
	}
	if out := c.ok("inspect", fmt.Sprint(unknown.ID)); !strings.Contains(out, "the provider of k.unknown is not known here: no --config given, and no dispatcher has registered the kind") {
		t.Fatalf("inspect of an effect whose provider nothing names:\n%s", out)
	}
	if out := c.ok("status"); !strings.Contains(out, "It holds back the kinds mail.receipt.") {
		t.Fatalf("status of a paused provider:\n%s", out)
	}
	if err := c.refuse("resume", "--provider", "mail", "--no-note", "--now"); exitCode(err, &bytes.Buffer{}) != 2 || !strings.Contains(err.Error(), "--note") {
		t.Fatalf("resume --no-note: %v", err)
	}
	out := c.ok("resume", "--provider", "mail", "--note", "mail provider recovered", "--now")
	if !strings.Contains(out, "provider mail resumed") || !strings.Contains(out, "2 pending effects backing off (mail.receipt) made due now") {
		t.Fatalf("resume --now:\n%s", out)
	}
	for _, e := range []*effects.Effect{a, b} {
		if !isDue(t, pool, e.ID) || dueNowEvents(t, pool, e.ID, "mail provider recovered") != 1 {
			t.Errorf("effect %d after resume --now: due %v", e.ID, isDue(t, pool, e.ID))
		}
	}
	// Not paused: the error names the way that works without a pause.
	if err := c.refuse("resume", "--provider", "mail", "--note", "x", "--now"); !strings.Contains(err.Error(), "sidefx bulk retry --now --provider mail") {
		t.Fatalf("resume --now of what is not paused: %v", err)
	}
}

// Every command that changes an effect needs --note or --no-note, as the
// console needs a note: without either it is refused, naming both, and
// changes nothing.
func TestCLI_EveryChangeNeedsANoteOrNoNote(t *testing.T) {
	t.Parallel()
	c, _, store := newCLI(t)
	ctx := context.Background()
	for _, k := range []string{"k.failed", "k.uncertain", "k.pending", "k.super"} {
		c.ok("enqueue", "--any-kind", "--source", "s", "--kind", k, "--payload", "{}")
	}
	failed := operate(t, c.eng, "k.failed", effects.Failed)
	unsure := operate(t, c.eng, "k.uncertain", effects.Uncertain)
	super := operate(t, c.eng, "k.super", effects.Failed)
	id := func(e *effects.Effect) string { return fmt.Sprint(e.ID) }
	for _, args := range [][]string{
		{"retry", id(failed)},
		{"retry", "--now", id(failed)},
		{"resolve", id(unsure), "--as", "confirmed"},
		{"resolve", id(unsure), "--refire"},
		{"cancel", "--source", "s", "--kind", "k.pending"},
		{"supersede", id(super), "--payload", `{"fixed": true}`},
	} {
		err := c.refuse(args...)
		if exitCode(err, &bytes.Buffer{}) != 2 || !strings.Contains(err.Error(), "--note WHY") || !strings.Contains(err.Error(), "--no-note") {
			t.Errorf("%v without a note: %v, want a usage error naming --note and --no-note", args, err)
		}
		if err := c.refuse(append(args, "--note", "why", "--no-note")...); exitCode(err, &bytes.Buffer{}) != 2 {
			t.Errorf("%v with --note and --no-note: %v, want a usage error", args, err)
		}
	}
	for _, args := range [][]string{
		{"pause", "--kind", "k.pending", "--no-note"},
		{"bulk", "retry", "--kind", "k.failed", "--no-note", "--yes"},
		{"bulk", "retry", "--kind", "k.failed", "--yes"},
	} {
		if err := c.refuse(args...); exitCode(err, &bytes.Buffer{}) != 2 || !strings.Contains(err.Error(), "--note WHY") {
			t.Errorf("%v: %v, want a usage error asking for --note", args, err)
		}
	}
	for _, e := range []*effects.Effect{failed, unsure, super} {
		if h, err := store.History(ctx, e.ID); err != nil || len(h) != 0 {
			t.Fatalf("effect %d: history %v, %v after refusals", e.ID, h, err)
		}
	}
	// --no-note acts, recording no note.
	c.ok("retry", id(failed), "--no-note")
	if h, err := store.History(ctx, failed.ID); err != nil || len(h) != 1 || h[0].Note != "" {
		t.Fatalf("retry --no-note: %+v, %v", h, err)
	}
}

// list shows the latest attempt's error only: attempt 7's EOF, not attempt
// 6's 429, and no error at all beside a confirmation; the answer stored is
// the latest attempt's (none for an EOF), and its attempt is recorded. The
// stored error stays the latest any attempt gave (attempt 6's beside a
// confirmation by attempt 7: the record inspect shows), naming its attempt.
func TestCLI_ListShowsTheLatestAttemptOnly(t *testing.T) {
	t.Parallel()
	c, _, store := newCLI(t)
	ctx := context.Background()
	c.ok("enqueue", "--any-kind", "--source", "eof", "--kind", "mail.eof", "--payload", "{}")
	c.ok("enqueue", "--any-kind", "--source", "ok", "--kind", "mail.ok", "--payload", "{}")
	body := json.RawMessage(`{"status": 429, "body": "rate limited"}`)
	settle := func(source string, last engine.Outcome) *effects.Effect {
		t.Helper()
		for attempt := 1; attempt <= 7; attempt++ {
			got, err := c.eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"mail." + source}, Limit: 1, Lease: time.Minute, Worker: "w"})
			if err != nil || len(got) != 1 || got[0].SourceID != source || got[0].Attempts != attempt {
				t.Fatalf("claim of attempt %d: %v, %v", attempt, got, err)
			}
			o := engine.Outcome{ID: got[0].ID, Attempt: attempt, State: effects.Pending, Detail: body,
				Error: fmt.Sprintf("attempt %d of 8: retryable: 429 Too Many Requests", attempt)}
			if attempt == 7 {
				o = last
				o.ID, o.Attempt = got[0].ID, attempt
			}
			if _, err := c.eng.Complete(ctx, []engine.Outcome{o}); err != nil {
				t.Fatal(err)
			}
		}
		e, err := store.GetBySource(ctx, source, "mail."+source)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	eof := settle("eof", engine.Outcome{State: effects.Uncertain, MaybePerformed: true, Error: "attempt 7 of 8: unknown: EOF"})
	ok := settle("ok", engine.Outcome{State: effects.Confirmed, ProviderRef: "msg_7"})
	if eof.OutcomeAttempt != 7 || eof.Outcome != nil || eof.LastError != "attempt 7 of 8: unknown: EOF" {
		t.Errorf("after attempt 7's EOF: outcome %s of attempt %d, error %q; want none stored of attempt 7, and its EOF", eof.Outcome, eof.OutcomeAttempt, eof.LastError)
	}
	if ok.OutcomeAttempt != 7 || ok.Outcome != nil || ok.LastError != "attempt 6 of 8: retryable: 429 Too Many Requests" {
		t.Errorf("after attempt 7's confirmation: outcome %s of attempt %d, error %q; want no answer kept from attempt 6, and attempt 6's error as its record", ok.Outcome, ok.OutcomeAttempt, ok.LastError)
	}
	out := c.ok("list", "--kind", "mail.eof,mail.ok")
	if !strings.Contains(out, "mail.eof") || !strings.Contains(out, "mail.ok") {
		t.Fatalf("list:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, fmt.Sprint(eof.ID)+" ") && strings.Contains(line, "mail.eof"):
			if !strings.Contains(line, "attempt 7 of 8: unknown: EOF") || strings.Contains(line, "429") {
				t.Errorf("list's line of the EOF: %q", line)
			}
		case strings.HasPrefix(line, fmt.Sprint(ok.ID)+" ") && strings.Contains(line, "mail.ok"):
			if strings.Contains(line, "429") || !strings.HasSuffix(strings.TrimSpace(line), "-") {
				t.Errorf("list's line of the confirmed effect shows an error: %q", line)
			}
		}
	}
}
