package e2e_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/providers/webhook"
)

// hostile answers in turn: accepted, a refusal that echoes the request's
// credentials back in its body, an outage that does the same, and a lost
// answer. Servers do this; sidefx must not store or log what they echo.
func hostile(t *testing.T, ok func(w http.ResponseWriter, n int64)) string {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		echo := fmt.Sprintf("you sent Authorization=%q headers=%v body=%q", r.Header.Get("Authorization"), r.Header, body)
		w.Header().Set("Content-Type", "application/json")
		switch i := n.Add(1); i % 4 {
		case 0:
			ok(w, i)
		case 1:
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":{"type":"invalid_request_error","message":%q},"errors":[{"message":%q}]}`, echo, echo)
		case 2:
			w.Header().Set("X-Debug", r.Header.Get("Authorization"))
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, echo)
		case 3:
			panic(http.ErrAbortHandler) // received, never answered
		}
	}))
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv.URL
}

// No configured secret appears in any log line, error or stored row over a
// run with all three providers, hostile servers included.
func TestE2E_NoSecretInLogsErrorsOrRows(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	const (
		stripeKey   = "sk_test_51SECRETstripeE2E0000000000"
		sendgridKey = "SG.SECRETsendgridE2E.0000000000000000"
		whSecret    = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LWZvci1lMmUtdGVzdA=="
	)
	secrets := []string{stripeKey, sendgridKey, whSecret, strings.TrimPrefix(whSecret, "whsec_"), "secret-signing-key-for-e2e-test"}

	stripeURL := hostile(t, func(w http.ResponseWriter, n int64) {
		fmt.Fprintf(w, `{"id":"pi_%d","object":"payment_intent","amount":1,"currency":"usd","status":"requires_payment_method"}`, n)
	})
	mailURL := hostile(t, func(w http.ResponseWriter, n int64) {
		w.Header().Set("X-Message-Id", fmt.Sprintf("msg_%d", n))
		w.WriteHeader(http.StatusAccepted)
	})
	hookURL := hostile(t, func(w http.ResponseWriter, n int64) { fmt.Fprintf(w, `{"id":"rcv_%d"}`, n) })

	sp, err := stripe.New(&stripe.Config{APIKey: stripeKey, BaseURL: stripeURL, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mp, err := sendgrid.New(&sendgrid.Config{APIKey: sendgridKey, BaseURL: mailURL, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wp, err := webhook.New(&webhook.Config{URL: hookURL, Secret: whSecret, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var orders []order
	for i := range 12 {
		id := fmt.Sprintf("order-%d", i)
		orders = append(orders, order{id: id, effects: []outbox.Effect{
			{SourceID: id, Kind: chargeKind, Payload: mustJSON(map[string]any{"amount": 100 + i, "currency": "usd"})},
			receipt(id),
			{SourceID: id, Kind: paidKind, Payload: mustJSON(map[string]any{"order": id})},
		}})
	}
	placeOrders(t, pool, orders)
	logs := &logBuffer{}
	fast := dispatcher.Kind{MaxAttempts: 3, Timeout: 5 * time.Second, BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}
	charge, mail, hook := fast, fast, fast
	charge.Provider, mail.Provider, hook.Provider = sp, mp, wp
	run(t, pool, &dispatcher.Config{
		Kinds:        map[string]dispatcher.Kind{chargeKind: charge, receiptKind: mail, paidKind: hook},
		PollInterval: 20 * time.Millisecond,
		Logger:       logs.logger(),
	})
	// Every effect ends somewhere: confirmed, failed (refused, or out of
	// attempts) or uncertain (the mail whose answer was lost).
	store, _ := engine.NewStore(pool, nil)
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := store.StateCounts(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if c[effects.Pending]+c[effects.Fired] == 0 && c[effects.Confirmed]+c[effects.Failed]+c[effects.Uncertain] == 36 {
			t.Logf("states: %v", c)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("effects did not settle: %v", c)
		}
		<-tick.C
	}
	all := append(append(rows(t, pool, chargeKind), rows(t, pool, receiptKind)...), rows(t, pool, paidKind)...)
	var sawFailure, sawEcho bool
	for _, e := range all {
		assertNoSecret(t, fmt.Sprintf("effect %d (%s, %s)", e.ID, e.Kind, e.State), rowText(e), secrets...)
		sawFailure = sawFailure || e.State == effects.Failed
		sawEcho = sawEcho || strings.Contains(string(e.Outcome)+e.LastError, "you sent")
	}
	if !sawFailure {
		t.Fatal("no effect failed: the hostile answers were never exercised")
	}
	text := logs.String()
	if !strings.Contains(text, `"level":"DEBUG"`) || !strings.Contains(text, "effect_id") {
		t.Fatalf("the log capture holds no dispatcher logs:\n%.2000s", text)
	}
	assertNoSecret(t, "the dispatcher's logs", text, secrets...)
	t.Logf("scanned %d rows and %d bytes of logs; a hostile echo was stored (redacted): %v", len(all), len(text), sawEcho)
}
