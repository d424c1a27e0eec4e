package sendgrid_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
	"github.com/sidefx/sidefx/providers/sendgrid"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testKey is the API key of every test provider; no Result may hold it.
const testKey = "SG.test-key_0123456789.abcdefghijklmnopqrstuvwxyz"

// validPayload is a mail every check passes.
const validPayload = `{
	"personalizations": [{"to": [{"email": "ada@example.com", "name": "Ada"}]}],
	"from": {"email": "shop@example.com", "name": "Shop"},
	"subject": "Your receipt",
	"content": [{"type": "text/plain", "value": "Thank you for your order."}]
}`

// newProvider returns a provider sending to baseURL, closed at the end of
// the test.
func newProvider(t *testing.T, baseURL string, edit ...func(*sendgrid.Config)) *sendgrid.Provider {
	t.Helper()
	cfg := &sendgrid.Config{APIKey: testKey, BaseURL: baseURL}
	for _, e := range edit {
		e(cfg)
	}
	p, err := sendgrid.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// testCtx bounds a test's waits: a deadline, never a sleep.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// testCall returns a call of validPayload, or of payload when given.
func testCall(payload ...string) providers.Call {
	body := validPayload
	if len(payload) > 0 {
		body = payload[0]
	}
	return providers.Call{
		EffectID: 7, SourceID: "order-1042", Kind: "email.receipt",
		Key: derive.Key("order-1042", "email.receipt"), Payload: json.RawMessage(body), Attempt: 1,
	}
}

// firstKey reads custom_args.sidefx_key of the first personalization of a
// mail send body.
func firstKey(body []byte) string {
	var m struct {
		Personalizations []struct {
			CustomArgs map[string]string `json:"custom_args"`
		} `json:"personalizations"`
	}
	if json.Unmarshal(body, &m) != nil || len(m.Personalizations) == 0 {
		return ""
	}
	return m.Personalizations[0].CustomArgs[sendgrid.ArgKey]
}

// noSecret fails the test if r holds the API key anywhere.
func noSecret(t *testing.T, r providers.Result) {
	t.Helper()
	text := r.Ref + " " + string(r.Detail)
	if r.Err != nil {
		text += " " + r.Err.Error()
	}
	if strings.Contains(text, testKey) {
		t.Fatalf("a %s result holds the API key: %s", r.Class, text)
	}
}

func TestProvider_Conformance(t *testing.T) {
	providertest.RunConformance(t, providertest.Conformance{
		New: func(t *testing.T, baseURL string) providers.Provider {
			return newProvider(t, baseURL)
		},
		Kind:       "email.receipt",
		Payload:    json.RawMessage(validPayload),
		BadPayload: json.RawMessage(`{"subject":"no recipients"}`),
		Secrets:    []string{testKey},
		Key:        func(_ *http.Request, body []byte) string { return firstKey(body) },
		Respond: func(w http.ResponseWriter, _ *http.Request, a providertest.Answer, echo string) {
			// SendGrid's error JSON, each message quoting the request.
			errs := func(status int, msg string) {
				b, _ := json.Marshal(map[string]any{"errors": []map[string]any{{"message": msg + ": " + echo, "field": echo, "help": map[string]string{"request": echo}}}})
				answer(w, status, string(b))
			}
			switch a {
			case providertest.AnswerOK, providertest.AnswerReplay: // no replays at SendGrid
				w.Header().Set(sendgrid.HeaderMessageID, providertest.ConformanceRef)
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, echo)
			case providertest.AnswerReject:
				errs(http.StatusBadRequest, "The from email does not contain a valid address.")
			case providertest.AnswerUnauthorized:
				errs(http.StatusUnauthorized, "The provided authorization grant is invalid, expired, or revoked")
			case providertest.AnswerForbidden:
				errs(http.StatusForbidden, "access forbidden")
			case providertest.AnswerNotFound:
				errs(http.StatusNotFound, "not found")
			case providertest.AnswerInvalid:
				errs(http.StatusBadRequest, "The subject is required.")
			case providertest.AnswerUnavailable:
				errs(http.StatusServiceUnavailable, "service unavailable")
			case providertest.AnswerServerError:
				errs(http.StatusInternalServerError, "internal server error")
			case providertest.AnswerConflict:
				errs(http.StatusConflict, "conflict")
			case providertest.AnswerSeeOther:
				w.WriteHeader(http.StatusSeeOther)
				io.WriteString(w, echo)
			case providertest.AnswerRateLimited:
				w.Header().Set("Retry-After", "7")
				errs(http.StatusTooManyRequests, "too many requests")
			}
		},
	})
}

