package webhook_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.uber.org/goleak"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
	"github.com/sidefx/sidefx/providers/webhook"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testSecret is the endpoint secret of most tests: 24 bytes.
const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

const testKind = "webhook.order_paid"

// secretForms returns the spellings of secret that must never appear in a
// result: the secret, and its key in base64 and hex.
func secretForms(t *testing.T, secret string) []string {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	return []string{secret, base64.StdEncoding.EncodeToString(key), base64.RawURLEncoding.EncodeToString(key), hex.EncodeToString(key)}
}

// newSecret returns a random Standard Webhooks secret of 32 bytes.
func newSecret(t *testing.T) string {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(key)
}

// newProvider returns a provider for url with testSecret, as mod adjusts its
// config, closed when the test ends.
func newProvider(t *testing.T, url string, mod ...func(*webhook.Config)) *webhook.Provider {
	t.Helper()
	cfg := &webhook.Config{URL: url, Secret: testSecret}
	for _, m := range mod {
		m(cfg)
	}
	p, err := webhook.New(cfg)
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

func callFor(source, payload string) providers.Call {
	return providers.Call{EffectID: 1, SourceID: source, Kind: testKind, Key: derive.Key(source, testKind), Payload: json.RawMessage(payload), Attempt: 1}
}

// delivery is one request a receiver got.
type delivery struct {
	method, path string
	header       http.Header
	body         []byte
	verifyErr    error // from the reference library
}

// receiver is a webhook endpoint that verifies every delivery with the
// Standard Webhooks reference library and records it.
type receiver struct {
	*httptest.Server
	wh     *standardwebhooks.Webhook
	answer func(w http.ResponseWriter, r *http.Request, d delivery)
	stop   chan struct{} // closed when the test ends: hanging handlers return
	conns  atomic.Int64  // connections accepted
	mu     sync.Mutex
	got    []delivery
}

// newReceiver starts a receiver holding secret; answer writes its answers
// (nil: 401 for a bad signature, else 200 {"id":"evt_<n>"}).
func newReceiver(t *testing.T, secret string, answer func(w http.ResponseWriter, r *http.Request, d delivery)) *receiver {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{wh: wh, answer: answer, stop: make(chan struct{})}
	if rc.answer == nil {
		rc.answer = func(w http.ResponseWriter, _ *http.Request, d delivery) {
			if d.verifyErr != nil {
				http.Error(w, "bad signature", http.StatusUnauthorized)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"evt_%d"}`, len(rc.deliveries()))
		}
	}
	rc.Server = httptest.NewUnstartedServer(http.HandlerFunc(rc.serve))
	rc.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			rc.conns.Add(1)
		}
	}
	rc.Start()
	t.Cleanup(func() {
		close(rc.stop)
		rc.CloseClientConnections()
		rc.Close()
	})
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	d := delivery{method: r.Method, path: r.URL.Path, header: r.Header.Clone(), body: body, verifyErr: rc.wh.Verify(body, r.Header)}
	rc.mu.Lock()
	rc.got = append(rc.got, d)
	rc.mu.Unlock()
	rc.answer(w, r, d)
}

func (rc *receiver) deliveries() []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]delivery(nil), rc.got...)
}

// hang holds a request until the client gives up or the test ends.
func (rc *receiver) hang(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-rc.stop:
	}
}

// checkNoSecret fails if a form of secret appears in r.
func checkNoSecret(t *testing.T, r providers.Result, secret string) {
	t.Helper()
	text := r.Ref + " " + string(r.Detail)
	if r.Err != nil {
		text += " " + r.Err.Error()
	}
	for _, s := range secretForms(t, secret) {
		if strings.Contains(text, s) {
			t.Fatalf("a %s result holds the secret: %s", r.Class, text)
		}
	}
}

// decodeDetail decodes a result's Detail, which must be a JSON object.
func decodeDetail(t *testing.T, r providers.Result) map[string]any {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal(r.Detail, &d); err != nil {
		t.Fatalf("Detail %s is not a JSON object: %v", r.Detail, err)
	}
	return d
}

// The secrets of the conformance endpoint: every value the provider is
// configured with that a receiver could echo.
const (
	confUser   = "hook-user"
	confPass   = "url-pass/word+42"   // escaped in the URL
	confToken  = "query-token/ab+cd=" // escaped in the URL
	confHeader = "gw-token-1234567"
)

func TestProvider_Conformance(t *testing.T) {
	// Two signing secrets, as during a rotation: the receiver knows the new
	// one only.
	newSecret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a-new-key-for-rotation-24b"))
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(testSecret, "whsec_"))
	wh, err := standardwebhooks.NewWebhook(newSecret)
	if err != nil {
		t.Fatal(err)
	}
	providertest.RunConformance(t, providertest.Conformance{
		New: func(t *testing.T, baseURL string) providers.Provider {
			u := strings.Replace(baseURL, "http://", "http://"+url.UserPassword(confUser, confPass).String()+"@", 1) +
				"/hooks?tenant=acme&token=" + url.QueryEscape(confToken)
			return newProvider(t, u, func(c *webhook.Config) {
				c.Secrets = []string{newSecret}
				c.Headers = map[string]string{"X-Gateway-Token": "Bearer " + confHeader}
				// What proves the receiver answered (RespondJSON's marks),
				// so that an intermediary's 2xx is not confirmed.
				c.ConfirmWhen = providers.ConfirmWhen{ContentType: "application/json", Headers: []string{"X-Request-Id"}}
			})
		},
		Kind:       testKind,
		Payload:    json.RawMessage(`{"order":"o_1","amount":1200,"currency":"eur"}`),
		BadPayload: json.RawMessage(`[1,2,3]`),
		Secrets: []string{testSecret, base64.StdEncoding.EncodeToString(key), newSecret, confPass, confToken, confHeader,
			base64.StdEncoding.EncodeToString([]byte(confUser + ":" + confPass))},
		Key: func(r *http.Request, body []byte) string {
			// A delivery that does not verify, or whose two keys differ,
			// shows as a wrong key.
			if err := wh.Verify(body, r.Header); err != nil {
				return "unverified: " + err.Error()
			}
			if id := r.Header.Get("webhook-id"); id != r.Header.Get("Idempotency-Key") {
				return "webhook-id " + id + " differs from Idempotency-Key"
			}
			return r.Header.Get("webhook-id")
		},
		Respond: providertest.RespondJSON(200),
	})
}

func TestProvider_SignatureVerifiedByReferenceLibrary(t *testing.T) {
	t.Parallel()
	large := func() string {
		var b strings.Builder
		b.WriteString(`{"items":[`)
		for i := range 20000 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"n":%d,"name":"Zoë №%d","note":"\"quoted\"\\n"}`, i, i)
		}
		b.WriteString(`]}`)
		return b.String()
	}()
	payloads := []struct{ name, payload string }{
		{"plain", `{"order":"o_1","amount":1200}`},
		{"unicode", `{"name":"Zoë – 東京 🚀","greeting":"مرحبا","combining":"e\u0301"}`},
		{"raw unicode and escapes", "{\"s\":\"Ünïcödé ✓ \\\" \\\\ \\n \\t \\u0000 \\u2028 \\ud83d\\ude80 </script>&amp;\"}"},
		{"white space kept", "{ \"b\" : 2 ,\n\t\"a\" : [ 1 , 2.50 , 1e3 ] }\n"},
		{"empty object", `{}`},
		{"large", large},
	}
	for _, tc := range payloads {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, testSecret, nil)
			p := newProvider(t, rc.URL)
			call := callFor("order-"+tc.name, tc.payload)
			r := p.Call(testCtx(t), call)
			if !r.IsConfirmed() {
				t.Fatalf("got %s (%v), want confirmed", r.Class, r.Err)
			}
			got := rc.deliveries()
			if len(got) != 1 {
				t.Fatalf("%d deliveries, want 1", len(got))
			}
			d := got[0]
			if d.verifyErr != nil {
				t.Fatalf("the reference library refused the delivery: %v", d.verifyErr)
			}
			if !bytes.Equal(d.body, []byte(tc.payload)) {
				t.Fatalf("the body was changed on the way:\n got %q\nwant %q", d.body, tc.payload)
			}
			// The signature is the one the library computes, not merely one
			// it accepts.
			ts, err := strconv.ParseInt(d.header.Get("webhook-timestamp"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := rc.wh.Sign(call.Key, time.Unix(ts, 0), []byte(tc.payload))
			if sig := d.header.Get("webhook-signature"); sig != want {
				t.Fatalf("webhook-signature %q, the library signs %q", sig, want)
			}
		})
	}

	t.Run("a retry is signed again with a new timestamp and the same id", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, testSecret, nil)
		p := newProvider(t, rc.URL)
		now := time.Now()
		call := callFor("order-retry", `{"order":"o_2"}`)
		for attempt, at := range []time.Time{now.Add(-2 * time.Minute), now} {
			webhook.SetClock(p, func() time.Time { return at })
			call.Attempt = attempt + 1
			if r := p.Call(testCtx(t), call); !r.IsConfirmed() {
				t.Fatalf("attempt %d: %s (%v)", call.Attempt, r.Class, r.Err)
			}
		}
		got := rc.deliveries()
		if len(got) != 2 {
			t.Fatalf("%d deliveries, want 2", len(got))
		}
		for i, d := range got {
			if d.verifyErr != nil {
				t.Fatalf("delivery %d does not verify: %v", i+1, d.verifyErr)
			}
			if id := d.header.Get("webhook-id"); id != call.Key {
				t.Fatalf("delivery %d has webhook-id %q, want the key %q", i+1, id, call.Key)
			}
		}
		t1, t2 := got[0].header.Get("webhook-timestamp"), got[1].header.Get("webhook-timestamp")
		if t1 == t2 || t1 != strconv.FormatInt(now.Add(-2*time.Minute).Unix(), 10) || t2 != strconv.FormatInt(now.Unix(), 10) {
			t.Fatalf("timestamps %s then %s, want each attempt's own", t1, t2)
		}
		if got[0].header.Get("webhook-signature") == got[1].header.Get("webhook-signature") {
			t.Fatal("two attempts at different times carry the same signature")
		}
	})

	t.Run("a stale timestamp is refused by the library", func(t *testing.T) {
		// The check above is not vacuous: the library enforces its window.
		t.Parallel()
		rc := newReceiver(t, testSecret, nil)
		p := newProvider(t, rc.URL)
		webhook.SetClock(p, func() time.Time { return time.Now().Add(-time.Hour) })
		r := p.Call(testCtx(t), callFor("order-stale", `{"order":"o_3"}`))
		if got := rc.deliveries(); len(got) != 1 || !errors.Is(got[0].verifyErr, standardwebhooks.ErrMessageTooOld) {
			t.Fatalf("deliveries %+v, want one refused as too old", got)
		}
		if !r.IsRejected() {
			t.Fatalf("a 401 answer: %s, want rejected", r.Class)
		}
	})

	t.Run("another secret does not verify", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, testSecret, nil)
		other := newSecret(t)
		p := newProvider(t, rc.URL, func(c *webhook.Config) { c.Secret = other })
		r := p.Call(testCtx(t), callFor("order-other", `{"order":"o_4"}`))
		got := rc.deliveries()
		if len(got) != 1 || !errors.Is(got[0].verifyErr, standardwebhooks.ErrNoMatchingSignature) {
			t.Fatalf("deliveries %+v, want one refused for its signature", got)
		}
		var se *webhook.StatusError
		if !r.IsRejected() || !errors.As(r.Err, &se) || se.StatusCode != http.StatusUnauthorized {
			t.Fatalf("got %s (%v), want rejected with status 401", r.Class, r.Err)
		}
		checkNoSecret(t, r, other)
	})
}

