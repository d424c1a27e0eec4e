package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/builtin"
)

// readmeExample returns the YAML block docs/providers.md marks with name.
func readmeExample(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/providers.md")
	if err != nil {
		t.Fatal(err)
	}
	marker := "<!-- http-example: " + name + " -->\n```yaml\n"
	_, rest, ok := strings.Cut(string(b), marker)
	if !ok {
		t.Fatalf("docs/providers.md has no %q example", name)
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("docs/providers.md's %q example does not end", name)
	}
	return block
}

// vendorPeer performs each key once, as the vendors do, and answers per the
// scenario the payload names: "ok"; "lose" (performed, the answer lost);
// "refuse" (the vendor's refusal, nothing performed); "ratelimit" (429,
// then as "ok"). A request without the key header or the credentials is
// refused before anything, and every refusal echoes what it was sent.
type vendorPeer struct {
	keyHeader, authHeader, auth string
	maxKey                      int
	// answer writes the vendor's answer for a new key's scenario; it
	// returns the body to store for replays, or "" for none.
	answer func(w http.ResponseWriter, scenario, key string, n int) (stored string, status int)
	// inFlight answers a repeat of a key whose first answer was lost while
	// the vendor still processes it (Adyen's 704); nil: replay at once.
	inFlight func(w http.ResponseWriter)

	mu        sync.Mutex
	inFlights int // answers of inFlight given
	performed map[string]int
	stored    map[string]string
	status    map[string]int
	lost      map[string]bool
	limited   map[string]bool
}

func (v *vendorPeer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	echo := fmt.Sprintf("you sent %v %s", r.Header, body)
	key := r.Header.Get(v.keyHeader)
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Header.Get(v.authHeader) != v.auth:
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, `{"error":"unauthorized","echo":%q}`, echo)
		return
	case key == "" || (v.maxKey > 0 && len(key) > v.maxKey):
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":"missing or invalid %s","echo":%q}`, v.keyHeader, echo)
		return
	}
	var p struct{ Scenario string }
	_ = json.Unmarshal(body, &p)
	v.mu.Lock()
	defer v.mu.Unlock()
	if s, ok := v.stored[key]; ok {
		if v.lost[key] && v.inFlight != nil {
			delete(v.lost, key) // still processing this time; done the next
			v.inFlights++
			v.inFlight(w)
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(v.status[key])
		io.WriteString(w, s)
		return
	}
	if p.Scenario == "ratelimit" && !v.limited[key] {
		v.limited[key] = true
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, `{"error":"rate limited","echo":%q}`, echo)
		return
	}
	if p.Scenario == "refuse" {
		v.answer(w, "refuse", key, 0)
		return
	}
	v.performed[key]++
	n := len(v.performed)
	rec := httptest.NewRecorder()
	s, status := v.answer(rec, "ok", key, n)
	v.stored[key], v.status[key] = s, status
	if p.Scenario == "lose" {
		v.lost[key] = true
		panic(http.ErrAbortHandler) // performed, never answered
	}
	for k, vs := range rec.Header() {
		w.Header()[k] = vs
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

// perform calls p with one key until a definite answer, as the dispatcher
// does (an unknown or retryable answer is retried under the same key).
func perform(t *testing.T, p providers.Provider, source, kind, scenario string) (providers.Result, []providers.Class) {
	t.Helper()
	key := derive.Key(source, kind)
	payload := json.RawMessage(fmt.Sprintf(`{"scenario":%q,"amount":{"value":1200,"currency":"EUR"}}`, scenario))
	var classes []providers.Class
	for attempt := 1; attempt <= 6; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res := p.Call(ctx, providers.Call{SourceID: source, Kind: kind, Key: key, Payload: payload, Attempt: attempt})
		cancel()
		classes = append(classes, res.Class)
		if res.IsConfirmed() || res.IsRejected() {
			return res, classes
		}
	}
	t.Fatalf("%s: no definite answer after 6 attempts: %v", source, classes)
	return providers.Result{}, nil
}

