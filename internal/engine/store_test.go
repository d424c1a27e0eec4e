package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

func TestStore_InsertAndGet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := insert(t, b, effects.NewEffect{SourceID: "order-1", Kind: "email.receipt", Payload: json.RawMessage(`{"to": "a@example.com", "n": 1}`)})
	if !res[0].Inserted || res[0].Key != derive.Key("order-1", "email.receipt") {
		t.Fatalf("insert = %+v", res[0])
	}
	byID, err := b.store.Get(b.ctx, res[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	byKey, err := b.store.GetByKey(b.ctx, res[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	bySource, err := b.store.GetBySource(b.ctx, "order-1", "email.receipt")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []*effects.Effect{byID, byKey, bySource} {
		if e.ID != res[0].ID || e.State != effects.Pending || e.Attempts != 0 || e.MaxAttempts != 0 || e.Key != res[0].Key {
			t.Errorf("got %+v", e)
		}
		// The stored payload is the canonical jsonb text, and the hash is its SHA-256.
		if string(e.Payload) != `{"n": 1, "to": "a@example.com"}` {
			t.Errorf("payload = %s", e.Payload)
		}
		if h := sha256.Sum256(e.Payload); string(h[:]) != string(e.PayloadHash) {
			t.Errorf("payload hash is not the SHA-256 of the canonical payload")
		}
		if e.CreatedAt.IsZero() || e.NextAttemptAt.IsZero() || !e.LeaseUntil.IsZero() || !e.FiredAt.IsZero() {
			t.Errorf("times: %+v", e)
		}
	}
	for _, err := range []error{
		func() error { _, err := b.store.Get(b.ctx, 999999); return err }(),
		func() error { _, err := b.store.GetByKey(b.ctx, "sfx1_nope"); return err }(),
		func() error { _, err := b.store.GetBySource(b.ctx, "order-1", "email.other"); return err }(),
	} {
		if !errors.Is(err, effects.ErrNotFound) {
			t.Errorf("missing effect: err = %v, want ErrNotFound", err)
		}
	}
}

func TestStore_ListAndCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var items []effects.NewEffect
	for _, src := range []string{"a", "b", "c"} {
		for _, k := range []string{"email.receipt", "webhook.paid"} {
			items = append(items, effects.NewEffect{SourceID: src, Kind: k, Payload: json.RawMessage(`{}`)})
		}
	}
	insert(t, b, items...)
	if _, err := b.store.Cancel(b.ctx, "b", "webhook.paid"); err != nil {
		t.Fatal(err)
	}

	all, err := b.store.List(b.ctx, effects.Filter{})
	if err != nil || len(all) != 6 {
		t.Fatalf("list all = %d, %v", len(all), err)
	}
	for i := 1; i < len(all); i++ {
		if all[i].ID <= all[i-1].ID {
			t.Fatal("list is not in id order")
		}
	}
	page, err := b.store.List(b.ctx, effects.Filter{AfterID: all[1].ID, Limit: 2})
	if err != nil || len(page) != 2 || page[0].ID != all[2].ID {
		t.Fatalf("page = %v, %v", page, err)
	}
	webhooks, err := b.store.List(b.ctx, effects.Filter{Kinds: []string{"webhook.paid"}, States: []effects.State{effects.Pending}})
	if err != nil || len(webhooks) != 2 {
		t.Fatalf("pending webhooks = %d, %v", len(webhooks), err)
	}
	bs, err := b.store.List(b.ctx, effects.Filter{SourceID: "b"})
	if err != nil || len(bs) != 2 {
		t.Fatalf("source b = %d, %v", len(bs), err)
	}
	if _, err := b.store.List(b.ctx, effects.Filter{States: []effects.State{"done"}}); err == nil {
		t.Error("list with an unknown state accepted")
	}

	counts, err := b.store.Counts(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[effects.Count]bool{}
	for _, c := range counts {
		got[c] = true
	}
	want := []effects.Count{
		{State: effects.Pending, Kind: "email.receipt", N: 3},
		{State: effects.Pending, Kind: "webhook.paid", N: 2},
		{State: effects.Cancelled, Kind: "webhook.paid", N: 1},
	}
	if len(counts) != len(want) {
		t.Fatalf("counts = %+v", counts)
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("counts lack %+v: %+v", w, counts)
		}
	}
}

func TestStore_CancelOnlyPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b,
		effects.NewEffect{SourceID: "s", Kind: "k.pending", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "s", Kind: "k.fired", Payload: json.RawMessage(`{}`)},
	)
	id, err := b.store.Cancel(b.ctx, "s", "k.pending")
	if err != nil {
		t.Fatalf("cancel pending: %v", err)
	}
	if e, err := b.store.Get(b.ctx, id); err != nil || e.State != effects.Cancelled || e.SourceID != "s" || e.Kind != "k.pending" {
		t.Fatalf("cancel pending returned %d: %+v, %v", id, e, err)
	}
	// The history says who cancelled it.
	var actor, note string
	if err := b.pool.QueryRow(b.ctx, `SELECT actor, note FROM side_effect_events WHERE effect_id = $1 AND action = 'cancel' AND from_state = 'pending' AND to_state = 'cancelled'`, id).Scan(&actor, &note); err != nil || !strings.HasPrefix(actor, "producer:") {
		t.Errorf("the cancel's history: actor %q note %q, %v", actor, note, err)
	}
	// A claimed effect may be at its provider: cancelling it is refused.
	// (The dispatcher's claim will own this statement; here the test sets the
	// state directly.)
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET state = 'fired', attempts = 1, lease_until = now() + interval '1 minute' WHERE kind = 'k.fired'`); err != nil {
		t.Fatal(err)
	}
	_, err = b.store.Cancel(b.ctx, "s", "k.pending")
	var se *effects.StateError
	if !errors.As(err, &se) || !errors.Is(err, effects.ErrWrongState) || se.State != effects.Cancelled {
		t.Errorf("cancel a cancelled effect: err = %v, want a StateError in cancelled", err)
	}
	_, err = b.store.Cancel(b.ctx, "s", "k.fired")
	var mp *effects.MaybePerformedError
	if !errors.As(err, &mp) || !errors.Is(err, effects.ErrMaybePerformed) || mp.State != effects.Fired ||
		!strings.Contains(err.Error(), "may have been performed") {
		t.Errorf("cancel a fired effect: err = %v, want a MaybePerformedError in fired", err)
	}
	if cur, _ := b.store.GetBySource(b.ctx, "s", "k.fired"); cur.State != effects.Fired {
		t.Errorf("k.fired is %s after a refused cancel", cur.State)
	}
	if _, err := b.store.Cancel(b.ctx, "nobody", "k.pending"); !errors.Is(err, effects.ErrNotFound) {
		t.Errorf("cancel missing: %v", err)
	}
}

func TestStore_TranslatesSQLErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The Store checks nothing itself: the SQL function's validation comes back
	// as a ValidationError naming the item.
	_, err := b.store.Insert(b.ctx, []effects.NewEffect{
		{SourceID: "ok", Kind: "k", Payload: json.RawMessage(`{}`)},
		{SourceID: "ok", Kind: "K", Payload: json.RawMessage(`{}`)},
	}, 0, "")
	var ve *effects.ValidationError
	if !errors.As(err, &ve) || ve.Index != 1 {
		t.Fatalf("insert with a bad kind: %v", err)
	}
	_, err = b.store.Insert(b.ctx, []effects.NewEffect{{SourceID: "ok", Kind: "k", Payload: json.RawMessage(`{"big": "` + string(make([]byte, 0)) + `xxxxxxxxxx"}`)}}, 10, "")
	if !errors.As(err, &ve) || ve.Index != 0 {
		t.Fatalf("insert over the size limit: %v", err)
	}
	n := 0
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM side_effects").Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after refused inserts = %d, %v", n, err)
	}
}

func TestNewStore_RejectsBadSchema(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"a-b", `x"; drop table y; --`, "1abc"} {
		if _, err := engine.NewStore(nil, &engine.StoreConfig{Schema: s}); err == nil {
			t.Errorf("schema %q accepted", s)
		}
	}
}

