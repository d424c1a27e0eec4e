package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/lab/peers"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/webhook"
)

const (
	receiptKind = "email.receipt"
	paidKind    = "webhook.order_paid"
)

func receipt(orderID string) outbox.Effect {
	return outbox.Effect{SourceID: orderID, Kind: receiptKind, Payload: mustJSON(map[string]any{
		"personalizations": []map[string]any{{"to": []map[string]string{{"email": "buyer@example.com"}}}},
		"from":             map[string]string{"email": "shop@example.com"},
		"subject":          "Your order " + orderID,
		"content":          []map[string]string{{"type": "text/plain", "value": "Thank you for order " + orderID}},
	})}
}

func TestE2E_SendGrid_AgainstPrism(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	root, err := peers.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	base := peers.Prism(t, filepath.Join(root, "providers", "sendgrid", "testdata", "mail_send.oas.json"))
	var orders []order
	for i := range 10 {
		id := fmt.Sprintf("order-%d", i)
		orders = append(orders, order{id: id, effects: []outbox.Effect{receipt(id)}})
	}
	placeOrders(t, pool, orders)
	p, err := sendgrid.New(&sendgrid.Config{APIKey: "SG.e2e-test-key", BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	run(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{receiptKind: {Provider: p}}})
	waitStates(t, pool, receiptKind, map[effects.State]int{effects.Confirmed: 10})
	for _, e := range rows(t, pool, receiptKind) {
		if e.ProviderRef == "" || e.Attempts != 1 {
			t.Fatalf("confirmed email: ref %q attempts %d", e.ProviderRef, e.Attempts)
		}
	}
}

// receiver is a webhook endpoint that verifies every delivery with the
// Standard Webhooks reference library and dedupes on webhook-id.
type receiver struct {
	wh        *standardwebhooks.Webhook
	mu        sync.Mutex
	seen      map[string]int // webhook-id → deliveries
	bad       int
	idemMatch bool
}

func newReceiver(t *testing.T, secret string) (*receiver, string) {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{wh: wh, seen: map[string]int{}, idemMatch: true}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if err := rc.wh.Verify(body, r.Header); err != nil {
			rc.bad++
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		id := r.Header.Get("webhook-id")
		rc.idemMatch = rc.idemMatch && r.Header.Get("Idempotency-Key") == id
		rc.seen[id]++
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"rcv_%d"}`, len(rc.seen))
	}))
	t.Cleanup(srv.Close)
	return rc, srv.URL
}

func TestE2E_Webhook_SignedDeliveries(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	rc, url := newReceiver(t, secret)
	var orders []order
	for i := range 50 {
		id := fmt.Sprintf("order-%d", i)
		orders = append(orders, order{id: id, effects: []outbox.Effect{{SourceID: id, Kind: paidKind,
			Payload: mustJSON(map[string]any{"type": "order.paid", "order": id, "note": "ünïcødé \"quoted\" <b>"})}}})
	}
	placeOrders(t, pool, orders)
	p, err := webhook.New(&webhook.Config{URL: url, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	run(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{paidKind: {Provider: p}}})
	waitStates(t, pool, paidKind, map[effects.State]int{effects.Confirmed: 50})
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.bad != 0 || !rc.idemMatch {
		t.Fatalf("%d deliveries failed verification; Idempotency-Key matched webhook-id: %v", rc.bad, rc.idemMatch)
	}
	for _, e := range rows(t, pool, paidKind) {
		if rc.seen[e.Key] != 1 || e.ProviderRef == "" {
			t.Fatalf("effect %s: delivered %d times, ref %q", e.Key, rc.seen[e.Key], e.ProviderRef)
		}
		var body map[string]any
		if json.Unmarshal(e.Payload, &body) != nil || body["order"] != e.SourceID {
			t.Fatalf("payload %s", e.Payload)
		}
	}
}
