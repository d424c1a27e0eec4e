package stripe_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// stripeConformance speaks Stripe's wire format to the conformance suite:
// form-encoded requests with the key in Idempotency-Key, JSON objects and
// Stripe error objects back, each carrying the suite's echo of the request
// (the API key in its Authorization header) in Request-Id and the message.
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
		// A card decline is stored under the key and replayed.
		RejectSpeaks: providers.ForKey,
		Respond: func(w http.ResponseWriter, r *http.Request, a providertest.Answer, echo string) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Request-Id", echo)
			fail := func(status int, typ, code, msg string) {
				b, _ := json.Marshal(map[string]any{"error": map[string]string{"type": typ, "code": code, "message": msg + ": " + echo, "param": echo}})
				w.WriteHeader(status)
				w.Write(b)
			}
			switch a {
			case providertest.AnswerOK, providertest.AnswerReplay:
				if a == providertest.AnswerReplay {
					w.Header().Set("Idempotent-Replayed", "true")
				}
				fmt.Fprintf(w, `{"id":%q,"object":"payment_intent","amount":2000,"currency":"usd","status":"requires_payment_method","livemode":false,"client_secret":"pi_x_secret_y","description":%q}`, providertest.ConformanceRef, echo)
			case providertest.AnswerReject:
				fail(http.StatusPaymentRequired, "card_error", "card_declined", "Your card was declined.")
			case providertest.AnswerUnauthorized:
				fail(http.StatusUnauthorized, "invalid_request_error", "", "Invalid API Key provided")
			case providertest.AnswerForbidden:
				fail(http.StatusForbidden, "invalid_request_error", "", "The provided key does not have the required permissions for this endpoint")
			case providertest.AnswerNotFound:
				fail(http.StatusNotFound, "invalid_request_error", "", "Unrecognized request URL (POST: /v1/payment_intents)")
			case providertest.AnswerInvalid:
				fail(http.StatusBadRequest, "invalid_request_error", "parameter_invalid_integer", "Invalid integer: amount")
			case providertest.AnswerUnavailable:
				fail(http.StatusServiceUnavailable, "api_error", "", "The service is temporarily unavailable.")
			case providertest.AnswerServerError:
				fail(http.StatusInternalServerError, "api_error", "", "Something went wrong on Stripe's end.")
			case providertest.AnswerConflict:
				fail(http.StatusConflict, "idempotency_error", "idempotency_key_in_use", "There is currently another in-progress request using this Idempotent Key")
			case providertest.AnswerSeeOther:
				w.WriteHeader(http.StatusSeeOther)
				fmt.Fprintf(w, `{"message":%q}`, echo)
			case providertest.AnswerRateLimited:
				w.Header().Set("Retry-After", "7")
				fail(http.StatusTooManyRequests, "invalid_request_error", "rate_limit", "Too many requests hit the API too quickly.")
			}
		},
	}
}

func TestConformance(t *testing.T) {
	providertest.RunConformance(t, stripeConformance())
}
