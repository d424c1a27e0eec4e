package stripe_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/stripe"
)

// testAPIKey is the secret every test provider is configured with; no
// Result, error or log line may ever contain it.
const testAPIKey = "sk_test_51Hq7xKLyjWDarjtT1zdp7dcSidefx"

// fakeStripe is a Stripe-like server: it reads form-encoded requests,
// answers JSON objects and Stripe error objects, and keeps Stripe's
// idempotency rules: the first request with a key performs and saves its
// answer, a later one with the same key and parameters gets the saved
// answer with Idempotent-Replayed: true, and one with other parameters gets
// a 400 idempotency_error.
type fakeStripe struct {
	*httptest.Server
	mu        sync.Mutex
	saved     map[string]saved
	performed int
	reqs      []received
	script    []scripted // answered first, in order, without performing
	stall     bool       // perform the next request, then hold its answer until the client gives up
	fail500   bool       // perform the next request, then save and answer a 500 for its key
}

type saved struct {
	path, body string
	status     int
	answer     []byte
	requestID  string
}

// received is one request as the server saw it.
type received struct {
	Method, Path, Key, Auth string
	Form                    url.Values
}

// scripted is an answer a test makes the server give.
type scripted struct {
	status int
	header map[string]string
	body   string
}

func newFakeStripe(t *testing.T) *fakeStripe {
	t.Helper()
	s := &fakeStripe{saved: make(map[string]saved)}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.CloseClientConnections()
		s.Close()
	})
	return s
}

// answer queues scripted answers.
func (s *fakeStripe) answer(a ...scripted) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, a...)
}

// failAfterPerforming makes the next request perform and then fail with a
// 500, which is saved for its key and replayed, as Stripe does once an
// endpoint began executing.
func (s *fakeStripe) failAfterPerforming() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail500 = true
}

func (s *fakeStripe) stallNext() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stall = true
}

func (s *fakeStripe) requests() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.reqs...)
}

func (s *fakeStripe) objects() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.performed
}

func stripeError(typ, code, msg string) string {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"type": typ, "code": code, "message": msg}})
	return string(b)
}

func (s *fakeStripe) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	form, _ := url.ParseQuery(string(body))
	key := r.Header.Get("Idempotency-Key")
	w.Header().Set("Content-Type", "application/json")

	s.mu.Lock()
	s.reqs = append(s.reqs, received{Method: r.Method, Path: r.URL.Path, Key: key, Auth: r.Header.Get("Authorization"), Form: form})
	if r.Header.Get("Authorization") != "Bearer "+testAPIKey {
		s.mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, stripeError("invalid_request_error", "", "Invalid API Key provided: sk_test_****"))
		return
	}
	if len(s.script) > 0 {
		a := s.script[0]
		s.script = s.script[1:]
		s.mu.Unlock()
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(a.status)
		io.WriteString(w, a.body)
		return
	}
	if prev, ok := s.saved[key]; ok && key != "" {
		s.mu.Unlock()
		w.Header().Set("Request-Id", prev.requestID)
		if prev.path != r.URL.Path || prev.body != string(body) {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, stripeError("idempotency_error", "",
				"Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '"+key+"' if you meant to execute a different request."))
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(prev.status)
		w.Write(prev.answer)
		return
	}
	s.performed++
	status, answer := create(r.URL.Path, form, s.performed)
	if s.fail500 {
		s.fail500 = false
		status, answer = http.StatusInternalServerError, []byte(stripeError("api_error", "", "Something went wrong on Stripe's end."))
	}
	reqID := "req_" + strconv.Itoa(len(s.reqs))
	if key != "" {
		s.saved[key] = saved{path: r.URL.Path, body: string(body), status: status, answer: answer, requestID: reqID}
	}
	stall := s.stall
	s.stall = false
	s.mu.Unlock()

	if stall {
		<-r.Context().Done() // performed; the answer is never sent in time
		return
	}
	w.Header().Set("Request-Id", reqID)
	w.WriteHeader(status)
	w.Write(answer)
}

// create performs a request: the object Stripe would answer with.
func create(path string, form url.Values, n int) (int, []byte) {
	obj := map[string]any{"livemode": false, "created": time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).Unix()}
	meta := map[string]string{}
	for k, v := range form {
		if strings.HasPrefix(k, "metadata[") && strings.HasSuffix(k, "]") {
			meta[k[len("metadata["):len(k)-1]] = v[0]
		}
	}
	obj["metadata"] = meta
	amount, _ := strconv.ParseInt(form.Get("amount"), 10, 64)
	parts := strings.Split(strings.TrimPrefix(path, "/v1/"), "/")
	switch {
	case path == "/v1/payment_intents":
		id := fmt.Sprintf("pi_%d", n)
		obj["id"], obj["object"], obj["amount"], obj["currency"], obj["status"] = id, "payment_intent", amount, form.Get("currency"), "requires_payment_method"
		obj["client_secret"] = id + "_secret_" + "fakeclientsecret"
	case len(parts) == 3 && parts[0] == "payment_intents" && (parts[2] == "capture" || parts[2] == "cancel"):
		status := map[string]string{"capture": "succeeded", "cancel": "canceled"}[parts[2]]
		obj["id"], obj["object"], obj["amount"], obj["currency"], obj["status"] = parts[1], "payment_intent", 2000, "usd", status
	case path == "/v1/charges":
		obj["id"], obj["object"], obj["amount"], obj["currency"], obj["status"] = fmt.Sprintf("ch_%d", n), "charge", amount, form.Get("currency"), "succeeded"
	case path == "/v1/refunds":
		obj["id"], obj["object"], obj["amount"], obj["currency"], obj["status"] = fmt.Sprintf("re_%d", n), "refund", amount, "usd", "succeeded"
		delete(obj, "livemode")
	case path == "/v1/customers":
		obj["id"], obj["object"], obj["email"] = fmt.Sprintf("cus_%d", n), "customer", form.Get("email")
	case path == "/v1/transfers":
		obj["id"], obj["object"], obj["amount"], obj["currency"] = fmt.Sprintf("tr_%d", n), "transfer", amount, form.Get("currency")
	default:
		return http.StatusNotFound, []byte(stripeError("invalid_request_error", "resource_missing", "Unrecognized request URL (POST: "+path+")"))
	}
	b, _ := json.Marshal(obj)
	return http.StatusOK, b
}

// newProvider returns a provider on baseURL with the test key; mod may
// change its config.
func newProvider(t *testing.T, baseURL string, mod ...func(*stripe.Config)) *stripe.Provider {
	t.Helper()
	cfg := &stripe.Config{APIKey: testAPIKey, BaseURL: baseURL}
	for _, m := range mod {
		m(cfg)
	}
	p, err := stripe.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// call returns a call of kind with payload, keyed as the dispatcher would.
func call(source, kind, payload string) providers.Call {
	return providers.Call{EffectID: 7, SourceID: source, Kind: kind, Key: derive.Key(source, kind), Payload: json.RawMessage(payload), Attempt: 1}
}

const piPayload = `{"amount":2000,"currency":"usd","payment_method_types":["card"],"description":"Order 1042","metadata":{"order_id":"1042"}}`