// accepted answers as SendGrid's Mail Send does a mail it queued: 202
// with the message's id.
func accepted(w http.ResponseWriter) {
	w.Header().Set(sendgrid.HeaderMessageID, "W4p0sWJtRKm5dGxHZ3Yw1A")
	w.WriteHeader(http.StatusAccepted)
}

// answer writes a JSON answer.
func answer(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body) //nolint:errcheck
}

// seen is what a test server received.
type seen struct {
	mu   sync.Mutex
	reqs []received
}

type received struct {
	method, path string
	header       http.Header
	body         []byte
}

func (s *seen) add(r *http.Request) received {
	body, _ := io.ReadAll(r.Body)
	rec := received{r.Method, r.URL.Path, r.Header.Clone(), body}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, rec)
	return rec
}

func (s *seen) all() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.reqs...)
}

// server starts a test server that records each request, then runs h.
func server(t *testing.T, h func(w http.ResponseWriter, r *http.Request, rec received)) (*httptest.Server, *seen) {
	t.Helper()
	s := &seen{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h(w, r, s.add(r))
	}))
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
	})
	return ts, s
}

func TestProvider_Classifies(t *testing.T) {
	t.Parallel()
	// The provider reads the rate-limit headers against this clock, so the
	// waits are exact however long the test takes to get there.
	now := time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)
	reset := now.Add(90 * time.Second).Unix()
	cases := []struct {
		name    string
		respond func(w http.ResponseWriter, r *http.Request)
		class   providers.Class
		ref     string
		after   func(time.Duration) bool
		detail  string // a substring of Detail
		errText string // a substring of Err
	}{
		{
			name: "202 with X-Message-Id is confirmed with it",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Message-Id", "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0")
				w.WriteHeader(http.StatusAccepted)
			},
			class: providers.Confirmed, ref: "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0",
		},
		{
			// Mail Send's proof is a 202 with X-Message-Id: without it, the
			// answer may be an intermediary's (a proxy, another host).
			name:    "202 without X-Message-Id is unknown",
			respond: func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusAccepted) },
			class:   providers.Unknown, errText: "answer not proven the provider's own: status 202, no X-Message-Id header",
		},
		{
			name: "200 is unknown, with or without X-Message-Id",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Message-Id", "W4p0sWJtRKm5dGxHZ3Yw1A")
				answer(w, http.StatusOK, `{}`)
			},
			class: providers.Unknown, errText: "status 200, want 202 Accepted",
		},
		{
			name: "a proxy's 200 HTML page is unknown",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(http.StatusOK)
				io.WriteString(w, "<html><body>Blocked by policy</body></html>")
			},
			class: providers.Unknown, detail: `{"status":200,"body":"\u003chtml\u003e\u003cbody\u003eBlocked by policy`,
		},
		{
			name: "400 is rejected with SendGrid's errors",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				answer(w, 400, `{"errors":[{"message":"The to array is required for all personalization objects, and must have at least one email object with a valid email address.","field":"personalizations.0.to","help":"http://sendgrid.com/docs/API_Reference/Web_API_v3/Mail/errors.html#message.personalizations.to"}]}`)
			},
			class:   providers.Rejected,
			detail:  `"field":"personalizations.0.to"`,
			errText: "sendgrid answered 400 Bad Request: The to array is required",
		},
		{
			name: "403 is rejected",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				answer(w, 403, `{"errors":[{"message":"access forbidden"}]}`)
			},
			class: providers.Rejected, detail: `{"status":403,"errors":[{"message":"access forbidden"}]}`,
		},
		{
			name: "413 is rejected",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				answer(w, 413, `{"errors":[{"message":"content too large"}]}`)
			},
			class: providers.Rejected, errText: "413 Request Entity Too Large: content too large",
		},
		{
			// Without SendGrid's error JSON nothing proves SendGrid refused:
			// unknown, so the mail ends uncertain rather than failed.
			name:    "a 404 from a proxy is unknown and keeps the start of its body",
			respond: func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no such route", 404) },
			class:   providers.Unknown, detail: `{"status":404,"body":"no such route"}`,
		},
		{
			name: "a proxy's 403 HTML page is unknown",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(http.StatusForbidden)
				io.WriteString(w, "<html><body>Forbidden by policy</body></html>")
			},
			class: providers.Unknown, errText: "sendgrid answered 403 Forbidden",
		},
		{
			name: "429 waits for Retry-After",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Retry-After", "12")
				w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
				answer(w, 429, `{"errors":[{"field":null,"message":"too many requests"}]}`)
			},
			class: providers.Retryable, after: func(d time.Duration) bool { return d == 12*time.Second },
		},
		{
			name: "429 without Retry-After waits for X-RateLimit-Reset",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-RateLimit-Limit", "600")
				w.Header().Set("X-RateLimit-Remaining", "0")
				w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
				answer(w, 429, `{"errors":[{"field":null,"message":"too many requests"}]}`)
			},
			class: providers.Retryable,
			after: func(d time.Duration) bool { return d == 90*time.Second },
		},
		{
			name: "429 with a past X-RateLimit-Reset leaves the wait to the policy",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-RateLimit-Reset", "1000000000")
				answer(w, 429, `{"errors":[{"message":"too many requests"}]}`)
			},
			class: providers.Retryable, after: func(d time.Duration) bool { return d == 0 },
		},
		{
			// SendGrid failed while processing a valid request: the mail
			// may have been queued.
			name: "500 is unknown",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				answer(w, 500, `{"errors":[{"message":"internal server error"}]}`)
			},
			class: providers.Unknown, errText: "500 Internal Server Error: internal server error",
			after: func(d time.Duration) bool { return d == 0 },
		},
		{
			name: "503 is unknown, and keeps its Retry-After",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Retry-After", "30")
				http.Error(w, "upstream unavailable", 503)
			},
			class: providers.Unknown, after: func(d time.Duration) bool { return d == 30*time.Second },
		},
		{
			name: "a gateway's 504 is unknown",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "gateway timeout", 504)
			},
			class: providers.Unknown, detail: `{"status":504,"body":"gateway timeout"}`,
		},
		{
			name: "409 is unknown",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				answer(w, 409, `{"errors":[{"message":"conflict"}]}`)
			},
			class: providers.Unknown,
		},
		{
			name: "401 is rejected",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				answer(w, 401, `{"errors":[{"field":null,"message":"The provided authorization grant is invalid, expired, or revoked"}]}`)
			},
			class: providers.Rejected, errText: "401 Unauthorized",
		},
		{
			name: "408 is retryable",
			respond: func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "request timeout", 408)
			},
			class: providers.Retryable,
		},
		{
			name: "a redirect is not followed and is unknown",
			respond: func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
			},
			class: providers.Unknown, errText: "307 Temporary Redirect",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts, s := server(t, func(w http.ResponseWriter, r *http.Request, _ received) { tc.respond(w, r) })
			p := newProvider(t, ts.URL)
			sendgrid.SetClock(p, func() time.Time { return now })
			r := p.Call(context.Background(), testCall())
			noSecret(t, r)
			if r.Class != tc.class {
				t.Fatalf("class %s (%v), want %s", r.Class, r.Err, tc.class)
			}
			if n := len(s.all()); n != 1 {
				t.Fatalf("the server received %d requests, want 1", n)
			}
			if r.Replayed {
				t.Fatal("Replayed is set: SendGrid has no replays")
			}
			if tc.class == providers.Confirmed {
				if r.Ref != tc.ref || r.Err != nil {
					t.Fatalf("Ref %q, Err %v; want Ref %q", r.Ref, r.Err, tc.ref)
				}
				return
			}
			if r.Err == nil {
				t.Fatal("no error")
			}
			var apiErr *sendgrid.APIError
			if !errors.As(r.Err, &apiErr) || apiErr.StatusCode == 0 {
				t.Fatalf("error %v is not an *APIError with a status", r.Err)
			}
			if !strings.HasPrefix(r.Err.Error(), "sendgrid mail send: ") {
				t.Errorf("error %q does not name the call", r.Err)
			}
			if !strings.Contains(string(r.Detail), tc.detail) || !json.Valid(r.Detail) {
				t.Errorf("Detail %s, want valid JSON holding %s", r.Detail, tc.detail)
			}
			if !strings.Contains(r.Err.Error(), tc.errText) {
				t.Errorf("error %q, want it to hold %q", r.Err, tc.errText)
			}
			if tc.after != nil && !tc.after(r.RetryAfter) {
				t.Errorf("RetryAfter %s", r.RetryAfter)
			}
		})
	}
}

