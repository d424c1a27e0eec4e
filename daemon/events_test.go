package daemon

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/httpbound"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/reconcile"
)

// The daemon's event endpoint takes SendGrid's and Stripe's deliveries,
// signed as they sign them, stores each sidefx event once, refuses what does
// not verify; reconciliation then settles exactly the effects the events
// name.
func TestEvents_EndpointStoresAndReconcileSettles(t *testing.T) {
	t.Parallel()
	c, pool, store := newCLI(t)
	ctx := context.Background()
	for _, s := range []string{"order-1", "order-2"} {
		c.ok("enqueue", "--any-kind", "--source", s, "--kind", "email.receipt", "--payload", `{}`)
	}
	sent := operate(t, c.eng, "email.receipt", effects.Uncertain)
	other := operate(t, c.eng, "email.receipt", effects.Uncertain)

	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pub := base64.StdEncoding.EncodeToString(der)
	sg, err := sendgrid.NewEvents(pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	const whsec = "whsec_daemon_test_secret"
	st, _ := stripe.NewEvents(whsec)
	srv := httptest.NewServer(eventsHandlerMux(pool, map[string]providers.EventSource{"mail": sg, "stripe": st}))
	defer srv.Close()
	post := func(path string, h http.Header, body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	signSG := func(body string) http.Header {
		ts := fmt.Sprint(time.Now().Unix())
		h := sha256.Sum256([]byte(ts + body))
		sig, _ := ecdsa.SignASN1(rand.Reader, key, h[:])
		return http.Header{"X-Twilio-Email-Event-Webhook-Signature": {base64.StdEncoding.EncodeToString(sig)}, "X-Twilio-Email-Event-Webhook-Timestamp": {ts}}
	}
	events := fmt.Sprintf(`[{"event":"processed","sg_event_id":"e1","sg_message_id":"msg-1.filter.0","timestamp":%d,"sidefx_key":%q},
		{"event":"delivered","sg_event_id":"e2","sg_message_id":"msg-1.filter.0","timestamp":%d,"sidefx_key":%q},
		{"event":"delivered","sg_event_id":"e3","sg_message_id":"msg-9.filter.0","timestamp":%d}]`,
		time.Now().Unix(), sent.Key, time.Now().Unix(), sent.Key, time.Now().Unix())
	for i, want := range []string{`"stored":2`, `"stored":0`} { // delivered twice: stored once
		if code, body := post("/events/mail", signSG(events), events); code != 200 || !strings.Contains(body, `"events":3,"sidefx":2`) || !strings.Contains(body, want) {
			t.Fatalf("delivery %d: %d %s", i+1, code, body)
		}
	}
	forged := strings.Replace(events, sent.Key, other.Key, 1)
	if code, _ := post("/events/mail", signSG(events), forged); code != 401 {
		t.Fatalf("a forged delivery: %d, want 401", code)
	}
	if code, _ := post("/events/nobody", nil, "[]"); code != 404 {
		t.Fatalf("an unknown provider: %d, want 404", code)
	}
	at := time.Now()
	stripeBody := `{"id":"evt_9","object":"event","type":"charge.succeeded","data":{"object":{"id":"ch_9","object":"charge","status":"succeeded","metadata":{"sidefx_key":"sfx1_elsewhere"}}}}`
	stripeSig := http.Header{"Stripe-Signature": {fmt.Sprintf("t=%d,v1=%s", at.Unix(), hex.EncodeToString(webhook.ComputeSignature(at, []byte(stripeBody), whsec)))}}
	if code, body := post("/events/stripe", stripeSig, stripeBody); code != 200 || !strings.Contains(body, `"stored":1`) {
		t.Fatalf("a Stripe event: %d %s", code, body)
	}
	if code, _ := post("/events/stripe", http.Header{"Stripe-Signature": {"t=1,v1=00"}}, stripeBody); code != 401 {
		t.Fatalf("a Stripe event signed wrong: %d, want 401", code)
	}

	// Reconciliation settles the email the events name, and only it.
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	if err := os.WriteFile(cfg, []byte(`providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY, event_public_key: "`+pub+`"}
kinds:
  email.receipt: {provider: mail}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c.env = map[string]string{"SENDGRID_API_KEY": "SG.test-key"}
	out := c.ok("reconcile", "run", "--config", cfg)
	if !strings.Contains(out, "2 uncertain effects looked at; 1 settled") || !strings.Contains(out, "msg-1") {
		t.Fatalf("reconcile run:\n%s", out)
	}
	if e, _ := store.Get(ctx, sent.ID); e.State != effects.Confirmed || e.ProviderRef != "msg-1" {
		t.Errorf("the email the events name: %s %s, want confirmed with msg-1", e.State, e.ProviderRef)
	}
	if e, _ := store.Get(ctx, other.ID); e.State != effects.Uncertain {
		t.Errorf("the other email: %s, want uncertain", e.State)
	}
	ev, err := reconcile.Evidence(ctx, pool, "", sent.ID, sent.Key)
	if err != nil || len(ev) != 2 || ev[0].Source != "event" || ev[0].Evidence.Status != "processed" {
		t.Errorf("evidence %+v, %v", ev, err)
	}
}

// A SendGrid delivery signed longer ago than the tolerance is a replay of a
// captured one: the endpoint answers 401 and stores nothing.
func TestEvents_EndpointRefusesAnOldDelivery(t *testing.T) {
	t.Parallel()
	_, pool, _ := newCLI(t)
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	sg, err := sendgrid.NewEvents(base64.StdEncoding.EncodeToString(der), &sendgrid.EventsConfig{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(eventsHandlerMux(pool, map[string]providers.EventSource{"mail": sg}))
	defer srv.Close()
	body := `[{"event":"delivered","sg_event_id":"e-old","sg_message_id":"msg-1.filter.0","timestamp":1764000000,"sidefx_key":"sfx1_captured"}]`
	post := func(signed time.Time) int {
		ts := fmt.Sprint(signed.Unix())
		h := sha256.Sum256([]byte(ts + body))
		sig, _ := ecdsa.SignASN1(rand.Reader, key, h[:])
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/events/mail", strings.NewReader(body))
		req.Header.Set("X-Twilio-Email-Event-Webhook-Signature", base64.StdEncoding.EncodeToString(sig))
		req.Header.Set("X-Twilio-Email-Event-Webhook-Timestamp", ts)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(now.Add(-6 * time.Minute)); code != http.StatusUnauthorized {
		t.Fatalf("a delivery signed 6 minutes ago: %d, want 401", code)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM sidefx_evidence`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("evidence rows after the refused delivery: %d, %v", n, err)
	}
	if code := post(now.Add(-time.Minute)); code != http.StatusOK {
		t.Fatalf("a delivery signed a minute ago: %d, want 200", code)
	}
}

// eventsHandlerMux serves the events endpoint as the daemon does.
func eventsHandlerMux(db engine.DB, sources map[string]providers.EventSource) http.Handler {
	return eventsMux(db, sources, newEventsBudget())
}

func eventsMux(db engine.DB, sources map[string]providers.EventSource, budget *httpbound.Budget) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /events/{provider}", eventsHandler(db, "public", sources, budget, func(string, string, int) {}, slog.New(slog.DiscardHandler)))
	return mux
}

// One anonymous client cannot shut out the providers' deliveries: from
// 127.0.0.1, 16 connections declaring 1 MiB and sending nothing, and 8
// declaring 1 MiB and sending all of it but the last byte, until the
// endpoint refuses one of them (503: the client holds all it may). A
// delivery from another address (127.0.0.2) is then still read and
// answered by its signature check: 401 forged, 200 signed. Before, the
// 16 declared bodies reserved the whole 16 MiB budget unread, and every
// other delivery got 503 until the read timeout.
func TestEvents_OneClientCannotShutOutTheDeliveries(t *testing.T) {
	t.Parallel()
	_, pool, _ := newCLI(t)
	const whsec = "whsec_daemon_test_secret"
	st, _ := stripe.NewEvents(whsec)
	srv := httptest.NewServer(eventsMux(pool, map[string]providers.EventSource{"stripe": st}, newEventsBudget()))
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()

	refused := make(chan string, 64)
	attack := func(send int) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return
			}
			resp.Body.Close()
			refused <- resp.Status
		}()
		if _, err := fmt.Fprintf(c, "POST /events/stripe HTTP/1.1\r\nHost: sidefx\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", maxEventBody); err != nil {
			t.Fatal(err)
		}
		if send > 0 {
			go c.Write(make([]byte, send)) //nolint:errcheck // refused and closed, or held
		}
	}
	for range 16 {
		attack(0)
	}
	for range 8 {
		attack(maxEventBody - 1)
	}
	deadline := time.After(time.Minute)
	for waiting := true; waiting; {
		select {
		case s := <-refused:
			waiting = !strings.HasPrefix(s, "503")
		case <-deadline:
			t.Fatal("no connection of the attacking client refused with 503 within a minute")
		}
	}

	other := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}}
	post := func(sig, body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/events/stripe", strings.NewReader(body))
		req.Header.Set("Stripe-Signature", sig)
		resp, err := other.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	at := time.Now()
	body := `{"id":"evt_7","object":"event","type":"charge.succeeded","data":{"object":{"id":"ch_7","object":"charge","status":"succeeded","metadata":{"sidefx_key":"sfx1_elsewhere"}}}}`
	if code, answer := post("t=1,v1=00", body); code != http.StatusUnauthorized {
		t.Fatalf("a forged delivery from another client while the first holds all it may: %d, want 401\n%s", code, answer)
	}
	sig := fmt.Sprintf("t=%d,v1=%s", at.Unix(), hex.EncodeToString(webhook.ComputeSignature(at, []byte(body), whsec)))
	if code, answer := post(sig, body); code != http.StatusOK || !strings.Contains(answer, `"stored":1`) {
		t.Fatalf("a signed delivery from another client while the first holds all it may: %d, want 200\n%s", code, answer)
	}
}

