package stripe_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/stripe"
)

// captureLogger records everything stripe-go logs, at every level.
type captureLogger struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *captureLogger) logf(level, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.buf, level+" "+format+"\n", v...)
}

func (l *captureLogger) Debugf(format string, v ...any) { l.logf("debug", format, v...) }
func (l *captureLogger) Infof(format string, v ...any)  { l.logf("info", format, v...) }
func (l *captureLogger) Warnf(format string, v ...any)  { l.logf("warn", format, v...) }
func (l *captureLogger) Errorf(format string, v ...any) { l.logf("error", format, v...) }

func (l *captureLogger) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// resultText is everything of a Result that is stored.
func resultText(r providers.Result) string {
	text := r.Ref + " " + string(r.Detail)
	if r.Err != nil {
		text += " " + r.Err.Error()
	}
	return text
}

// The API key appears in no Result and in nothing stripe-go logs, even at
// debug level, whatever the answer.
func TestSecrets_KeyNeverInResultsOrLogs(t *testing.T) {
	t.Parallel()
	s := newFakeStripe(t)
	var log captureLogger
	p, err := stripe.NewWithLogger(&stripe.Config{APIKey: testAPIKey, BaseURL: s.URL, Timeout: 200 * time.Millisecond}, &log)
	if err != nil {
		t.Fatal(err)
	}
	var results []providers.Result
	do := func(c providers.Call) {
		results = append(results, p.Call(testCtx(t), c))
	}
	c := call("order-s", "stripe.payment_intents.create", piPayload)
	do(c) // confirmed
	do(c) // replayed
	c.Payload = []byte(`{"amount":1,"currency":"usd"}`)
	do(c) // idempotency_error
	for _, a := range []scripted{
		{status: 402, body: `{"error":{"type":"card_error","code":"card_declined","decline_code":"do_not_honor","message":"Your card was declined."}}`},
		{status: 500, body: stripeError("api_error", "", "Something went wrong.")},
		{status: 429, header: map[string]string{"Retry-After": "1"}, body: stripeError("invalid_request_error", "rate_limit", "Slow down.")},
		{status: 503, body: "<html>down</html>"},
		{status: 200, body: `{"id":`},
	} {
		s.answer(a)
		do(call("order-"+fmt.Sprint(a.status), "stripe.charges.create", `{"amount":100,"currency":"usd","source":"tok_visa"}`))
	}
	s.stallNext()
	do(call("order-timeout", "stripe.customers.create", `{"email":"a@example.com"}`))
	do(call("order-bad", "stripe.refunds.create", `{"amount":"lots"}`))
	do(call("order-op", "stripe.invoices.pay", `{}`))

	refused, err := stripe.NewWithLogger(&stripe.Config{APIKey: testAPIKey, BaseURL: "http://" + freeAddr(t)}, &log)
	if err != nil {
		t.Fatal(err)
	}
	results = append(results, refused.Call(testCtx(t), call("order-r", "stripe.customers.create", `{}`)))

	classes := map[providers.Class]int{}
	for _, r := range results {
		classes[r.Class]++
		if strings.Contains(resultText(r), testAPIKey) {
			t.Fatalf("a %s result holds the API key: %s", r.Class, resultText(r))
		}
	}
	for _, c := range []providers.Class{providers.Confirmed, providers.Rejected, providers.Retryable, providers.Unknown} {
		if classes[c] == 0 {
			t.Fatalf("no %s result among %v: the scan missed a class", c, classes)
		}
	}
	if logs := log.String(); logs == "" || strings.Contains(logs, testAPIKey) {
		t.Fatalf("stripe-go's logs (%d bytes) hold the API key, or were not captured:\n%s", len(logs), logs)
	}
	// The key did go where it belongs.
	if got := s.requests()[0].Auth; got != "Bearer "+testAPIKey {
		t.Fatalf("Authorization %q", got)
	}
}

// A peer that echoes the key back (stripe-mock quotes the Authorization
// header of a key it finds malformed; real Stripe masks it) does not get it
// into a Result.
func TestSecrets_EchoedKeyIsRedacted(t *testing.T) {
	t.Parallel()
	const key = "sk_live_51SidefxLiveKeyNotForStripeMock" // stripe-mock takes only sk_test_… keys
	t.Run("stripe-mock", func(t *testing.T) {
		t.Parallel()
		p, err := stripe.New(&stripe.Config{APIKey: key, BaseURL: startStripeMock(t)})
		if err != nil {
			t.Fatal(err)
		}
		r := p.Call(testCtx(t), call("order-e", "stripe.customers.create", `{"email":"a@example.com"}`))
		if !r.IsRejected() || !strings.Contains(r.Err.Error(), "[redacted]") {
			t.Fatalf("got %s (%v), want a rejected 401 whose echo of the key was redacted", r.Class, r.Err)
		}
		if strings.Contains(resultText(r), key) {
			t.Fatalf("the result holds the key: %s", resultText(r))
		}
		var apiErr *stripe.APIError
		if !errors.As(r.Err, &apiErr) || apiErr.Status != 401 || !strings.Contains(apiErr.Message, "Bearer [redacted]") {
			t.Fatalf("error %v: want an *APIError, status 401, with the quoted key redacted", r.Err)
		}
	})
	t.Run("scripted", func(t *testing.T) {
		t.Parallel()
		s := newFakeStripe(t)
		s.answer(scripted{status: 401, body: stripeError("invalid_request_error", "", "Invalid API Key provided: "+testAPIKey)})
		r := newProvider(t, s.URL).Call(testCtx(t), call("order-e", "stripe.customers.create", `{}`))
		if !r.IsRejected() || strings.Contains(resultText(r), testAPIKey) || !strings.Contains(string(r.Detail), "[redacted]") {
			t.Fatalf("got %s: %s", r.Class, resultText(r))
		}
	})
	t.Run("errors.Is survives redaction", func(t *testing.T) {
		t.Parallel()
		// A key that happens to be in a transport error's text: the text
		// is redacted, the error still answers errors.Is for its cause.
		p, err := stripe.New(&stripe.Config{APIKey: "127.0.0.1", BaseURL: "http://" + freeAddr(t)})
		if err != nil {
			t.Fatal(err)
		}
		r := p.Call(testCtx(t), call("order-e", "stripe.customers.create", `{}`))
		if !r.IsRetryable() || strings.Contains(resultText(r), "127.0.0.1") || !errors.Is(r.Err, syscall.ECONNREFUSED) {
			t.Fatalf("got %s: %s", r.Class, resultText(r))
		}
	})
}