// A hostile or broken peer that echoes the request's Authorization header
// anywhere in its answer gets no secret into the Result.
func TestProvider_KeepsTheKeyOutOfEveryResult(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		class   providers.Class
		respond func(w http.ResponseWriter, auth string)
	}{
		{"401 errors echo the header", providers.Rejected, func(w http.ResponseWriter, auth string) {
			body, _ := json.Marshal(map[string]any{"errors": []map[string]any{{
				"message": "The provided authorization grant is invalid, expired, or revoked: " + auth,
				"field":   auth,
				"help":    map[string]any{auth: []any{auth, 1, true, nil}},
			}}})
			answer(w, http.StatusUnauthorized, string(body))
		}},
		{"401 plain body echoes the header", providers.Unknown, func(w http.ResponseWriter, auth string) {
			http.Error(w, "bad credentials "+auth+" "+strings.Repeat("x", 600), http.StatusUnauthorized)
		}},
		{"a key cut at the body limit", providers.Unknown, func(w http.ResponseWriter, auth string) {
			http.Error(w, strings.Repeat("y", 500)+auth, http.StatusForbidden)
		}},
		{"500 echoes the header", providers.Unknown, func(w http.ResponseWriter, auth string) {
			answer(w, 500, `{"errors":[{"message":"`+auth+`"}]}`)
		}},
		{"202 echoes it as the message id", providers.Confirmed, func(w http.ResponseWriter, auth string) {
			w.Header().Set("X-Message-Id", auth)
			w.WriteHeader(http.StatusAccepted)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts, _ := server(t, func(w http.ResponseWriter, r *http.Request, rec received) {
				tc.respond(w, rec.header.Get("Authorization"))
			})
			r := newProvider(t, ts.URL).Call(context.Background(), testCall())
			noSecret(t, r)
			if strings.Contains(string(r.Detail), testKey[:20]) || strings.Contains(r.Ref, testKey[:20]) {
				t.Fatalf("a part of the key survived: %s %s", r.Ref, r.Detail)
			}
			if r.Class != tc.class {
				t.Fatalf("class %s (%v), want %s", r.Class, r.Err, tc.class)
			}
			if r.Class == providers.Confirmed {
				if r.Ref != "Bearer [redacted]" {
					t.Fatalf("Ref %q, want the echo redacted", r.Ref)
				}
				return
			}
			if !strings.Contains(string(r.Detail), "[reda") { // cut at the limit, perhaps
				t.Fatalf("Detail %s: the echo was dropped, not redacted", r.Detail)
			}
			if !json.Valid(r.Detail) {
				t.Fatalf("Detail is not JSON: %s", r.Detail)
			}
		})
	}
}