func TestProvider_ClassifiesAnswers(t *testing.T) {
	t.Parallel()
	// The provider reads Retry-After dates against this clock (and signs
	// with it, well inside the receiver's tolerance): the waits are exact
	// however long the test takes to get there.
	now := time.Now().Truncate(time.Second)
	type answer func(w http.ResponseWriter)
	status := func(code int, body string, header ...string) answer {
		return func(w http.ResponseWriter) {
			for i := 0; i+1 < len(header); i += 2 {
				w.Header().Set(header[i], header[i+1])
			}
			w.WriteHeader(code)
			io.WriteString(w, body)
		}
	}
	cases := []struct {
		name   string
		answer answer
		want   providers.Class
		after  [2]time.Duration // RetryAfter within [min, max]
		is     error
	}{
		{"410 gone", status(410, `{"error":"endpoint deleted"}`), providers.Rejected, [2]time.Duration{}, webhook.ErrGone},
		{"404 not found", status(404, "no such hook"), providers.Rejected, [2]time.Duration{}, nil},
		{"400 bad request", status(400, `{"error":"bad order"}`), providers.Rejected, [2]time.Duration{}, nil},
		{"401 unauthorized", status(401, "bad signature"), providers.Rejected, [2]time.Duration{}, nil},
		{"422 unprocessable", status(422, "<html>nope</html>"), providers.Rejected, [2]time.Duration{}, nil},
		{"408 request timeout", status(408, ""), providers.Retryable, [2]time.Duration{}, nil},
		{"409 conflict: another delivery of the id in progress", status(409, "in progress"), providers.Unknown, [2]time.Duration{}, nil},
		{"425 too early", status(425, ""), providers.Retryable, [2]time.Duration{}, nil},
		{"429 with Retry-After seconds", status(429, "slow down", "Retry-After", "7"), providers.Retryable, [2]time.Duration{7 * time.Second, 7 * time.Second}, nil},
		{"429 with Retry-After date", func(w http.ResponseWriter) {
			status(429, "slow down", "Retry-After", now.Add(30*time.Second).UTC().Format(http.TimeFormat))(w)
		}, providers.Retryable, [2]time.Duration{30 * time.Second, 30 * time.Second}, nil},
		// The receiver failed, perhaps after it acted: unknown, retried
		// with the same webhook-id.
		{"500 internal error", status(500, "boom"), providers.Unknown, [2]time.Duration{}, nil},
		{"502 bad gateway", status(502, "<html>bad gateway</html>"), providers.Unknown, [2]time.Duration{}, nil},
		{"503 with Retry-After", status(503, "maintenance", "Retry-After", "2"), providers.Unknown, [2]time.Duration{2 * time.Second, 2 * time.Second}, nil},
		{"504 gateway timeout", status(504, ""), providers.Unknown, [2]time.Duration{}, nil},
		{"status 600 is no decision", status(600, ""), providers.Unknown, [2]time.Duration{}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, testSecret, func(w http.ResponseWriter, _ *http.Request, _ delivery) { tc.answer(w) })
			p := newProvider(t, rc.URL)
			webhook.SetClock(p, func() time.Time { return now })
			r := p.Call(testCtx(t), callFor("order-"+tc.name, `{"order":"o_1"}`))
			if r.Class != tc.want || r.Err == nil {
				t.Fatalf("got %s (%v), want %s with an error", r.Class, r.Err, tc.want)
			}
			if r.RetryAfter < tc.after[0] || r.RetryAfter > tc.after[1] {
				t.Fatalf("RetryAfter %s, want within %s", r.RetryAfter, tc.after)
			}
			if tc.is != nil && !errors.Is(r.Err, tc.is) {
				t.Fatalf("error %v does not match %v", r.Err, tc.is)
			}
			var se *webhook.StatusError
			if !errors.As(r.Err, &se) {
				t.Fatalf("error %v is not a *StatusError", r.Err)
			}
			d := decodeDetail(t, r)
			if d["status"] != float64(se.StatusCode) {
				t.Fatalf("Detail %s, want status %d", r.Detail, se.StatusCode)
			}
			if got := len(rc.deliveries()); got != 1 {
				t.Fatalf("%d deliveries, want 1", got)
			}
			checkNoSecret(t, r, testSecret)
		})
	}

	t.Run("Detail keeps a JSON body as JSON and text as a string", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, testSecret, func(w http.ResponseWriter, r *http.Request, _ delivery) {
			w.Header().Set("X-Request-Id", "req_77")
			if strings.Contains(r.URL.Path, "json") {
				status(410, `{"error":"gone","code":7}`)(w)
				return
			}
			status(404, "no such \"hook\"\n")(w)
		})
		p := newProvider(t, rc.URL+"/json")
		d := decodeDetail(t, p.Call(testCtx(t), callFor("order-json", `{}`)))
		if body, ok := d["body"].(map[string]any); !ok || body["error"] != "gone" || d["request_id"] != "req_77" {
			t.Fatalf("Detail %v, want the JSON body as an object and the request id", d)
		}
		p = newProvider(t, rc.URL+"/text")
		d = decodeDetail(t, p.Call(testCtx(t), callFor("order-text", `{}`)))
		if d["body"] != "no such \"hook\"\n" {
			t.Fatalf("Detail %v, want the text body as a string", d)
		}
	})
}