func TestVendorStyles(t *testing.T) {
	cases := []struct {
		name, provider, kind, host string
		env                        map[string]string
		peer                       *vendorPeer
		// refusal is what the error says for "refuse".
		refusal string
	}{
		{
			name: "paypal", provider: "paypal", kind: "paypal.order.create", host: "https://api-m.paypal.com",
			env: map[string]string{"PAYPAL_AUTHORIZATION": "Bearer SECRETpaypalTOKEN"},
			peer: &vendorPeer{keyHeader: "PayPal-Request-Id", authHeader: "Authorization", auth: "Bearer SECRETpaypalTOKEN",
				answer: func(w http.ResponseWriter, scenario, key string, n int) (string, int) {
					if scenario == "refuse" {
						w.WriteHeader(http.StatusUnprocessableEntity)
						io.WriteString(w, `{"name":"UNPROCESSABLE_ENTITY","details":[{"issue":"PAYEE_ACCOUNT_RESTRICTED"}]}`)
						return "", 0
					}
					body := fmt.Sprintf(`{"id":"5O190127TN36471%02d","status":"CREATED"}`, n)
					w.WriteHeader(http.StatusCreated)
					io.WriteString(w, body)
					return body, http.StatusCreated
				}},
			refusal: "answered 422",
		},
		{
			name: "adyen", provider: "adyen", kind: "adyen.payment", host: "https://checkout-test.adyen.com",
			env: map[string]string{"ADYEN_API_KEY": "SECRETadyenKEY"},
			peer: &vendorPeer{keyHeader: "Idempotency-Key", authHeader: "X-API-Key", auth: "SECRETadyenKEY", maxKey: 64,
				answer: func(w http.ResponseWriter, scenario, key string, n int) (string, int) {
					if scenario == "refuse" {
						w.WriteHeader(http.StatusUnprocessableEntity)
						io.WriteString(w, `{"status":422,"errorCode":"101","message":"Invalid card number","errorType":"validation"}`)
						return "", 0
					}
					body := fmt.Sprintf(`{"pspReference":"V4HZ4RBFJGXXGN%02d","resultCode":"Authorised"}`, n)
					w.WriteHeader(http.StatusOK)
					io.WriteString(w, body)
					return body, http.StatusOK
				},
				inFlight: func(w http.ResponseWriter) {
					w.WriteHeader(http.StatusUnprocessableEntity)
					io.WriteString(w, `{"status":422,"errorCode":"704","message":"request already processed or in progress","errorType":"validation"}`)
				}},
			refusal: "answered 422",
		},
		{
			name: "twilio", provider: "sms", kind: "sms.send", host: "https://sms.example.com",
			env: map[string]string{"SMS_AUTHORIZATION": "Basic SECRETsmsAUTH"},
			peer: &vendorPeer{keyHeader: "I-Twilio-Idempotency-Token", authHeader: "Authorization", auth: "Basic SECRETsmsAUTH",
				answer: func(w http.ResponseWriter, scenario, key string, n int) (string, int) {
					if scenario == "refuse" {
						w.WriteHeader(http.StatusBadRequest)
						io.WriteString(w, `{"code":21211,"message":"The 'To' number is not a valid phone number.","status":400}`)
						return "", 0
					}
					body := fmt.Sprintf(`{"sid":"SM%032d","status":"queued"}`, n)
					w.WriteHeader(http.StatusCreated)
					io.WriteString(w, body)
					return body, http.StatusCreated
				}},
			refusal: "answered 400",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			peer := tc.peer
			peer.performed, peer.stored, peer.status, peer.lost, peer.limited = map[string]int{}, map[string]string{}, map[string]int{}, map[string]bool{}, map[string]bool{}
			srv := httptest.NewServer(peer)
			defer srv.Close()
			doc := "database_url: postgres://localhost/app\n" + strings.Replace(readmeExample(t, tc.name), tc.host, srv.URL, 1)
			cfg, err := config.Parse([]byte(doc), func(k string) string { return tc.env[k] }, builtin.Types()...)
			if err != nil {
				t.Fatalf("docs/providers.md's %s example: %v", tc.name, err)
			}
			rt, err := config.Build(cfg, func(k string) string { return tc.env[k] }, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close()
			p := rt.Dispatcher.Kinds[tc.kind].Provider
			if p == nil || !p.Idempotent() {
				t.Fatalf("kind %s has provider %v", tc.kind, p)
			}

			var secrets []string
			for _, v := range tc.env {
				secrets = append(secrets, v, strings.Fields(v)[len(strings.Fields(v))-1])
			}
			noSecret := func(res providers.Result) {
				t.Helper()
				text := fmt.Sprint(res.Err) + string(res.Detail) + res.Ref
				for _, s := range secrets {
					if strings.Contains(text, s) {
						t.Errorf("a secret in the result: %s", text)
					}
				}
			}

			ok, classes := perform(t, p, "order-ok", tc.kind, "ok")
			if len(classes) != 1 || !ok.IsConfirmed() || ok.Ref == "" || ok.Ref == derive.Key("order-ok", tc.kind) {
				t.Errorf("ok: %v %+v, want confirmed at once with the vendor's reference", classes, ok)
			}
			again, _ := perform(t, p, "order-ok", tc.kind, "ok")
			if !again.IsConfirmed() || again.Ref != ok.Ref {
				t.Errorf("a repeat: %+v, want the first answer replayed", again)
			}

			// A lost answer is unknown, and a retry under the key is
			// confirmed with what was performed. (net/http itself may
			// resend a request that carries an Idempotency-Key once when
			// its reused connection drops: that resend then meets the
			// in-flight answer, Adyen's 704, which must read as unknown.)
			lost, classes := perform(t, p, "order-lost", tc.kind, "lose")
			if classes[0] != providers.Unknown || !lost.IsConfirmed() || lost.Ref == "" {
				t.Errorf("a lost answer: %v then %+v, want unknown, then confirmed", classes, lost)
			}
			peer.mu.Lock()
			if peer.inFlight != nil && peer.inFlights != 1 {
				t.Errorf("the in-flight answer was given %d times, want 1", peer.inFlights)
			}
			peer.mu.Unlock()

			limited, classes := perform(t, p, "order-limited", tc.kind, "ratelimit")
			if fmt.Sprint(classes) != fmt.Sprint([]providers.Class{providers.Retryable, providers.Confirmed}) || !limited.IsConfirmed() {
				t.Errorf("rate limited: %v %+v", classes, limited)
			}

			refused, _ := perform(t, p, "order-refused", tc.kind, "refuse")
			if !refused.IsRejected() || !strings.Contains(refused.Err.Error(), tc.refusal) {
				t.Errorf("a refusal: %+v, want rejected (%s)", refused, tc.refusal)
			}
			for _, r := range []providers.Result{ok, again, lost, limited, refused} {
				noSecret(r)
			}

			// Credentials the peer refuses: rejected, and the echo redacted.
			bad := map[string]string{}
			for k, v := range tc.env {
				bad[k] = v + "-revoked"
			}
			rtBad, err := config.Build(cfg, func(k string) string { return bad[k] }, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer rtBad.Close()
			denied, _ := perform(t, rtBad.Dispatcher.Kinds[tc.kind].Provider, "order-denied", tc.kind, "ok")
			if !denied.IsRejected() || !strings.Contains(denied.Err.Error(), "answered 401") {
				t.Errorf("revoked credentials: %+v", denied)
			}
			secrets = append(secrets, maps(bad)...)
			noSecret(denied)

			peer.mu.Lock()
			defer peer.mu.Unlock()
			for key, n := range peer.performed {
				if n != 1 {
					t.Errorf("key %s performed %d times", key, n)
				}
			}
			if len(peer.performed) != 3 {
				t.Errorf("%d effects performed, want 3 (ok, lost, rate limited)", len(peer.performed))
			}
		})
	}
}

func maps(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
