package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/webhook"
)

// A receiver verifies each delivery with the Standard Webhooks reference
// library and dedupes on webhook-id; sidefx delivers an effect twice (a
// retry after a lost answer, say) and the second delivery is absorbed.
func Example_receiver() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" // shared with the receiver

	// The receiver.
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]string{} // webhook-id → the receiver's own id; a table in real life
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		if err := wh.Verify(body, r.Header); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		id := r.Header.Get("webhook-id")
		ref, dup := seen[id]
		if dup {
			w.Header().Set("Idempotent-Replayed", "true")
		} else {
			ref = fmt.Sprintf("evt_%d", len(seen)+1)
			seen[id] = ref
			fmt.Printf("receiver: verified and processed %s\n", body)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"id": ref})
	}))
	defer srv.Close()

	// sidefx's side.
	p, err := webhook.New(&webhook.Config{Name: "webhook.orders", URL: srv.URL, Secret: secret})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	call := providers.Call{
		EffectID: 1,
		SourceID: "order-42",
		Kind:     "order.paid",
		Key:      derive.Key("order-42", "order.paid"),
		Payload:  json.RawMessage(`{"order":"42","amount":1200}`),
		Attempt:  1,
	}
	for attempt := 1; attempt <= 2; attempt++ {
		call.Attempt = attempt
		r := p.Call(context.Background(), call)
		fmt.Printf("attempt %d: %s ref=%s replayed=%t\n", attempt, r.Class, r.Ref, r.Replayed)
	}
	// Output:
	// receiver: verified and processed {"order":"42","amount":1200}
	// attempt 1: confirmed ref=evt_1 replayed=false
	// attempt 2: confirmed ref=evt_1 replayed=true
}