func TestStore_Stats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b,
		effects.NewEffect{SourceID: "a", Kind: "email.receipt", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "b", Kind: "email.receipt", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "a", Kind: "webhook.paid", Payload: json.RawMessage(`{}`)},
		// Scheduled an hour ahead, although created long ago: not late.
		effects.NewEffect{SourceID: "later", Kind: "sms.send", Payload: json.RawMessage(`{}`), NotBefore: time.Now().Add(time.Hour)},
	)
	// Due for 90 s: lateness counts from the due time, not from creation.
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET next_attempt_at = now() - interval '90 seconds', created_at = now() - interval '1 day' WHERE source_id = 'a' AND kind = 'email.receipt'`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET created_at = now() - interval '1 day' WHERE kind = 'sms.send'`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Cancel(b.ctx, "a", "webhook.paid"); err != nil {
		t.Fatal(err)
	}
	stats, err := b.store.Stats(b.ctx)
	if err != nil || len(stats) != 3 {
		t.Fatalf("stats = %+v, %v", stats, err)
	}
	mail, sms, hook := stats[0], stats[1], stats[2]
	// The database clock: a due time 90 s back is at least 90 s late, and
	// far less than a day.
	if mail.Kind != "email.receipt" || mail.ByState[effects.Pending] != 2 || mail.OldestPending < 90*time.Second || mail.OldestPending >= 24*time.Hour {
		t.Fatalf("email stats = %+v", mail)
	}
	if sms.Kind != "sms.send" || sms.ByState[effects.Pending] != 1 || sms.OldestPending != 0 {
		t.Fatalf("a scheduled effect counts as late: %+v", sms)
	}
	if hook.ByState[effects.Cancelled] != 1 || hook.OldestPending != 0 {
		t.Fatalf("webhook stats = %+v", hook)
	}
}

