package e2e_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/edge"
	"github.com/sidefx/sidefx/inbox"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// consumerRole is a fresh producer role: its grants include the inbox's
// and the edge's tables (sidefx roles, producer-role.sql).
func consumerRole(t *testing.T, owner *pgxpool.Pool) (*pgxpool.Pool, string) {
	t.Helper()
	return pgtest.Role(t, owner, owner.Config().ConnString(), "producer")
}

// Two services on one database, each under its own role with the inbox's
// and the edge's tables granted: neither reads, forges or changes the
// other's records (schema 28). A record the other holds is refused loudly,
// never taken for a redelivery or a replay; the daemon's reaper and an
// operator still see every record.
func TestE2E_InboxAndEdgeRecordsArePerProducer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, pools, _ := pgtest.Roles(t, "daemon", "operator")
	a, roleA := consumerRole(t, owner)
	b, _ := consumerRole(t, owner)
	in, err := inbox.New(&inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}

	// A records message m-1 of consumer billing: a record B's consumer of
	// that name would take for a redelivery, skipping the message.
	once := func(pool *pgxpool.Pool, consumer, id string) (inbox.Receipt, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		r, err := in.Once(ctx, tx, inbox.Message{Consumer: consumer, ID: id, Payload: []byte(`{}`)})
		if err != nil {
			return r, err
		}
		return r, tx.Commit(ctx)
	}
	if r, err := once(a, "billing", "m-1"); err != nil || !r.First {
		t.Fatalf("A's first delivery: %+v %v", r, err)
	}
	if _, err := once(b, "billing", "m-1"); !errors.Is(err, inbox.ErrOtherProducer) {
		t.Fatalf("B's delivery of a message A recorded: %v, want ErrOtherProducer", err)
	}
	if r, err := once(a, "billing", "m-1"); err != nil || r.First || r.Deliveries != 2 {
		t.Fatalf("A's redelivery: %+v %v", r, err)
	}
	// B sees none of A's records, cannot write one in A's name, nor change
	// or claim A's.
	var n int
	if err := b.QueryRow(ctx, `SELECT count(*) FROM sidefx_inbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("B reads %d inbox records (%v), want 0", n, err)
	}
	if _, err := b.Exec(ctx, `INSERT INTO sidefx_inbox (consumer, message_id, payload_hash, expires_at, recorded_by) VALUES ('billing', 'm-2', '\x00', now() + interval '1 day', $1)`, roleA); err != nil {
		t.Fatal(err)
	}
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM sidefx_inbox WHERE recorded_by = $1`, roleA).Scan(&n); err != nil || n != 1 {
		t.Fatalf("records in A's name: %d (%v), want only A's own: B's insert is stamped with B's role", n, err)
	}
	if tag, err := b.Exec(ctx, `UPDATE sidefx_inbox SET result = '"forged"', recorded_by = NULL`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("B updates %v (%v), want its own record only", tag, err)
	}
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM sidefx_inbox WHERE recorded_by IS NULL OR (recorded_by = $1 AND result IS NOT NULL)`, roleA).Scan(&n); err != nil || n != 0 {
		t.Fatalf("records made public or A's changed: %d (%v)", n, err)
	}

	// The edge: A answers key k-1 on POST /orders; B, on the same route,
	// neither replays A's answer nor executes.
	serve := func(pool *pgxpool.Pool, answer string) (int, string) {
		e, err := edge.New(&edge.Config{Pool: pool})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		mux := http.NewServeMux()
		mux.Handle("POST /orders", e.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, answer)
		})))
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k-1")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	if code, body := serve(a, "A's order"); code != http.StatusCreated || body != "A's order" {
		t.Fatalf("A's request: %d %q", code, body)
	}
	if code, body := serve(b, "B's order"); code != http.StatusConflict || strings.Contains(body, "order") {
		t.Fatalf("B's request under A's key: %d %q, want 409 without either answer", code, body)
	}
	if code, body := serve(a, "again"); code != http.StatusCreated || body != "A's order" {
		t.Fatalf("A's retry: %d %q, want A's stored answer", code, body)
	}

	// A record of before schema 28 (no holder) can be taken over, but not
	// renamed or made to expire sooner: its service would handle its
	// message again (schema 29).
	if _, err := owner.Exec(ctx, `ALTER TABLE sidefx_inbox DISABLE TRIGGER sidefx_inbox_rules;
		UPDATE sidefx_inbox SET recorded_by = NULL WHERE message_id = 'm-1';
		ALTER TABLE sidefx_inbox ENABLE TRIGGER sidefx_inbox_rules`); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE sidefx_inbox SET message_id = 'moved-' || message_id WHERE recorded_by IS NULL`,
		`UPDATE sidefx_inbox SET consumer = 'other' WHERE recorded_by IS NULL`,
		`UPDATE sidefx_inbox SET expires_at = now() - interval '1 day' WHERE recorded_by IS NULL`,
	} {
		if _, err := b.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "never change") {
			t.Errorf("B: %s: %v, want it refused", q, err)

		}
	}
	if r, err := once(a, "billing", "m-1"); err != nil || r.First {
		t.Fatalf("A's redelivery of its record of before schema 28: %+v %v, want a redelivery", r, err)
	}
	// The same for an edge key of before schema 28, not expired: neither
	// its key, nor its request, nor its claim changes.
	if _, err := owner.Exec(ctx, `ALTER TABLE sidefx_edge_keys DISABLE TRIGGER sidefx_edge_keys_rules;
		UPDATE sidefx_edge_keys SET recorded_by = NULL;
		ALTER TABLE sidefx_edge_keys ENABLE TRIGGER sidefx_edge_keys_rules`); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE sidefx_edge_keys SET key = 'moved-' || key WHERE recorded_by IS NULL`,
		`UPDATE sidefx_edge_keys SET fingerprint = '\x00' WHERE recorded_by IS NULL`,
		`UPDATE sidefx_edge_keys SET claim = '\x00' WHERE recorded_by IS NULL`,
		`UPDATE sidefx_edge_keys SET expires_at = now() - interval '1 day' WHERE recorded_by IS NULL`,
	} {
		if _, err := b.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "never change") {
			t.Errorf("B: %s: %v, want it refused", q, err)
		}
	}

	// An operator reads every record; the reaper deletes every expired one.
	if err := pools["operator"].QueryRow(ctx, `SELECT (SELECT count(*) FROM sidefx_inbox) + (SELECT count(*) FROM sidefx_edge_keys)`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("the operator reads %d records (%v), want 3", n, err)
	}
	if _, err := owner.Exec(ctx, `UPDATE sidefx_inbox SET expires_at = now() - interval '1 second'; UPDATE sidefx_edge_keys SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	// The daemon's own reaper, as the daemon's role (it locks what it
	// deletes: schema 29 grants what that needs).
	eng, err := engine.New(pools["daemon"], "")
	if err != nil {
		t.Fatal(err)
	}
	inboxGone, err := eng.TrimInbox(ctx, 100)
	if err != nil {
		t.Fatalf("the reaper, as the daemon's role, on the inbox: %v", err)
	}
	edgeGone, err := eng.TrimEdge(ctx, 100)
	if err != nil {
		t.Fatalf("the reaper, as the daemon's role, on the edge's keys: %v", err)
	}
	gone := inboxGone + edgeGone
	if gone != 3 {
		t.Fatalf("the daemon's role deleted %d expired records, want 3", gone)
	}
}
