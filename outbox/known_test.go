package outbox_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

// By default a producer refuses a kind no dispatcher has served lately,
// once any dispatcher has run: a misspelled kind fails the business
// transaction, naming the closest known kinds, instead of waiting forever.
// Before any dispatcher has run every kind is accepted; AnyKind turns the
// check off; SQL producers choose it with sidefx_enqueue_known.
func TestEnqueue_RefusesAKindNoDispatcherServes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	misspelled := outbox.Effect{SourceID: "order-1", Kind: "charge.payment_intent.create", Payload: map[string]int{"amount": 1}}

	// No dispatcher has run: producers deployed first may enqueue.
	if r, err := outbox.Enqueue(b.ctx, b.pool, misspelled); err != nil || !r.Inserted {
		t.Fatalf("before any dispatcher ran: %+v, %v", r, err)
	}

	eng, err := engine.New(b.pool, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.RegisterKinds(b.ctx, engine.Beat{Kinds: []string{"charge.payment_intents.create", "email.receipt", "webhook.order_paid"},
		Status: []engine.KindBeat{{Kind: "charge.payment_intents.create", Provider: "stripe"}}}); err != nil {
		t.Fatal(err)
	}
	misspelled.SourceID = "order-2"

	// One effect, in a transaction: refused, naming the closest kind, and
	// the transaction is aborted (nothing of it commits).
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	_, err = outbox.Enqueue(b.ctx, tx, misspelled)
	uk, ok := errors.AsType[*effects.UnknownKindError](err)
	if !ok || !errors.Is(err, outbox.ErrUnknownKind) || uk.Index != -1 || uk.Kind != misspelled.Kind || !uk.Registered ||
		len(uk.Known) == 0 || uk.Known[0] != "charge.payment_intents.create" {
		t.Fatalf("a misspelled kind: %v (%+v)", err, uk)
	}
	for _, want := range []string{`kind "charge.payment_intent.create" is not one a dispatcher has served in the last 30 days`,
		"the closest known: charge.payment_intents.create", "check its spelling", "AnyKind"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q lacks %q", err, want)
		}
	}
	if err := tx.Commit(b.ctx); err == nil {
		t.Error("the transaction committed after the refusal")
	}

	// In a batch, the item is named; nothing is inserted.
	before := count(t, b)
	_, err = outbox.EnqueueMany(b.ctx, b.pool, []outbox.Effect{
		{SourceID: "order-3", Kind: "email.receipt", Payload: map[string]int{}},
		{SourceID: "order-3", Kind: "emial.receipt", Payload: map[string]int{}},
	})
	if uk, ok := errors.AsType[*effects.UnknownKindError](err); !ok || uk.Index != 1 || uk.Known[0] != "email.receipt" {
		t.Fatalf("a misspelled kind at index 1: %v", err)
	}
	if n := count(t, b); n != before {
		t.Fatalf("%d effects after a refused batch, want %d", n, before)
	}

	// database/sql is checked the same way.
	db := stdlib.OpenDBFromPool(b.pool)
	defer db.Close()
	if _, err := outbox.Enqueue(b.ctx, db, misspelled); !errors.Is(err, outbox.ErrUnknownKind) {
		t.Errorf("on database/sql: %v", err)
	}

	// Known kinds go; AnyKind lets any kind go.
	if _, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "order-4", Kind: "email.receipt", Payload: map[string]int{}}); err != nil {
		t.Errorf("a known kind: %v", err)
	}
	anyKind, err := outbox.New(&outbox.Config{AnyKind: true})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := anyKind.Enqueue(b.ctx, b.pool, misspelled); err != nil || !r.Inserted {
		t.Errorf("with AnyKind: %+v, %v", r, err)
	}

	// A kind no dispatcher has served for kinds_known_for is not known.
	if _, err := b.pool.Exec(b.ctx, `UPDATE sidefx_kinds SET seen_at = now() - interval '31 days' WHERE kind = 'webhook.order_paid'`); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "order-5", Kind: "webhook.order_paid", Payload: map[string]int{}}); !errors.Is(err, outbox.ErrUnknownKind) {
		t.Errorf("a kind last served 31 days ago: %v", err)
	}

	// The window is at least a day (schema 28): dispatchers refresh their
	// kinds hourly, so a shorter one would make live kinds unknown.
	if _, err := b.pool.Exec(b.ctx, `UPDATE sidefx_settings SET kinds_known_for = interval '2 hours'`); err == nil {
		t.Error("kinds_known_for of 2 hours was accepted; a kind served an hour ago would be unknown between refreshes")
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE sidefx_settings SET kinds_known_for = interval '1 day'`); err != nil {
		t.Errorf("kinds_known_for of a day: %v", err)
	}

	// SQL: sidefx_enqueue_many as before, sidefx_enqueue_known checked.
	if _, err := b.pool.Exec(b.ctx, `SELECT * FROM sidefx_enqueue('order-6', 'charge.payment_intent.create', '{}')`); err != nil {
		t.Errorf("sidefx_enqueue of any kind: %v", err)
	}
	_, err = b.pool.Exec(b.ctx, `SELECT * FROM sidefx_enqueue_known(NULL, ARRAY['order-7'], ARRAY['charge.payment_intent.create'], ARRAY['{}'::jsonb])`)
	if pe, ok := errors.AsType[*pgconn.PgError](err); !ok || pe.Code != "SX002" || !strings.Contains(pe.Detail, `"known" : ["charge.payment_intents.create"`) {
		t.Errorf("sidefx_enqueue_known of a misspelled kind: %v (%+v)", err, pe)
	}
}

// A dispatcher records the kinds it serves, with their providers, in
// sidefx_kinds: the registry producers check kinds against.
func TestEnqueue_KindsAreKnownOnceADispatcherRegistersThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	eng, err := engine.New(b.pool, "")
	if err != nil {
		t.Fatal(err)
	}
	beat := engine.Beat{Kinds: []string{"a.one", "b.two"}, Status: []engine.KindBeat{{Kind: "a.one", Provider: "p1"}}}
	for range 2 { // the second writes nothing new
		if err := eng.RegisterKinds(context.Background(), beat); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := b.pool.Query(b.ctx, `SELECT kind || '=' || coalesce(provider, '') FROM sidefx_kinds ORDER BY kind`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if strings.Join(got, " ") != "a.one=p1 b.two=" {
		t.Fatalf("sidefx_kinds: %q", got)
	}
}

// Source ids are in one Unicode spelling: a new effect whose source id is
// not in NFC is refused, naming the NFC spelling, so that "café" written
// two ways is never two effects. An effect that exists under a non-NFC
// spelling (enqueued before schema 24) is still found: its replay is a
// duplicate, its key unchanged.
func TestEnqueue_SourceIDsAreInNFC(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const nfc, nfd = "order-caf\u00e9", "order-cafe\u0301"
	_, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: nfd, Kind: "email.receipt", Payload: map[string]int{}})
	ve, ok := errors.AsType[*effects.ValidationError](err)
	// Both spellings shown with their code points escaped (on a screen
	// they look the same), and no batch index for a single effect.
	if !ok || ve.Field != "source_id" || !strings.Contains(err.Error(), "is not in Unicode normalization form NFC") ||
		!strings.Contains(err.Error(), `"order-caf\u00e9" is`) || !strings.Contains(err.Error(), `source_id "order-cafe\u0301"`) || strings.Contains(err.Error(), "index") {
		t.Fatalf("a source id in NFD: %v", err)
	}
	if r, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: nfc, Kind: "email.receipt", Payload: map[string]int{}}); err != nil || !r.Inserted {
		t.Fatalf("the NFC spelling: %+v, %v", r, err)
	}
	// An effect from before: enqueued under the NFD spelling.
	var key string
	if err := b.pool.QueryRow(b.ctx, `INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash)
		VALUES ($1, 'webhook.paid', sidefx_key($1, 'webhook.paid'), '{}', sha256(convert_to('{}', 'UTF8'))) RETURNING idempotency_key`, nfd).Scan(&key); err != nil {
		t.Fatal(err)
	}
	r, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: nfd, Kind: "webhook.paid", Payload: map[string]int{}})
	if err != nil || r.Inserted || r.Key != key {
		t.Fatalf("the replay of an effect enqueued in NFD before: %+v, %v (key %s)", r, err, key)
	}
}

// The errors of Enqueue, one effect, name no position in a batch ("index
// 0", "effect 1 of 1"): the enqueue functions take a batch, and only
// EnqueueMany's caller has one. EnqueueMany's errors keep the position.
func TestEnqueue_OneEffectsErrorsNameNoPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, url := pgtest.Owner(t)
	positions := regexp.MustCompile(`index \d|effect \d+ of \d+`)

	// Refused by the enqueue function: a source id not in NFC.
	nfd := outbox.Effect{SourceID: "order-cafe\u0301", Kind: "email.receipt", Payload: map[string]int{}}
	_, err := outbox.Enqueue(ctx, owner, nfd)
	if ve, ok := errors.AsType[*effects.ValidationError](err); !ok || ve.Index != -1 || positions.MatchString(err.Error()) {
		t.Errorf("Enqueue of a source id not in NFC: %v", err)
	}
	ok := outbox.Effect{SourceID: "order-1", Kind: "email.receipt", Payload: map[string]int{}}
	_, err = outbox.EnqueueMany(ctx, owner, []outbox.Effect{ok, nfd})
	if ve, isVE := errors.AsType[*effects.ValidationError](err); !isVE || ve.Index != 1 || !strings.Contains(err.Error(), "at index 1") {
		t.Errorf("EnqueueMany of a source id not in NFC, second: %v", err)
	}

	// Refused by the enqueue function: another producer's pair.
	orders, _ := pgtest.Role(t, owner, url, "producer")
	billing, _ := pgtest.Role(t, owner, url, "producer")
	charge := outbox.Effect{SourceID: "order-1043", Kind: "card.charge", Payload: map[string]int{"amount": 4200}}
	if _, err := outbox.Enqueue(ctx, billing, charge); err != nil {
		t.Fatal(err)
	}
	_, err = outbox.Enqueue(ctx, orders, charge)
	if !errors.Is(err, outbox.ErrOtherProducer) || positions.MatchString(err.Error()) ||
		!strings.Contains(err.Error(), "source_id order-1043 kind card.charge was enqueued by another producer role") {
		t.Errorf("Enqueue of another producer's pair: %v", err)
	}
	_, err = outbox.EnqueueMany(ctx, orders, []outbox.Effect{ok, charge})
	if !errors.Is(err, outbox.ErrOtherProducer) || !strings.Contains(err.Error(), "effect 2 of 2") {
		t.Errorf("EnqueueMany of another producer's pair, second: %v", err)
	}

	// Refused by the enqueue function: a kind no dispatcher has served.
	eng, err := engine.New(owner, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.RegisterKinds(ctx, engine.Beat{Kinds: []string{"email.receipt"}}); err != nil {
		t.Fatal(err)
	}
	typo := outbox.Effect{SourceID: "order-2", Kind: "email.reciept", Payload: map[string]int{}}
	_, err = outbox.Enqueue(ctx, owner, typo)
	if uk, isUK := errors.AsType[*effects.UnknownKindError](err); !isUK || uk.Index != -1 || positions.MatchString(err.Error()) {
		t.Errorf("Enqueue of a kind no dispatcher served: %v", err)
	}
	_, err = outbox.EnqueueMany(ctx, owner, []outbox.Effect{ok, typo})
	if uk, isUK := errors.AsType[*effects.UnknownKindError](err); !isUK || uk.Index != 1 || !strings.Contains(err.Error(), "at index 1") {
		t.Errorf("EnqueueMany of a kind no dispatcher served, second: %v", err)
	}
}
