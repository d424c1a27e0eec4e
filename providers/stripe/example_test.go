package stripe_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/stripe"
)

// A PaymentIntent created once, then the same call again (a retry after a
// lost answer): Stripe replays its first answer for the key, and the
// provider reports the replay.
func Example() {
	// A stand-in for api.stripe.com that keeps idempotency keys.
	var mu sync.Mutex
	seen := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		if seen[key] {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		seen[key] = true
		w.Header().Set("Request-Id", "req_example")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"pi_3Pexample","object":"payment_intent","amount":2000,"currency":"usd","status":"requires_payment_method","livemode":false}`)
	}))
	defer srv.Close()

	p, err := stripe.New(&stripe.Config{APIKey: "sk_test_example", BaseURL: srv.URL})
	if err != nil {
		fmt.Println(err)
		return
	}
	kind := "stripe.payment_intents.create"
	call := providers.Call{
		EffectID: 1,
		SourceID: "order-1042",
		Kind:     kind,
		Key:      derive.Key("order-1042", kind),
		Payload:  json.RawMessage(`{"amount":2000,"currency":"usd","payment_method_types":["card"]}`),
		Attempt:  1,
	}
	res := p.Call(context.Background(), call)
	fmt.Println(res.Class, res.Ref, res.Replayed)

	call.Attempt = 2
	res = p.Call(context.Background(), call)
	fmt.Println(res.Class, res.Ref, res.Replayed)
	fmt.Println(string(res.Detail))
	// Output:
	// confirmed pi_3Pexample false
	// confirmed pi_3Pexample true
	// {"id":"pi_3Pexample","object":"payment_intent","status":"requires_payment_method","amount":2000,"currency":"usd","livemode":false,"replayed":true,"request_id":"req_example"}
}

// Stripe's refusals are Rejected with the error kept as Detail; an
// idempotency key reused with other parameters also wraps
// ErrIdempotencyMismatch, for an alarm.
func ExampleProvider_Call_rejected() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Request-Id", "req_decline")
		w.WriteHeader(http.StatusPaymentRequired)
		io.WriteString(w, `{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"Your card has insufficient funds."}}`)
	}))
	defer srv.Close()

	p, err := stripe.New(&stripe.Config{APIKey: "sk_test_example", BaseURL: srv.URL})
	if err != nil {
		fmt.Println(err)
		return
	}
	res := p.Call(context.Background(), providers.Call{
		SourceID: "order-1043",
		Kind:     "stripe.charges.create",
		Key:      derive.Key("order-1043", "stripe.charges.create"),
		Payload:  json.RawMessage(`{"amount":2000,"currency":"usd","source":"tok_chargeDeclinedInsufficientFunds"}`),
	})
	fmt.Println(res.Class, errors.Is(res.Err, stripe.ErrIdempotencyMismatch))
	fmt.Println(res.Err)
	fmt.Println(string(res.Detail))
	// Output:
	// rejected false
	// stripe charges.create: status 402, card_error, card_declined, decline_code insufficient_funds, request req_decline: Your card has insufficient funds.
	// {"status":402,"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"Your card has insufficient funds.","request_id":"req_decline"}
}