func TestProvider_ConfirmedRefAndReplay(t *testing.T) {
	t.Parallel()
	call := callFor("order-ref", `{"order":"o_1"}`)
	cases := []struct {
		name     string
		code     int
		body     string
		header   map[string]string
		ref      string
		replayed bool
	}{
		{"id from the body", 200, `{"id":"evt_1","status":"ok"}`, nil, "evt_1", false},
		{"numeric id", 201, `{"id":12345}`, nil, "12345", false},
		{"body id before the header", 200, `{"id":"evt_2"}`, map[string]string{"X-Request-Id": "req_2"}, "evt_2", false},
		{"id is case-sensitive", 200, `{"ID":"evt_3"}`, map[string]string{"X-Request-Id": "req_3"}, "req_3", false},
		{"header when the body is not JSON", 202, `accepted`, map[string]string{"X-Request-Id": "req_4"}, "req_4", false},
		{"the webhook-id when there is nothing else", 204, ``, nil, call.Key, false},
		{"an unusable id is skipped", 200, `{"id":"bad\u0000id"}`, nil, call.Key, false},
		{"an empty id is skipped", 200, `{"id":""}`, map[string]string{"X-Request-Id": "req_5"}, "req_5", false},
		{"an object id is skipped", 200, `{"id":{"a":1}}`, nil, call.Key, false},
		{"replayed", 200, `{"id":"evt_6"}`, map[string]string{"Idempotent-Replayed": "true"}, "evt_6", true},
		{"replayed, any case", 200, ``, map[string]string{"Idempotent-Replayed": "TRUE"}, call.Key, true},
		{"not replayed", 200, ``, map[string]string{"Idempotent-Replayed": "false"}, call.Key, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, testSecret, func(w http.ResponseWriter, _ *http.Request, _ delivery) {
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.code)
				io.WriteString(w, tc.body)
			})
			r := newProvider(t, rc.URL).Call(testCtx(t), call)
			if !r.IsConfirmed() || r.Err != nil {
				t.Fatalf("got %s (%v), want confirmed", r.Class, r.Err)
			}
			if r.Ref != tc.ref || r.Replayed != tc.replayed {
				t.Fatalf("Ref %q replayed %t, want %q %t", r.Ref, r.Replayed, tc.ref, tc.replayed)
			}
			if d := decodeDetail(t, r); d["status"] != float64(tc.code) {
				t.Fatalf("Detail %s, want status %d", r.Detail, tc.code)
			}
		})
	}
}