func TestProvider_SendsTheRequestSendGridExpects(t *testing.T) {
	t.Parallel()
	ts, s := server(t, func(w http.ResponseWriter, _ *http.Request, _ received) { accepted(w) })
	p := newProvider(t, ts.URL+"/proxy/")
	if r := p.Call(context.Background(), testCall()); !r.IsConfirmed() {
		t.Fatalf("%s %v", r.Class, r.Err)
	}
	got := s.all()[0]
	if got.method != http.MethodPost || got.path != "/proxy"+sendgrid.Endpoint {
		t.Errorf("%s %s, want POST /proxy%s", got.method, got.path, sendgrid.Endpoint)
	}
	want := map[string]string{
		"Authorization": "Bearer " + testKey,
		"Content-Type":  "application/json",
		"Accept":        "application/json",
		"User-Agent":    "sendgrid/3.16.1;go",
	}
	for name, v := range want {
		if got.header.Get(name) != v {
			t.Errorf("header %s: %q, want %q", name, got.header.Get(name), v)
		}
	}
	// With either header net/http would resend a request that may have
	// been read.
	for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		if _, ok := got.header[name]; ok {
			t.Errorf("the request carries %s", name)
		}
	}
}

func TestProvider_TagsEveryPersonalization(t *testing.T) {
	t.Parallel()
	ts, s := server(t, func(w http.ResponseWriter, _ *http.Request, _ received) { accepted(w) })
	p := newProvider(t, ts.URL)
	c := testCall(`{
		"personalizations": [
			{"to": [{"email": "ada@example.com"}], "custom_args": {"order": "A-1042", "sidefx_key": "forged"}},
			{"to": [{"email": "bob@example.com"}], "cc": [{"email": "carol@example.com"}],
			 "dynamic_template_data": {"total": 12345678901234567890, "items": [{"sku": "x", "qty": 2}]}},
			{"to": [{"email": "dan@example.com"}], "headers": {"X-Per-Recipient": "1"}}
		],
		"from": {"email": "shop@example.com"},
		"template_id": "d-0123456789abcdef",
		"headers": {"X-Campaign": "spring", "x-sidefx-key": "forged"},
		"custom_args": {"campaign": "spring"},
		"tracking_settings": {"click_tracking": {"enable": false}}
	}`)
	if r := p.Call(context.Background(), c); !r.IsConfirmed() {
		t.Fatalf("%s %v", r.Class, r.Err)
	}
	var sent struct {
		Personalizations []struct {
			CustomArgs          map[string]string `json:"custom_args"`
			Headers             map[string]string `json:"headers"`
			DynamicTemplateData json.RawMessage   `json:"dynamic_template_data"`
		} `json:"personalizations"`
		Headers          map[string]string `json:"headers"`
		CustomArgs       map[string]string `json:"custom_args"`
		TemplateID       string            `json:"template_id"`
		TrackingSettings json.RawMessage   `json:"tracking_settings"`
	}
	body := s.all()[0].body
	if err := json.Unmarshal(body, &sent); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if len(sent.Personalizations) != 3 {
		t.Fatalf("%d personalizations sent", len(sent.Personalizations))
	}
	for i, pz := range sent.Personalizations {
		for name, want := range map[string]string{sendgrid.ArgKey: c.Key, sendgrid.ArgSourceID: c.SourceID, sendgrid.ArgKind: c.Kind} {
			if got := pz.CustomArgs[name]; got != want {
				t.Errorf("personalizations[%d].custom_args.%s = %q, want %q", i, name, got, want)
			}
		}
	}
	if got := sent.Personalizations[0].CustomArgs["order"]; got != "A-1042" {
		t.Errorf("the payload's own custom_args were lost: %v", sent.Personalizations[0].CustomArgs)
	}
	if got := sent.Personalizations[2].Headers["X-Per-Recipient"]; got != "1" {
		t.Errorf("a personalization's headers were lost: %v", sent.Personalizations[2].Headers)
	}
	if want := `{"items":[{"qty":2,"sku":"x"}],"total":12345678901234567890}`; string(sent.Personalizations[1].DynamicTemplateData) != want {
		t.Errorf("dynamic_template_data sent as %s, want %s", sent.Personalizations[1].DynamicTemplateData, want)
	}
	wantHeaders := map[string]string{"X-Campaign": "spring", sendgrid.HeaderKey: c.Key}
	if fmt.Sprint(sent.Headers) != fmt.Sprint(wantHeaders) {
		t.Errorf("headers %v, want %v", sent.Headers, wantHeaders)
	}
	if sent.CustomArgs["campaign"] != "spring" || sent.TemplateID != "d-0123456789abcdef" {
		t.Errorf("top-level fields lost: custom_args %v, template_id %q", sent.CustomArgs, sent.TemplateID)
	}
	if string(sent.TrackingSettings) != `{"click_tracking":{"enable":false}}` {
		t.Errorf("an explicit false was lost: tracking_settings %s", sent.TrackingSettings)
	}
}

