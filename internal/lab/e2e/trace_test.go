package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/lab/peers"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/providers/webhook"
)

// A trace runs from an HTTP request through enqueue to the provider calls:
// the service's handler span (continuing the client's traceparent) is the
// parent of, and linked from, each effect's dispatch span, whose children
// are the provider's HTTP requests, carrying the derived key. Stripe is
// stripe-mock, the webhook a receiver that verifies signatures. No secret
// — API key, signing secret, header token, URL query or path token —
// reaches a span. An effect enqueued without a span is dispatched in a
// trace of its own.
func TestE2E_TraceFromRequestToProviderCall(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tracer := tp.Tracer("the-service")

	const (
		apiKey      = "sk_test_SECRETtraceKEY0123456789"
		secret      = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		headerToken = "Bearer SECREThdrTOKEN"
		queryToken  = "SECRETqueryTOKEN"
		pathToken   = "SECRETpathTOKEN"
	)
	rc, hookURL := newReceiver(t, secret)
	sp, err := stripe.New(&stripe.Config{APIKey: apiKey, BaseURL: peers.StripeMock(t), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wp, err := webhook.New(&webhook.Config{URL: hookURL + "/hooks/" + pathToken + "?token=" + queryToken, Secret: secret,
		Headers: map[string]string{"Authorization": headerToken}})
	if err != nil {
		t.Fatal(err)
	}

	// The service: its handler continues the caller's trace and enqueues
	// two effects in its transaction.
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		tx, err := pool.Begin(ctx)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer tx.Rollback(ctx) //nolint:errcheck // committed below
		for _, e := range []outbox.Effect{
			{SourceID: "order-1", Kind: chargeKind, Payload: mustJSON(map[string]any{"amount": 1000, "currency": "usd", "payment_method_types": []string{"card"}})},
			{SourceID: "order-1", Kind: paidKind, Payload: mustJSON(map[string]any{"type": "order.paid", "order": "order-1"})},
		} {
			if _, err := outbox.Enqueue(ctx, tx, e); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
		}
		if err := tx.Commit(ctx); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer svc.Close()

	// The client's request, under its own span.
	ctx, client := tracer.Start(context.Background(), "client", trace.WithSpanKind(trace.SpanKindClient))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, svc.URL+"/orders", nil)
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	client.End()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /orders: %s", resp.Status)
	}
	// And one effect enqueued with no span at all.
	if _, err := outbox.Enqueue(context.Background(), pool, outbox.Effect{SourceID: "order-2", Kind: paidKind,
		Payload: mustJSON(map[string]any{"type": "order.paid", "order": "order-2"})}); err != nil {
		t.Fatal(err)
	}

	run(t, pool, &dispatcher.Config{TracerProvider: tp, Kinds: map[string]dispatcher.Kind{
		chargeKind: {Provider: sp, Timeout: 10 * time.Second},
		paidKind:   {Provider: wp},
	}})
	waitStates(t, pool, chargeKind, map[effects.State]int{effects.Confirmed: 1})
	waitStates(t, pool, paidKind, map[effects.State]int{effects.Confirmed: 2})

	byKey := map[string]*effects.Effect{}
	for _, kind := range []string{chargeKind, paidKind} {
		for _, e := range rows(t, pool, kind) {
			byKey[e.Key] = e
		}
	}
	// One dispatch span per attempt: a legitimate retry (a call that timed
	// out on a loaded machine) adds one. The spans checked are each
	// effect's last attempt's, which ends once its outcome is recorded (the
	// states above may show it a moment before).
	attr := func(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
		for _, a := range s.Attributes() {
			if a.Key == k {
				return a.Value
			}
		}
		return attribute.Value{}
	}
	last := func(spans []sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
		out := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range spans {
			if !strings.HasPrefix(s.Name(), "sidefx.dispatch ") {
				continue
			}
			key := attr(s, providers.KeyAttribute).AsString()
			if e := byKey[key]; e != nil && int(attr(s, "sidefx.attempt").AsInt64()) == e.Attempts {
				out[key] = s
			}
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	var spans []sdktrace.ReadOnlySpan
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		spans = rec.Ended()
		if n := len(last(spans)); n == len(byKey) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the last attempts of %d effects have ended dispatch spans, want %d", n, len(byKey))
		}
		<-tick.C
	}

	var handler sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "POST /orders" {
			handler = s
		}
	}
	if handler == nil || handler.Parent().SpanID() != client.SpanContext().SpanID() {
		t.Fatalf("the handler's span does not continue the client's trace")
	}
	dispatches := 0
	for _, d := range spans {
		if !strings.HasPrefix(d.Name(), "sidefx.dispatch ") {
			continue
		}
		dispatches++
		key := attr(d, providers.KeyAttribute).AsString()
		e := byKey[key]
		if e == nil {
			t.Fatalf("dispatch span %q carries key %q, no effect's", d.Name(), key)
		}
		if d.Name() != "sidefx.dispatch "+e.Kind || d.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %q (%v) for an effect of %s", d.Name(), d.SpanKind(), e.Kind)
		}
		if e.SourceID == "order-2" {
			if e.Traceparent != "" || d.Parent().IsValid() || len(d.Links()) != 0 {
				t.Errorf("the effect enqueued without a span: traceparent %q, dispatch parent %v, links %d", e.Traceparent, d.Parent(), len(d.Links()))
			}
		} else {
			if want := fmt.Sprintf("00-%s-%s-01", handler.SpanContext().TraceID(), handler.SpanContext().SpanID()); e.Traceparent != want {
				t.Errorf("effect %s stored traceparent %q, want the handler's %q", e.Kind, e.Traceparent, want)
			}
			if d.SpanContext().TraceID() != handler.SpanContext().TraceID() || d.Parent().SpanID() != handler.SpanContext().SpanID() {
				t.Errorf("dispatch of %s is not the handler span's child: trace %s parent %s", e.Kind, d.SpanContext().TraceID(), d.Parent().SpanID())
			}
			if len(d.Links()) != 1 || d.Links()[0].SpanContext.SpanID() != handler.SpanContext().SpanID() {
				t.Errorf("dispatch of %s: links %v, want one to the handler's span", e.Kind, d.Links())
			}
		}
		if last(spans)[key] != d {
			continue // an earlier attempt's: its answer and calls are another's
		}
		if got := attr(d, "sidefx.state").AsString(); got != string(effects.Confirmed) {
			t.Errorf("dispatch of %s records state %q", e.Kind, got)
		}
		// Its provider's HTTP requests are its children, with the key.
		var calls int
		for _, h := range spans {
			if h.Parent().SpanID() != d.SpanContext().SpanID() {
				continue
			}
			calls++
			if h.SpanKind() != trace.SpanKindClient || h.Name() != http.MethodPost || attr(h, providers.KeyAttribute).AsString() != key ||
				attr(h, "http.response.status_code").AsInt64() != 200 {
				t.Errorf("HTTP span of %s: %q %v key %q status %d", e.Kind, h.Name(), h.SpanKind(), attr(h, providers.KeyAttribute).AsString(), attr(h, "http.response.status_code").AsInt64())
			}
		}
		if calls != 1 {
			t.Errorf("dispatch of %s has %d HTTP child spans, want 1", e.Kind, calls)
		}
	}
	if dispatches < len(byKey) {
		t.Errorf("%d dispatch spans, want at least %d (one per attempt)", dispatches, len(byKey))
	}

	var all strings.Builder
	for _, s := range spans {
		fmt.Fprintln(&all, s.Name(), s.Status(), s.Attributes(), s.Events(), s.Links())
	}
	assertNoSecret(t, "the spans", all.String(), apiKey, strings.TrimPrefix(secret, "whsec_"), headerToken, "SECREThdrTOKEN", queryToken, pathToken)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.bad != 0 {
		t.Errorf("%d webhook deliveries failed verification", rc.bad)
	}
}