// A redirect is never followed. 301, 307 and 308 say the endpoint moved:
// the delivery was not processed there, rejected. 302 and 303 are what web
// frameworks answer to a POST they processed: unknown.
func TestProvider_RedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	for code, want := range map[int]providers.Class{
		301: providers.Rejected, 307: providers.Rejected, 308: providers.Rejected,
		302: providers.Unknown, 303: providers.Unknown,
	} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, testSecret, func(w http.ResponseWriter, r *http.Request, _ delivery) {
				if r.URL.Path == "/moved" {
					io.WriteString(w, `{"id":"followed"}`)
					return
				}
				http.Redirect(w, r, "/moved", code)
			})
			for _, own := range []bool{true, false} {
				var hc *http.Client
				if !own {
					hc = &http.Client{Transport: &http.Transport{}}
					defer hc.CloseIdleConnections()
				}
				p := newProvider(t, rc.URL+"/hooks", func(c *webhook.Config) { c.HTTPClient = hc })
				r := p.Call(testCtx(t), callFor("order-redirect", `{"order":"o_1"}`))
				if r.Class != want || !errors.Is(r.Err, webhook.ErrRedirect) {
					t.Fatalf("got %s (%v), want %s with ErrRedirect", r.Class, r.Err, want)
				}
				if d := decodeDetail(t, r); d["status"] != float64(code) || d["location"] != "/moved" {
					t.Fatalf("Detail %s, want the status and the location", r.Detail)
				}
				if hc != nil && hc.CheckRedirect != nil {
					t.Fatal("New changed the caller's http.Client")
				}
			}
			for _, d := range rc.deliveries() {
				if d.path != "/hooks" {
					t.Fatalf("the redirect to %s was followed", d.path)
				}
			}
		})
	}
}

func TestProvider_LostAnswerIsUnknown(t *testing.T) {
	t.Parallel()
	t.Run("on a fresh connection, sent once", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, testSecret, func(http.ResponseWriter, *http.Request, delivery) {
			panic(http.ErrAbortHandler) // read, then dropped unanswered
		})
		r := newProvider(t, rc.URL).Call(testCtx(t), callFor("order-lost", `{"order":"o_1"}`))
		if !r.IsUnknown() {
			t.Fatalf("got %s (%v), want unknown", r.Class, r.Err)
		}
		if got := rc.deliveries(); len(got) != 1 || got[0].verifyErr != nil {
			t.Fatalf("%d deliveries, want exactly 1, verified", len(got))
		}
		if n := rc.conns.Load(); n != 1 {
			t.Fatalf("%d connections, want 1", n)
		}
		checkNoSecret(t, r, testSecret)
	})

	t.Run("on a reused connection, it is sent once and unknown: net/http's resend is off", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, testSecret, func(w http.ResponseWriter, r *http.Request, d delivery) {
			if bytes.Contains(d.body, []byte(`"drop":true`)) {
				panic(http.ErrAbortHandler)
			}
			io.WriteString(w, `{"id":"evt_ok"}`)
		})
		p := newProvider(t, rc.URL)
		// Whether the second call finds the first one's connection idle is
		// up to net/http's scheduling: try until it does, checking both.
		reusedSeen := false
		for i := 0; i < 20 && !reusedSeen; i++ {
			if r := p.Call(testCtx(t), callFor(fmt.Sprintf("order-ok-%d", i), `{"drop":false}`)); !r.IsConfirmed() {
				t.Fatalf("got %s (%v), want confirmed", r.Class, r.Err)
			}
			var mu sync.Mutex
			var reused []bool
			ctx := httptrace.WithClientTrace(testCtx(t), &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
				mu.Lock()
				defer mu.Unlock()
				reused = append(reused, info.Reused)
			}})
			call := callFor(fmt.Sprintf("order-drop-%d", i), `{"drop":true}`)
			if r := p.Call(ctx, call); !r.IsUnknown() {
				t.Fatalf("got %s (%v), want unknown", r.Class, r.Err)
			}
			var sent []delivery
			for _, d := range rc.deliveries() {
				if d.header.Get("webhook-id") == call.Key {
					sent = append(sent, d)
				}
			}
			mu.Lock()
			reusedSeen = len(reused) > 0 && reused[0]
			mu.Unlock()
			want := 1 // providers.OneRequest: a resend would hide a received request
			if len(sent) != want {
				t.Fatalf("connection reused %t: the request was sent %d times, want %d", reusedSeen, len(sent), want)
			}
			for _, d := range sent {
				if d.verifyErr != nil || d.header.Get("webhook-signature") != sent[0].header.Get("webhook-signature") {
					t.Fatalf("a resend differs or does not verify: %v", d.verifyErr)
				}
			}
		}
		if !reusedSeen {
			t.Log("no call found its connection idle: the resend was not observed")
		}
	})
}

func TestProvider_SlowAnswerIsUnknown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		ctx     time.Duration
		timeout time.Duration
	}{
		{"past the context's deadline", 200 * time.Millisecond, 0},
		{"past Config.Timeout", 0, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var rc *receiver
			rc = newReceiver(t, testSecret, func(_ http.ResponseWriter, r *http.Request, _ delivery) { rc.hang(r) })
			p := newProvider(t, rc.URL, func(c *webhook.Config) { c.Timeout = tc.timeout })
			ctx := testCtx(t)
			if tc.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
				defer cancel()
			}
			r := p.Call(ctx, callFor("order-slow", `{"order":"o_1"}`))
			if !r.IsUnknown() || !errors.Is(r.Err, context.DeadlineExceeded) {
				t.Fatalf("got %s (%v), want unknown after the deadline", r.Class, r.Err)
			}
			if got := len(rc.deliveries()); got != 1 {
				t.Fatalf("%d deliveries, want 1", got)
			}
		})
	}
}

