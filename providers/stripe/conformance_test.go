package stripe_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// stripeConformance speaks Stripe's wire format to the conformance suite:
// form-encoded requests with the key in Idempotency-Key, JSON objects and
// Stripe error objects back.
func stripeConformance() providertest.Conformance {
	return providertest.Conformance{
		New: func(t *testing.T, baseURL string) providers.Provider {
			return newProvider(t, baseURL)
		},
		Kind:       "stripe.payment_intents.create",
		Payload:    json.RawMessage(piPayload),
		BadPayload: json.RawMessage(`{"amount":"lots","unknown_field":1}`),
		Secrets:    []string{testAPIKey},
		Key:        func(r *http.Request, _ []byte) string { return r.Header.Get("Idempotency-Key") },
		Respond: func(w http.ResponseWriter, r *http.Request, a providertest.Answer) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Request-Id", "req_conformance")
			switch a {
			case providertest.AnswerOK, providertest.AnswerReplay:
				if a == providertest.AnswerReplay {
					w.Header().Set("Idempotent-Replayed", "true")
				}
				fmt.Fprintf(w, `{"id":%q,"object":"payment_intent","amount":2000,"currency":"usd","status":"requires_payment_method","livemode":false,"client_secret":"pi_x_secret_y"}`, providertest.ConformanceRef)
			case providertest.AnswerReject:
				w.WriteHeader(http.StatusPaymentRequired)
				io.WriteString(w, `{"error":{"type":"card_error","code":"card_declined","decline_code":"generic_decline","message":"Your card was declined.","charge":"ch_declined_1"}}`)
			case providertest.AnswerUnavailable:
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, `{"error":{"type":"api_error","message":"The service is temporarily unavailable."}}`)
			case providertest.AnswerRateLimited:
				w.Header().Set("Retry-After", "7")
				w.WriteHeader(http.StatusTooManyRequests)
				io.WriteString(w, `{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests hit the API too quickly."}}`)
			}
		},
	}
}

func TestConformance(t *testing.T) {
	providertest.RunConformance(t, stripeConformance())
}