// Of several databases, one that cannot store a delivery's events keeps
// none of the others from storing them: the delivery is answered 503 (the
// provider delivers again; what was stored absorbs it), and the healthy
// database has the evidence at once.
func TestEvents_OneDatabaseFailingStoresInTheOthers(t *testing.T) {
	t.Parallel()
	broken, healthy := pgtest.DB(t), pgtest.DB(t)
	if _, err := broken.Exec(context.Background(), `DROP TABLE sidefx_evidence`); err != nil {
		t.Fatal(err)
	}
	const whsec = "whsec_daemon_test_secret"
	st, _ := stripe.NewEvents(whsec)
	stores := []eventStore{
		{name: "broken", db: broken, schema: "public", count: func(string, string, int) {}},
		{name: "healthy", db: healthy, schema: "public", count: func(string, string, int) {}},
	}
	at := time.Now()
	body := `{"id":"evt_1","object":"event","type":"charge.succeeded","data":{"object":{"id":"ch_1","object":"charge","status":"succeeded","metadata":{"sidefx_key":"sfx1_shard"}}}}`
	req := httptest.NewRequest(http.MethodPost, "/events/stripe", strings.NewReader(body))
	req.Header.Set("Stripe-Signature", fmt.Sprintf("t=%d,v1=%s", at.Unix(), hex.EncodeToString(webhook.ComputeSignature(at, []byte(body), whsec))))
	rec := httptest.NewRecorder()
	events(rec, req, "stripe", st, stores, slog.New(slog.DiscardHandler))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("a delivery one database could not store: %d, want 503 (delivered again)", rec.Code)
	}
	var n int
	if err := healthy.QueryRow(context.Background(), `SELECT count(*) FROM sidefx_evidence WHERE key = 'sfx1_shard'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the healthy database holds %d events (%v), want 1: the broken one kept it from storing", n, err)
	}
}