func TestProvider_NotSentIsRetryable(t *testing.T) {
	t.Parallel()
	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + l.Addr().String() + "/hooks?token=qs-secret-123"
		l.Close()
		r := newProvider(t, url).Call(testCtx(t), callFor("order-refused", `{"order":"o_1"}`))
		if !r.IsRetryable() || r.Err == nil {
			t.Fatalf("got %s (%v), want retryable", r.Class, r.Err)
		}
		if strings.Contains(r.Err.Error(), "qs-secret-123") {
			t.Fatalf("the error shows the URL's query: %v", r.Err)
		}
		checkNoSecret(t, r, testSecret)
	})
	t.Run("context done before sending", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, testSecret, nil)
		ctx, cancel := context.WithCancel(testCtx(t))
		cancel()
		r := newProvider(t, rc.URL).Call(ctx, callFor("order-cancelled", `{"order":"o_1"}`))
		if !r.IsRetryable() || !errors.Is(r.Err, context.Canceled) {
			t.Fatalf("got %s (%v), want retryable", r.Class, r.Err)
		}
		if got := len(rc.deliveries()); got != 0 {
			t.Fatalf("%d deliveries, want none", got)
		}
	})
}

func TestProvider_BoundsTheAnswer(t *testing.T) {
	t.Parallel()
	const limit = 1024
	t.Run("an endless 200 body", func(t *testing.T) {
		t.Parallel()
		var rc *receiver
		rc = newReceiver(t, testSecret, func(w http.ResponseWriter, r *http.Request, _ delivery) {
			chunk := bytes.Repeat([]byte("x"), 32<<10)
			for range 4096 { // 128 MiB at most, if the client read it all
				if _, err := w.Write(chunk); err != nil {
					return
				}
				select {
				case <-r.Context().Done():
					return
				case <-rc.stop:
					return
				default:
				}
			}
		})
		p := newProvider(t, rc.URL, func(c *webhook.Config) { c.MaxResponseBytes = limit })
		call := callFor("order-endless", `{"order":"o_1"}`)
		r := p.Call(testCtx(t), call)
		if !r.IsConfirmed() || r.Ref != call.Key {
			t.Fatalf("got %s %q (%v), want confirmed with the webhook-id as Ref", r.Class, r.Ref, r.Err)
		}
		d := decodeDetail(t, r)
		if body, _ := d["body"].(string); len(body) != limit || d["truncated"] != true {
			t.Fatalf("Detail keeps %d bytes of body, truncated %v; want %d, true", len(body), d["truncated"], limit)
		}
	})
	t.Run("a secret across the cut is redacted before it", func(t *testing.T) {
		t.Parallel()
		const token = "gw-token-split-at-the-limit"
		rc := newReceiver(t, testSecret, func(w http.ResponseWriter, _ *http.Request, _ delivery) {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, strings.Repeat("x", limit-5)+token+strings.Repeat("y", 100))
		})
		p := newProvider(t, rc.URL, func(c *webhook.Config) {
			c.MaxResponseBytes = limit
			c.Headers = map[string]string{"Authorization": "Bearer " + token}
		})
		r := p.Call(testCtx(t), callFor("order-split", `{"order":"o_1"}`))
		body, _ := decodeDetail(t, r)["body"].(string)
		if len(body) != limit || strings.Contains(body, token[:5]) || !strings.HasSuffix(body, "x[reda") {
			t.Fatalf("body kept %q…: want the token redacted whole, then cut", body[max(0, len(body)-20):])
		}
	})
	t.Run("a large error body", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, testSecret, func(w http.ResponseWriter, _ *http.Request, _ delivery) {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"error":"%s"}`, strings.Repeat("é", 1<<20))
		})
		p := newProvider(t, rc.URL, func(c *webhook.Config) { c.MaxResponseBytes = limit })
		r := p.Call(testCtx(t), callFor("order-large-error", `{"order":"o_1"}`))
		if !r.IsRejected() {
			t.Fatalf("got %s (%v), want rejected", r.Class, r.Err)
		}
		if len(r.Detail) > 2*limit {
			t.Fatalf("Detail is %d bytes, want it bounded near %d", len(r.Detail), limit)
		}
		if d := decodeDetail(t, r); d["truncated"] != true {
			t.Fatalf("Detail %s does not say it was truncated", r.Detail)
		}
	})
}

func TestProvider_DetailIsStorable(t *testing.T) {
	// Detail goes to a jsonb column: PostgreSQL refuses \u0000, lone
	// surrogates, very deep nesting and numbers out of numeric's range.
	t.Parallel()
	deep := strings.Repeat("[", 200) + strings.Repeat("]", 200)
	for _, tc := range []struct {
		name, body string
		asJSON     bool // kept as JSON, not turned into a string
	}{
		{"plain JSON", `{"error":"nope","n":1.5}`, true},
		{"html escapes", `{"error":"\u003cb\u003e"}`, true},
		{"NUL escape", `{"error":"nul \u0000 here","k\u0000":1}`, true},
		{"lone surrogate", `{"error":"\ud800"}`, true},
		{"deep", deep, false},
		{"huge exponent", `{"n":1e999999}`, false},
		{"invalid UTF-8", "bad \xff\xfe bytes \x00 here", false},
		{"truncated JSON", `{"error":`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, testSecret, func(w http.ResponseWriter, _ *http.Request, _ delivery) {
				w.WriteHeader(http.StatusUnprocessableEntity)
				io.WriteString(w, tc.body)
			})
			r := newProvider(t, rc.URL).Call(testCtx(t), callFor("order-"+tc.name, `{}`))
			if !r.IsRejected() {
				t.Fatalf("got %s (%v), want rejected", r.Class, r.Err)
			}
			if !json.Valid(r.Detail) {
				t.Fatalf("Detail %q is not valid JSON", r.Detail)
			}
			lower := strings.ToLower(string(r.Detail))
			for _, bad := range []string{`\u0000`, `\ud8`, `\ud9`, `\uda`, `\udb`, `\udc`, `\udd`, `\ude`, `\udf`} {
				if strings.Contains(lower, bad) {
					t.Fatalf("Detail %s holds %s, which jsonb refuses", r.Detail, bad)
				}
			}
			d := decodeDetail(t, r)
			if _, isString := d["body"].(string); isString == tc.asJSON {
				t.Fatalf("Detail %s: body kept as JSON %t, want %t", r.Detail, !isString, tc.asJSON)
			}
		})
	}
}

func TestProvider_Request(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, testSecret, nil)
	p := newProvider(t, rc.URL+"/hooks/orders?tenant=acme", func(c *webhook.Config) {
		c.Headers = map[string]string{"Authorization": "Bearer gw-token", "X-Tenant": "acme"}
	})
	payload := "  {\"order\" : \"o_1\"}  "
	call := callFor("order-headers", payload)
	start := time.Now()
	if r := p.Call(testCtx(t), call); !r.IsConfirmed() {
		t.Fatalf("got %s (%v), want confirmed", r.Class, r.Err)
	}
	got := rc.deliveries()
	if len(got) != 1 {
		t.Fatalf("%d deliveries, want 1", len(got))
	}
	d := got[0]
	h := d.header
	checks := []struct{ what, got, want string }{
		{"method", d.method, http.MethodPost},
		{"path", d.path, "/hooks/orders"},
		{"body", string(d.body), payload},
		{"Content-Type", h.Get("Content-Type"), "application/json"},
		{"User-Agent", h.Get("User-Agent"), "sidefx"},
		{"webhook-id", h.Get("webhook-id"), call.Key},
		{"Idempotency-Key", h.Get("Idempotency-Key"), call.Key},
		{"Authorization", h.Get("Authorization"), "Bearer gw-token"},
		{"X-Tenant", h.Get("X-Tenant"), "acme"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %q, want %q", c.what, c.got, c.want)
		}
	}
	ts, err := strconv.ParseInt(h.Get("webhook-timestamp"), 10, 64)
	if err != nil || ts < start.Unix() || ts > time.Now().Unix() {
		t.Errorf("webhook-timestamp %q, want the unix seconds of the call", h.Get("webhook-timestamp"))
	}
	sig, ok := strings.CutPrefix(h.Get("webhook-signature"), "v1,")
	if raw, err := base64.StdEncoding.DecodeString(sig); !ok || err != nil || len(raw) != 32 {
		t.Errorf("webhook-signature %q, want v1, and a base64 HMAC-SHA256", h.Get("webhook-signature"))
	}
	if d.verifyErr != nil {
		t.Errorf("the delivery does not verify: %v", d.verifyErr)
	}
}

func TestProvider_RefusesBeforeSending(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, testSecret, nil)
	p := newProvider(t, rc.URL)
	for _, payload := range []string{`[1,2,3]`, `"order"`, `null`, `42`, ``, `   `, `{`, `{"a":1}{"b":2}`, `{"a":1} x`, "{\"a\":\"\xff\"}"} {
		r := p.Call(testCtx(t), callFor("order-bad", payload))
		if !r.IsRejected() || !errors.Is(r.Err, webhook.ErrBadPayload) {
			t.Fatalf("payload %q: %s (%v), want rejected with ErrBadPayload", payload, r.Class, r.Err)
		}
	}
	for _, key := range []string{"", "has space", "tab\tkey", "ü", strings.Repeat("k", 256)} {
		call := callFor("order-bad-key", `{"order":"o_1"}`)
		call.Key = key
		if r := p.Call(testCtx(t), call); !r.IsRejected() || r.Err == nil {
			t.Fatalf("key %q: %s (%v), want rejected", key, r.Class, r.Err)
		}
	}
	if got := len(rc.deliveries()); got != 0 {
		t.Fatalf("%d deliveries for calls refused locally", got)
	}
}

func TestProvider_RedactsAnEchoedSecret(t *testing.T) {
	t.Parallel()
	forms := secretForms(t, testSecret)
	rc := newReceiver(t, testSecret, func(w http.ResponseWriter, r *http.Request, _ delivery) {
		w.Header().Set("X-Request-Id", forms[3])
		w.Header().Set("Location", "/x?secret="+forms[0])
		switch r.URL.Path {
		case "/ok":
			fmt.Fprintf(w, `{"id":%q}`, forms[0])
		case "/redirect":
			w.WriteHeader(http.StatusFound)
		default:
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":"expected a signature under %s (%s, %s, %s)"}`, forms[0], forms[1], forms[2], forms[3])
		}
	})
	for _, path := range []string{"/ok", "/redirect", "/denied"} {
		r := newProvider(t, rc.URL+path).Call(testCtx(t), callFor("order-echo", `{}`))
		if r.IsConfirmed() != (path == "/ok") {
			t.Fatalf("%s: got %s (%v)", path, r.Class, r.Err)
		}
		checkNoSecret(t, r, testSecret)
		if !strings.Contains(string(r.Detail)+r.Ref, providers.Redacted) {
			t.Fatalf("%s: Detail %s, Ref %q: want the echoed secret shown as %s", path, r.Detail, r.Ref, providers.Redacted)
		}
	}
}

