package drivertest_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/sidefx/sidefx/inbox"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// The inbox over database/sql with lib/pq: first delivery, redelivery with
// the recorded result, and a mismatch read from lib/pq's error.
func TestInbox_LibPQ(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("postgres", pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	deliver := func(payload string) (inbox.Receipt, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := inbox.Once(ctx, tx, inbox.Message{Consumer: "billing", ID: "evt_1", Payload: []byte(payload)})
		if err != nil {
			tx.Rollback()
			return r, err
		}
		if r.First {
			if err := r.Record(ctx, tx, map[string]string{"invoice": "inv_1"}); err != nil {
				t.Fatal(err)
			}
		}
		return r, tx.Commit()
	}
	first, err := deliver("p")
	if err != nil || !first.First {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := deliver("p")
	if err != nil || again.First || string(again.Result) != `{"invoice": "inv_1"}` || !again.ReceivedAt.Equal(first.ReceivedAt) {
		t.Fatalf("redelivery: %+v (%s) %v", again, again.Result, err)
	}
	_, err = deliver("q")
	var pm *inbox.PayloadMismatchError
	if !errors.As(err, &pm) || pm.StoredHash == "" || pm.NewHash == "" {
		t.Fatalf("another payload: %v", err)
	}
}