// List's filters, each alone and together, and CountMatching with them.
func TestStore_ListFilters(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	st, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var items []effects.NewEffect
	for _, s := range []string{"order-1", "order-2", "refund-1"} {
		for _, k := range []string{"email.receipt", "charge.create"} {
			items = append(items, effects.NewEffect{SourceID: s, Kind: k, Payload: json.RawMessage(`{}`)})
		}
	}
	items = append(items, effects.NewEffect{SourceID: "order-3", Kind: "email.receipt", Payload: json.RawMessage(`{}`), NotBefore: time.Now().Add(time.Hour)})
	if _, err := st.Insert(ctx, items, 0, ""); err != nil {
		t.Fatal(err)
	}
	key, _ := st.GetBySource(ctx, "order-2", "charge.create")
	now := time.Now()
	for name, c := range map[string]struct {
		f    effects.Filter
		want int
	}{
		"all":                  {effects.Filter{}, 7},
		"kind":                 {effects.Filter{Kinds: []string{"email.receipt"}}, 4},
		"source prefix":        {effects.Filter{SourcePrefix: "order-"}, 5},
		"prefix with a %":      {effects.Filter{SourcePrefix: "order%"}, 0},
		"key":                  {effects.Filter{Key: key.Key}, 1},
		"created after now":    {effects.Filter{CreatedAfter: now.Add(time.Minute)}, 0},
		"created before soon":  {effects.Filter{CreatedBefore: now.Add(time.Minute)}, 7},
		"due within a minute":  {effects.Filter{DueBefore: now.Add(time.Minute)}, 6},
		"due in half an hour+": {effects.Filter{DueAfter: now.Add(30 * time.Minute)}, 1},
		"together":             {effects.Filter{Kinds: []string{"charge.create"}, SourcePrefix: "order-", States: []effects.State{effects.Pending}}, 2},
	} {
		list, err := st.List(ctx, c.f)
		n, cerr := st.CountMatching(ctx, c.f)
		if err != nil || cerr != nil || len(list) != c.want || n != int64(c.want) {
			t.Errorf("%s: listed %d, counted %d (%v, %v), want %d", name, len(list), n, err, cerr, c.want)
		}
	}
	if _, err := st.List(ctx, effects.Filter{States: []effects.State{"lost"}}); err == nil {
		t.Error("an unknown state was accepted")
	}
}