func TestProvider_RejectsBadPayloadsBeforeAnyRequest(t *testing.T) {
	t.Parallel()
	ts, s := server(t, func(w http.ResponseWriter, _ *http.Request, _ received) { accepted(w) })
	p := newProvider(t, ts.URL)
	const from = `"from": {"email": "shop@example.com"}`
	const content = `"content": [{"type": "text/plain", "value": "hi"}]`
	const to = `"personalizations": [{"to": [{"email": "ada@example.com"}]}]`
	cases := map[string]struct{ payload, want string }{
		"empty":                   {``, "empty"},
		"not JSON":                {`{"personalizations": [`, "decode"},
		"an array":                {`[1, 2]`, "decode"},
		"null":                    {`null`, "null"},
		"a string":                {`"mail"`, "decode"},
		"no recipients":           {`{"subject":"no recipients"}`, "no personalizations"},
		"empty personalizations":  {`{"personalizations": [], ` + from + `, ` + content + `}`, "no personalizations"},
		"a null personalization":  {`{"personalizations": [null], ` + from + `, ` + content + `}`, "personalizations[0] is null"},
		"a personalization no to": {`{"personalizations": [{"to": [{"email": "a@example.com"}]}, {"cc": [{"email": "b@example.com"}]}], ` + from + `, ` + content + `}`, `personalizations[1] has no "to"`},
		"a to without email":      {`{"personalizations": [{"to": [{"name": "Ada"}]}], ` + from + `, ` + content + `}`, "personalizations[0].to[0] has no email"},
		"a null cc":               {`{"personalizations": [{"to": [{"email": "a@example.com"}], "cc": [null]}], ` + from + `, ` + content + `}`, "personalizations[0].cc[0] has no email"},
		"no from":                 {`{` + to + `, ` + content + `}`, `no "from" email`},
		"a from without email":    {`{` + to + `, "from": {"name": "Shop"}, ` + content + `}`, `no "from" email`},
		"no body":                 {`{` + to + `, ` + from + `, "subject": "hi"}`, `neither "content" nor "template_id"`},
		"empty content":           {`{` + to + `, ` + from + `, "content": [{"type": "text/plain", "value": ""}]}`, "content[0] needs a type and a value"},
		"an unknown field":        {`{` + to + `, ` + from + `, ` + content + `, "subjekt": "hi"}`, `unknown field "subjekt"`},
		"a misspelt list":         {`{"personalisations": [{"to": [{"email": "a@example.com"}]}], ` + from + `, ` + content + `}`, `unknown field "personalisations"`},
		"a number as custom arg":  {`{"personalizations": [{"to": [{"email": "a@example.com"}], "custom_args": {"n": 1}}], ` + from + `, ` + content + `}`, "decode"},
		"data after the object":   {`{` + to + `, ` + from + `, ` + content + `} {}`, "data after the mail object"},
		"an attachment no file":   {`{` + to + `, ` + from + `, ` + content + `, "attachments": [{"content": "aGk="}]}`, "attachments[0] needs a content and a filename"},
		"a reply_to without mail": {`{` + to + `, ` + from + `, ` + content + `, "reply_to": {"name": "x"}}`, "reply_to has no email"},
	}
	for name, tc := range cases {
		r := p.Call(context.Background(), testCall(tc.payload))
		if !r.IsRejected() || !errors.Is(r.Err, sendgrid.ErrBadPayload) {
			t.Errorf("%s: %s (%v), want rejected with ErrBadPayload", name, r.Class, r.Err)
			continue
		}
		if !strings.Contains(r.Err.Error(), tc.want) {
			t.Errorf("%s: error %q does not say %q", name, r.Err, tc.want)
		}
	}
	c := testCall()
	c.Key = ""
	if r := p.Call(context.Background(), c); !r.IsRejected() || !strings.Contains(r.Err.Error(), "no key") {
		t.Errorf("a call without a key: %s (%v), want rejected", r.Class, r.Err)
	}
	c.Key = "key with\nnewline"
	if r := p.Call(context.Background(), c); !r.IsRejected() {
		t.Errorf("a key with a newline: %s (%v), want rejected", r.Class, r.Err)
	}
	if n := len(s.all()); n != 0 {
		t.Fatalf("the server received %d requests for refused calls", n)
	}
}