func TestProvider_SecretNeverPrinted(t *testing.T) {
	t.Parallel()
	cfg := webhook.Config{
		Name:    "webhook.orders",
		URL:     "https://user:url-password@hooks.example.com/sidefx?token=query-token",
		Secret:  testSecret,
		Headers: map[string]string{"Authorization": "Bearer header-token"},
	}
	p, err := webhook.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("configured", "config", cfg, "config_ptr", &cfg, "provider", p)
	text := fmt.Sprintf("%v %+v %#v %s %v %+v %#v %s %v", cfg, cfg, cfg, cfg, &cfg, p, p, p, *p) + logs.String()
	for _, s := range append(secretForms(t, testSecret), "url-password", "query-token", "header-token") {
		if strings.Contains(text, s) {
			t.Fatalf("%q is printed: %s", s, text)
		}
	}
	if !strings.Contains(text, "hooks.example.com") || !strings.Contains(text, "webhook.orders") {
		t.Fatalf("the description does not say which endpoint: %s", text)
	}
}

func TestNew_Validation(t *testing.T) {
	t.Parallel()
	short := "whsec_" + base64.StdEncoding.EncodeToString([]byte("only-8-b"))
	long := "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("k"), 65))
	noPrefix := strings.TrimPrefix(testSecret, "whsec_")
	notB64 := "whsec_MfKQ9r8GKYqrTwjU*D8ILPZIo2LaLaSw"
	cases := []struct {
		name  string
		cfg   *webhook.Config
		field string
	}{
		{"nil config", nil, "config"},
		{"missing URL", &webhook.Config{Secret: testSecret}, "URL"},
		{"bad scheme", &webhook.Config{URL: "ftp://hooks.example.com/x", Secret: testSecret}, "URL"},
		{"no scheme", &webhook.Config{URL: "hooks.example.com/x", Secret: testSecret}, "URL"},
		{"no host", &webhook.Config{URL: "https:///x", Secret: testSecret}, "URL"},
		{"unparsable URL", &webhook.Config{URL: "https://user:url-password@[::1/x", Secret: testSecret}, "URL"},
		{"missing secret", &webhook.Config{URL: "https://hooks.example.com"}, "Secret"},
		{"secret without whsec_", &webhook.Config{URL: "https://hooks.example.com", Secret: noPrefix}, "Secret"},
		{"secret not base64", &webhook.Config{URL: "https://hooks.example.com", Secret: notB64}, "Secret"},
		{"secret with a line break", &webhook.Config{URL: "https://hooks.example.com", Secret: testSecret + "\n"}, "Secret"},
		{"empty key", &webhook.Config{URL: "https://hooks.example.com", Secret: "whsec_"}, "Secret"},
		{"key too short", &webhook.Config{URL: "https://hooks.example.com", Secret: short}, "Secret"},
		{"key too long", &webhook.Config{URL: "https://hooks.example.com", Secret: long}, "Secret"},
		{"negative Timeout", &webhook.Config{URL: "https://hooks.example.com", Secret: testSecret, Timeout: -time.Second}, "Timeout"},
		{"negative MaxResponseBytes", &webhook.Config{URL: "https://hooks.example.com", Secret: testSecret, MaxResponseBytes: -1}, "MaxResponseBytes"},
		{"huge MaxResponseBytes", &webhook.Config{URL: "https://hooks.example.com", Secret: testSecret, MaxResponseBytes: 1 << 40}, "MaxResponseBytes"},
		{"reserved header", &webhook.Config{URL: "https://hooks.example.com", Secret: testSecret, Headers: map[string]string{"webhook-signature": "v1,forged"}}, "Headers"},
		{"reserved header, other case", &webhook.Config{URL: "https://hooks.example.com", Secret: testSecret, Headers: map[string]string{"IDEMPOTENCY-KEY": "k"}}, "Headers"},
		{"bad header name", &webhook.Config{URL: "https://hooks.example.com", Secret: testSecret, Headers: map[string]string{"X Bad": "v"}}, "Headers"},
		{"bad header value", &webhook.Config{URL: "https://hooks.example.com", Secret: testSecret, Headers: map[string]string{"Authorization": "Bearer header-token\r\nX-Evil: 1"}}, "Headers"},
	}
	never := append(secretForms(t, testSecret), short, long, noPrefix, notB64, "url-password", "header-token")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := webhook.New(tc.cfg)
			if err == nil {
				p.Close()
				t.Fatal("New accepted the config")
			}
			if !errors.Is(err, webhook.ErrConfig) {
				t.Fatalf("error %v does not wrap ErrConfig", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name %s", err, tc.field)
			}
			for _, s := range never {
				if strings.Contains(err.Error(), s) {
					t.Fatalf("error %q shows a secret", err)
				}
			}
		})
	}
}

