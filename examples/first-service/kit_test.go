package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/providers/providertest"
	"github.com/sidefx/sidefx/sidefxtest"
)

// The service's own test, as a team writes it with sidefx's test kit: an
// order enqueues its charge and its receipt (RequireEnqueued), a refused
// order enqueues nothing, and one pass of a dispatcher with fake providers
// (Drain) settles the two effects there are, each called once.
func TestOrders_WithTheKit(t *testing.T) {
	ctx := context.Background()
	pool := sidefxtest.DB(t)
	h, err := setup(ctx, pool, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(key, body string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("order-key-1", `{"email":"a@example.com","amount_cents":1200,"currency":"eur"}`); code != http.StatusCreated {
		t.Fatalf("POST /orders: %d", code)
	}
	if code := post("order-key-2", `{"email":"","amount_cents":0}`); code != http.StatusUnprocessableEntity {
		t.Fatalf("POST /orders of a bad order: %d", code)
	}
	var id string
	if err := pool.QueryRow(ctx, `SELECT id FROM shop_orders`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	charge := sidefxtest.RequireEnqueued(t, pool, id, "charge.payment_intents.create")
	if !bytes.Contains(charge.Payload, []byte(`"amount": 1200`)) {
		t.Errorf("the charge's payload: %s", charge.Payload)
	}
	sidefxtest.RequireEnqueued(t, pool, id, "email.receipt")

	stripe := providertest.New(providertest.Config{Name: "stripe", Idempotent: true})
	mail := providertest.New(providertest.Config{Name: "sendgrid"})
	done := sidefxtest.Drain(t, pool, map[string]dispatcher.Kind{
		"charge.payment_intents.create": {Provider: stripe, Timeout: time.Second},
		"email.receipt":                 {Provider: mail, Timeout: time.Second},
	})
	for _, e := range done {
		if e.State != effects.Confirmed {
			t.Errorf("%s of order %s: %s", e.Kind, e.SourceID, e.State)
		}
	}
	if len(done) != 2 || len(stripe.AllCalls()) != 1 || len(mail.AllCalls()) != 1 {
		t.Errorf("%d effects drained, %d charge calls, %d mails; want 2, 1, 1", len(done), len(stripe.AllCalls()), len(mail.AllCalls()))
	}
}