// Errors start with the provider's name and name the call once: a provider
// named "mail" does not say "mail mail send".
func TestProvider_ErrorsNameTheProviderAndTheCall(t *testing.T) {
	t.Parallel()
	ts, _ := server(t, func(w http.ResponseWriter, _ *http.Request, _ received) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"errors": [{"message": "The from email does not contain a valid address.", "field": "from.email"}]}`)
	})
	const bad = `{"subject": "no recipients"}`
	for _, tc := range []struct{ name, want string }{
		{"", "sendgrid mail send: "},
		{"sendgrid", "sendgrid mail send: "},
		{"mail", "mail: sendgrid mail send: "},
		{"receipts", "receipts: sendgrid mail send: "},
	} {
		p := newProvider(t, ts.URL, func(c *sendgrid.Config) { c.Name = tc.name })
		errs := map[string]error{
			"an answer":       p.Call(context.Background(), testCall()).Err,
			"a bad payload":   p.Call(context.Background(), testCall(bad)).Err,
			"a payload check": p.CheckPayload("email.receipt", json.RawMessage(bad)),
		}
		for what, err := range errs {
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "mail mail") {
				t.Errorf("name %q, %s: error %q, want it to start with %q", tc.name, what, err, tc.want)
			}
		}
	}
}

// The answer to a request that reached SendGrid is lost on a connection
// that had served a request before: the kind of connection on which
// net/http retries some requests by itself. It must not retry this one.
func TestProvider_LostAnswerIsUnknownAndNotResent(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"abort", "hijack"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			served := 0
			ts, s := server(t, func(w http.ResponseWriter, r *http.Request, _ received) {
				mu.Lock()
				served++
				n := served
				mu.Unlock()
				if n == 1 {
					accepted(w)
					return
				}
				if how == "abort" {
					panic(http.ErrAbortHandler)
				}
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close()
				}
			})
			p := newProvider(t, ts.URL)
			if r := p.Call(context.Background(), testCall()); !r.IsConfirmed() {
				t.Fatalf("first call: %s %v", r.Class, r.Err)
			}
			r := p.Call(context.Background(), testCall())
			if !r.IsUnknown() {
				t.Fatalf("a request whose answer was lost: %s (%v), want unknown", r.Class, r.Err)
			}
			noSecret(t, r)
			if n := len(s.all()); n != 2 {
				t.Fatalf("the server received %d requests, want 2: the lost one was resent", n)
			}
		})
	}
}

func TestProvider_SlowAnswerPastDeadlineIsUnknown(t *testing.T) {
	t.Parallel()
	// The server never answers: it holds each request until the client
	// gives up (and records that it did) or the test ends. Call returning
	// at all therefore shows it gave up on its deadline, not on an answer;
	// no clock is read.
	gaveUp := make(chan struct{}, 2)
	ended := make(chan struct{})
	t.Cleanup(func() { close(ended) })
	hang := func(w http.ResponseWriter, r *http.Request, _ received) {
		select {
		case <-r.Context().Done():
			gaveUp <- struct{}{}
		case <-ended:
		}
	}
	t.Run("the call's context", func(t *testing.T) {
		ts, s := server(t, hang)
		p := newProvider(t, ts.URL)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		r := p.Call(ctx, testCall())
		if !r.IsUnknown() || !errors.Is(r.Err, context.DeadlineExceeded) {
			t.Fatalf("%s (%v), want unknown after the deadline", r.Class, r.Err)
		}
		if n := len(s.all()); n != 1 {
			t.Fatalf("the server received %d requests", n)
		}
		// The client closed its side: the request is not left open.
		select {
		case <-gaveUp:
		case <-testCtx(t).Done():
			t.Fatal("the server never saw the client give up")
		}
	})
	t.Run("Config.Timeout", func(t *testing.T) {
		ts, _ := server(t, hang)
		p := newProvider(t, ts.URL, func(c *sendgrid.Config) { c.Timeout = 200 * time.Millisecond })
		if r := p.Call(context.Background(), testCall()); !r.IsUnknown() || !errors.Is(r.Err, context.DeadlineExceeded) {
			t.Fatalf("%s (%v), want unknown after Config.Timeout", r.Class, r.Err)
		}
		select {
		case <-gaveUp:
		case <-testCtx(t).Done():
			t.Fatal("the server never saw the client give up")
		}
	})
}

func TestProvider_NotSentIsRetryable(t *testing.T) {
	t.Parallel()
	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + l.Addr().String()
		l.Close()
		r := newProvider(t, url).Call(context.Background(), testCall())
		if !r.IsRetryable() || !strings.Contains(r.Err.Error(), "not sent") {
			t.Fatalf("%s (%v), want retryable", r.Class, r.Err)
		}
		noSecret(t, r)
	})
	t.Run("context done before the call", func(t *testing.T) {
		t.Parallel()
		ts, s := server(t, func(w http.ResponseWriter, _ *http.Request, _ received) { accepted(w) })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if r := newProvider(t, ts.URL).Call(ctx, testCall()); !r.IsRetryable() {
			t.Fatalf("%s (%v), want retryable", r.Class, r.Err)
		}
		if n := len(s.all()); n != 0 {
			t.Fatalf("the server received %d requests", n)
		}
	})
	t.Run("deadline during a dial that hangs", func(t *testing.T) {
		t.Parallel()
		dialing := make(chan struct{}, 1)
		hc := &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				dialing <- struct{}{}
				<-ctx.Done() // a peer that never answers the SYN
				return nil, ctx.Err()
			},
		}}
		t.Cleanup(hc.CloseIdleConnections)
		p := newProvider(t, "http://192.0.2.1", func(c *sendgrid.Config) { c.HTTPClient = hc })
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		r := p.Call(ctx, testCall())
		if !r.IsRetryable() || !strings.Contains(r.Err.Error(), "not sent") {
			t.Fatalf("%s (%v), want retryable: no connection, nothing written", r.Class, r.Err)
		}
		select {
		case <-dialing:
		default:
			t.Fatal("the transport never dialled")
		}
	})
}

// A transport that is not an *http.Transport reports no trace: its errors
// are classified on their own, and a deadline is unknown.
func TestProvider_OpaqueTransportTimeoutIsUnknown(t *testing.T) {
	t.Parallel()
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		<-r.Context().Done()
		return nil, r.Context().Err()
	})}
	p := newProvider(t, "http://192.0.2.1", func(c *sendgrid.Config) { c.HTTPClient = hc })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if r := p.Call(ctx, testCall()); !r.IsUnknown() {
		t.Fatalf("%s (%v), want unknown", r.Class, r.Err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// An answer far larger than any SendGrid sends is cut, not read into memory
// whole.
func TestProvider_ReadsABoundedAnswer(t *testing.T) {
	t.Parallel()
	ts, _ := server(t, func(w http.ResponseWriter, _ *http.Request, _ received) {
		w.WriteHeader(http.StatusBadRequest)
		bw := bufio.NewWriter(w)
		for range 8 << 10 { // 8 MiB
			bw.WriteString(strings.Repeat("z", 1023) + "\n") //nolint:errcheck
		}
		bw.Flush() //nolint:errcheck
	})
	r := newProvider(t, ts.URL).Call(context.Background(), testCall())
	if !r.IsUnknown() || len(r.Detail) > 1024 { // not SendGrid's error JSON: unknown
		t.Fatalf("%s, Detail of %d bytes", r.Class, len(r.Detail))
	}
}

func TestNew_ChecksConfig(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		cfg  *sendgrid.Config
		want string
	}{
		"nil":                {nil, "nil Config"},
		"no key":             {&sendgrid.Config{}, "APIKey is required"},
		"a key with newline": {&sendgrid.Config{APIKey: testKey + "\n"}, "APIKey has a space"},
		"a key with space":   {&sendgrid.Config{APIKey: "SG. " + testKey}, "APIKey has a space"},
		"ftp":                {&sendgrid.Config{APIKey: testKey, BaseURL: "ftp://api.sendgrid.com"}, "scheme must be http or https"},
		"no host":            {&sendgrid.Config{APIKey: testKey, BaseURL: "https://"}, "has no host"},
		"no scheme":          {&sendgrid.Config{APIKey: testKey, BaseURL: "api.sendgrid.com"}, "scheme must be"},
		"user info":          {&sendgrid.Config{APIKey: testKey, BaseURL: "https://u:" + testKey + "@api.sendgrid.com"}, "has user info"},
		"a query":            {&sendgrid.Config{APIKey: testKey, BaseURL: "https://api.sendgrid.com?x=1"}, "query or fragment"},
		"the key as user":    {&sendgrid.Config{APIKey: testKey, BaseURL: "ftp://" + testKey + "@api.sendgrid.com"}, "scheme must be"},
		"not a URL":          {&sendgrid.Config{APIKey: testKey, BaseURL: "https://" + testKey + "@api.sendgrid.com:port/%zz"}, "not a URL"},
		"a negative timeout": {&sendgrid.Config{APIKey: testKey, Timeout: -time.Second}, "negative Timeout"},
	}
	for name, tc := range cases {
		_, err := sendgrid.New(tc.cfg)
		if !errors.Is(err, sendgrid.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrConfig saying %q", name, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), testKey) {
			t.Errorf("%s: the error holds the API key: %v", name, err)
		}
	}
}

func TestNew_Defaults(t *testing.T) {
	t.Parallel()
	p, err := sendgrid.New(&sendgrid.Config{APIKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Name() != "sendgrid" || p.Idempotent() || providers.KeyWindow(p) != 0 {
		t.Fatalf("Name %q, Idempotent %v, KeyWindow %s; want sendgrid, false, 0", p.Name(), p.Idempotent(), providers.KeyWindow(p))
	}
	named := newProvider(t, "", func(c *sendgrid.Config) { c.Name = "sendgrid-eu" })
	if named.Name() != "sendgrid-eu" {
		t.Fatalf("Name %q", named.Name())
	}
	// A caller's client keeps its own redirect policy.
	hc := &http.Client{}
	newProvider(t, "", func(c *sendgrid.Config) { c.HTTPClient = hc })
	if hc.CheckRedirect != nil || hc.Transport != nil {
		t.Fatal("New changed the caller's http.Client")
	}
}

// FuzzProvider_Payload: no payload makes Call panic, and one it refuses is
// refused before any request (the provider's peer refuses connections, so a
// request would be retryable, not rejected).
func FuzzProvider_Payload(f *testing.F) {
	for _, seed := range []string{
		validPayload, `{"subject":"no recipients"}`, `null`, `[]`, `{"personalizations":[null]}`,
		`{"personalizations":[{"to":[null]}],"from":{"email":"a@b"},"template_id":"d-1"}`,
		`{"personalizations":[{"to":[{"email":"a@b"}],"custom_args":null,"headers":null}],"from":{"email":"a@b"},"template_id":"d-1","headers":{"X-SIDEFX-KEY":"1"}}`,
	} {
		f.Add(seed)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close()
	p, err := sendgrid.New(&sendgrid.Config{APIKey: testKey, BaseURL: url})
	if err != nil {
		f.Fatal(err)
	}
	defer p.Close()
	f.Fuzz(func(t *testing.T, payload string) {
		r := p.Call(context.Background(), testCall(payload))
		switch {
		case r.IsRejected():
			if !errors.Is(r.Err, sendgrid.ErrBadPayload) {
				t.Fatalf("rejected without ErrBadPayload: %v", r.Err)
			}
		case r.IsRetryable(): // accepted, and refused by the closed port
		default:
			t.Fatalf("%s (%v)", r.Class, r.Err)
		}
		noSecret(t, r)
	})
}