func TestNew_Defaults(t *testing.T) {
	t.Parallel()
	p, err := webhook.New(&webhook.Config{URL: "http://127.0.0.1:1/hooks", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	timeout, maxBody := webhook.ClientSettings(p)
	if p.Name() != "webhook" || timeout != 10*time.Second || maxBody != 64<<10 || !p.Idempotent() {
		t.Fatalf("Name %q, Timeout %s, MaxResponseBytes %d, Idempotent %t", p.Name(), timeout, maxBody, p.Idempotent())
	}
	secret := newSecret(t) // any 32-byte key, as generators make them
	p2, err := webhook.New(&webhook.Config{Name: "webhook.crm", URL: "https://crm.example.com", Secret: secret, Timeout: time.Second, MaxResponseBytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	timeout, maxBody = webhook.ClientSettings(p2)
	if p2.Name() != "webhook.crm" || timeout != time.Second || maxBody != 10 {
		t.Fatalf("Name %q, Timeout %s, MaxResponseBytes %d", p2.Name(), timeout, maxBody)
	}
}

// Rotation: a delivery signed with several secrets carries one v1
// signature per secret, and a receiver that knows any one of them verifies
// it with the Standard Webhooks reference library; one that knows none
// refuses it.
func TestProvider_SignsWithEverySecretForRotation(t *testing.T) {
	t.Parallel()
	oldSecret, newSecret, otherSecret := newSecret(t), newSecret(t), newSecret(t)
	for _, tc := range []struct {
		name     string
		receiver string
		verifies bool
	}{
		{"a receiver that knows the old secret", oldSecret, true},
		{"a receiver that knows the new secret", newSecret, true},
		{"a receiver that knows neither", otherSecret, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, tc.receiver, nil)
			p := newProvider(t, rc.URL, func(c *webhook.Config) {
				c.Secret = oldSecret
				c.Secrets = []string{newSecret, oldSecret} // a repeat signs once
			})
			call := callFor("order-rotate", `{"order":"o_9"}`)
			r := p.Call(testCtx(t), call)
			got := rc.deliveries()
			if len(got) != 1 {
				t.Fatalf("%d deliveries", len(got))
			}
			d := got[0]
			sigs := strings.Split(d.header.Get("webhook-signature"), " ")
			if len(sigs) != 2 {
				t.Fatalf("webhook-signature %q: want two space-separated signatures", d.header.Get("webhook-signature"))
			}
			ts, _ := strconv.ParseInt(d.header.Get("webhook-timestamp"), 10, 64)
			for i, s := range []string{oldSecret, newSecret} {
				wh, _ := standardwebhooks.NewWebhook(s)
				if want, _ := wh.Sign(call.Key, time.Unix(ts, 0), d.body); sigs[i] != want {
					t.Fatalf("signature %d is %q, the library signs %q", i, sigs[i], want)
				}
			}
			if (d.verifyErr == nil) != tc.verifies {
				t.Fatalf("verify: %v, want verified %t", d.verifyErr, tc.verifies)
			}
			if r.IsConfirmed() != tc.verifies {
				t.Fatalf("got %s (%v)", r.Class, r.Err)
			}
		})
	}
}

// A receiver that echoes the whole request — every header, the URL's
// query, the Basic credentials the URL's user information became, the
// body — in its body, X-Request-Id and Location, in every class of answer,
// gets none of the configured secrets into a Result.
func TestProvider_RedactsAnEchoedRequest(t *testing.T) {
	t.Parallel()
	const (
		pass   = "p@ss/w0rd+secret"
		token  = "tok en/with+signs="
		header = "Bearer gw-token-987654321"
	)
	rotated := newSecret(t)
	rc := newReceiver(t, testSecret, func(w http.ResponseWriter, r *http.Request, d delivery) {
		echo := providertest.Echo(r, d.body)
		w.Header().Set("X-Request-Id", echo)
		w.Header().Set("Location", "/elsewhere?"+url.QueryEscape(echo))
		code, _ := strconv.Atoi(r.URL.Query().Get("answer"))
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"id":%q,"you_sent":%q,"raw":"%s"}`, echo, echo, strings.ReplaceAll(echo, `"`, `'`))
	})
	u, _ := url.Parse(rc.URL + "/hooks")
	u.User = url.UserPassword("partner", pass)
	secrets := []string{pass, token, header, "gw-token-987654321", testSecret, rotated,
		base64.StdEncoding.EncodeToString([]byte("partner:" + pass))}
	for _, code := range []int{200, 201, 303, 307, 400, 401, 409, 429, 500, 503} {
		q := url.Values{"token": {token}, "answer": {strconv.Itoa(code)}}
		u.RawQuery = q.Encode()
		p := newProvider(t, u.String(), func(c *webhook.Config) {
			c.Secrets = []string{rotated}
			c.Headers = map[string]string{"Authorization": header}
		})
		r := p.Call(testCtx(t), callFor(fmt.Sprintf("order-echo-%d", code), `{"order":"o_1"}`))
		text := r.Ref + " " + string(r.Detail) + " " + fmt.Sprint(r.Err)
		for _, s := range secrets {
			for _, form := range []string{s, url.QueryEscape(s), url.PathEscape(s)} {
				if strings.Contains(text, form) {
					t.Errorf("%d (%s): the result holds %q: %s", code, r.Class, form, text)
				}
			}
		}
		if !json.Valid(r.Detail) {
			t.Errorf("%d: Detail is not JSON: %s", code, r.Detail)
		}
		if !strings.Contains(text, providers.Redacted) {
			t.Errorf("%d: nothing was redacted, so nothing was echoed: %s", code, text)
		}
	}
	// The receiver did get what it echoed: the check is not vacuous.
	d := rc.deliveries()[0]
	if d.header.Get("Authorization") != header || !strings.Contains(d.path+"?"+u.RawQuery, "token=") {
		t.Fatalf("the receiver got Authorization %q", d.header.Get("Authorization"))
	}
}

func TestProvider_KeyWindow(t *testing.T) {
	t.Parallel()
	p := newProvider(t, "http://127.0.0.1:1/hooks")
	if got := providers.KeyWindow(p); got != 24*time.Hour {
		t.Fatalf("default key window %s, want 24h", got)
	}
	p = newProvider(t, "http://127.0.0.1:1/hooks", func(c *webhook.Config) { c.KeyWindow = 72 * time.Hour })
	if got := providers.KeyWindow(p); got != 72*time.Hour {
		t.Fatalf("key window %s, want 72h", got)
	}
	for _, cfg := range []*webhook.Config{
		{URL: "https://hooks.example.com", Secret: testSecret, KeyWindow: -time.Hour},
		{URL: "https://hooks.example.com", Secrets: []string{testSecret, "whsec_short"}},
		{URL: "https://hooks.example.com", Secrets: []string{""}},
		{URL: "https://hooks.example.com"},
	} {
		_, err := webhook.New(cfg)
		if !errors.Is(err, webhook.ErrConfig) {
			t.Fatalf("%v: New accepted it (%v)", cfg, err)
		}
		if strings.Contains(err.Error(), testSecret) || strings.Contains(err.Error(), "whsec_short") {
			t.Fatalf("error %q shows a secret", err)
		}
	}
	_, err := webhook.New(&webhook.Config{URL: "https://hooks.example.com", Secrets: []string{testSecret, "whsec_short"}})
	if err == nil || !strings.Contains(err.Error(), "Secrets[1]") {
		t.Fatalf("error %v does not name Secrets[1]", err)
	}
	cfg := webhook.Config{URL: "https://hooks.example.com", Secrets: []string{testSecret, newSecret(t)}}
	p2, err := webhook.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	p2.Close()
	if text := fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg); strings.Contains(text, "whsec_") || !strings.Contains(text, "Secrets:[[redacted] [redacted]]") {
		t.Fatalf("printed config: %s", text)
	}
}

// An answer longer than the read's limit whose end splits the signing
// secret: the whole copies are redacted, which shrinks the body under the
// cut at max_response_bytes, and the split copy at the end of the read
// must not come in with it.
func TestProvider_ASecretSplitByTheReadLimitIsNotKept(t *testing.T) {
	t.Parallel()
	limit := webhook.DefaultMaxResponseBytes + 4<<10 // what the provider reads
	body := strings.Repeat(testSecret, 200)
	body += strings.Repeat("x", limit-len(testSecret)/2-len(body)) + testSecret
	rc := newReceiver(t, testSecret, func(w http.ResponseWriter, _ *http.Request, _ delivery) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(body))
	})
	r := newProvider(t, rc.URL).Call(testCtx(t), callFor("order-split", `{}`))
	checkNoSecret(t, r, testSecret)
	text := string(r.Detail)
	if !strings.Contains(text, providers.Redacted) {
		t.Fatalf("no redaction in the answer kept: %.200s", text)
	}
	if i := strings.Index(text, testSecret[:12]); i >= 0 {
		t.Fatalf("the answer kept holds the start of the secret: …%s", text[max(0, i-40):min(len(text), i+40)])
	}
}
