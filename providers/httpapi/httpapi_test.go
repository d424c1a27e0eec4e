package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/httpapi"
	"github.com/sidefx/sidefx/providers/providertest"
)

const (
	confToken = "SECRETconfTOKEN"
	confQuery = "SECRETqueryVALUE"
	confPass  = "SECRETurlPASS"
)

func TestProvider_Conformance(t *testing.T) {
	providertest.RunConformance(t, providertest.Conformance{
		New: func(t *testing.T, baseURL string) providers.Provider {
			u := strings.Replace(baseURL, "http://", "http://"+url.UserPassword("acct", confPass).String()+"@", 1) + "/v1/payments?api_key=" + confQuery
			p, err := httpapi.New(&httpapi.Config{Name: "partner", URL: u, KeyHeader: "Idempotency-Key", Timeout: 2 * time.Second,
				Headers: map[string]string{"Authorization": "Bearer " + confToken}, RefPointer: "/id", ReplayedHeader: "Idempotent-Replayed",
				// What proves the API answered (RespondJSON's marks), so
				// that an intermediary's 2xx is not confirmed.
				ConfirmWhen: providers.ConfirmWhen{Statuses: []int{200, 201}, ContentType: "application/json", Headers: []string{"X-Request-Id"}}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			return p
		},
		Kind:       "partner.payment",
		Payload:    json.RawMessage(`{"amount":1200,"currency":"eur"}`),
		BadPayload: json.RawMessage(`[1,2,3]`),
		Secrets:    []string{confToken, confQuery, confPass},
		Key:        func(r *http.Request, _ []byte) string { return r.Header.Get("Idempotency-Key") },
		Respond:    providertest.RespondJSON(201),
	})
}

func TestParseRule(t *testing.T) {
	for in, want := range map[string][4]string{
		"409":                                  {"409", "409", "", ""},
		"4xx":                                  {"400", "499", "", ""},
		"500-504":                              {"500", "504", "", ""},
		"4xx /errorCode=704":                   {"400", "499", "/errorCode", "704"},
		"422 /error/name=UNPROCESSABLE_ENTITY": {"422", "422", "/error/name", "UNPROCESSABLE_ENTITY"},
	} {
		lo, hi, p, v, err := httpapi.ParseRule(in)
		if err != nil || [4]string{strconv.Itoa(lo), strconv.Itoa(hi), p, v} != want {
			t.Errorf("ParseRule(%q) = %d %d %q %q %v, want %v", in, lo, hi, p, v, err, want)
		}
	}
	for _, bad := range []string{"", "4x", "6xx", "99", "600", "499-400", "409 errorCode=1", "409 /errorCode", "abc"} {
		if _, _, _, _, err := httpapi.ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
}

// The most specific rule decides: a body condition over a bare status, a
// narrower range over a wider; what no rule matches follows the contract.
func TestProvider_ClassifiesByTheMostSpecificRule(t *testing.T) {
	var status int
	var body string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	defer srv.Close()
	p, err := httpapi.New(&httpapi.Config{URL: srv.URL, KeyHeader: "Idempotency-Key",
		Rejected: []string{"4xx"}, Unknown: []string{"4xx /errorCode=704", "409"}, Retryable: []string{"503"}, Confirmed: []string{"202"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		status int
		body   string
		want   providers.Class
	}{
		{200, `{}`, providers.Confirmed},
		{202, `{}`, providers.Confirmed},
		{422, `{"errorCode":"704"}`, providers.Unknown},
		{422, `{"errorCode":704}`, providers.Unknown},
		{422, `{"errorCode":"705"}`, providers.Rejected},
		{409, `{}`, providers.Unknown},
		{429, `{}`, providers.Rejected}, // 4xx listed as rejected: the rule wins over the contract's 429
		{503, `{}`, providers.Retryable},
		{500, `{}`, providers.Unknown}, // no rule: the contract
		{302, `{}`, providers.Unknown},
	} {
		status, body = tc.status, tc.body
		res := p.Call(context.Background(), providers.Call{Key: "sfx1_k", Payload: json.RawMessage(`{"a":1}`), Attempt: 1})
		if res.Class != tc.want {
			t.Errorf("%d %s: %v, want %v (%s)", tc.status, tc.body, res.Class, tc.want, res.Detail)
		}
	}
}

func TestNew_RefusesWhatWouldBeAGuess(t *testing.T) {
	for want, cfg := range map[string]httpapi.Config{
		"overlap and neither is more specific": {URL: "http://x", KeyHeader: "K", Rejected: []string{"4xx"}, Unknown: []string{"400-499"}},
		"key header":                           {URL: "http://x", KeyHeader: "Bad Header"},
		"URL is required":                      {KeyHeader: "K"},
		"below 32":                             {URL: "http://x", KeyHeader: "K", KeyMaxLength: 16},
		"set by the provider":                  {URL: "http://x", KeyHeader: "K", Headers: map[string]string{"k": "v"}},
		"not both":                             {URL: "http://x", KeyHeader: "K", RefPointer: "/id", RefHeader: "X-Id"},
		"not a JSON pointer":                   {URL: "http://x", KeyHeader: "K", RefPointer: "id"},
		"confirmed":                            {URL: "http://x", KeyHeader: "K", Confirmed: []string{"2xxx"}},
		"line break":                           {URL: "http://x", KeyHeader: "K", Headers: map[string]string{"Authorization": "SECRET\r\nX: y"}},
	} {
		_, err := httpapi.New(&cfg)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("New(%+v) = %v, want an error saying %q", cfg, err, want)
		}
	}
}

// A key longer than the API takes is sent as a digest of itself: the same
// on every attempt, within the limit.
func TestProvider_KeyMaxLength(t *testing.T) {
	p, err := httpapi.New(&httpapi.Config{URL: "http://x", KeyHeader: "Idempotency-Key", KeyMaxLength: 64})
	if err != nil {
		t.Fatal(err)
	}
	long := "sfx1_" + strings.Repeat("ab", 32)
	got := p.HeaderKey(long)
	if len(got) != 64 || got != p.HeaderKey(long) || got == p.HeaderKey(long+"x") || p.HeaderKey("short") != "short" {
		t.Errorf("HeaderKey(%q) = %q", long, got)
	}
}

func TestPointer(t *testing.T) {
	body := []byte(`{"id":"PAY-1","a/b":{"~c":[10,true,"x"]},"n":1.5}`)
	for ptr, want := range map[string]string{"/id": "PAY-1", "/a~1b/~0c/0": "10", "/a~1b/~0c/1": "true", "/a~1b/~0c/2": "x", "/n": "1.5"} {
		if got, ok := httpapi.Pointer(body, ptr); !ok || got != want {
			t.Errorf("Pointer(%s) = %q %t, want %q", ptr, got, ok, want)
		}
	}
	for _, ptr := range []string{"/missing", "/a~1b", "/a~1b/~0c/3", "/a~1b/~0c/01", "/id/x", ""} {
		if got, ok := httpapi.Pointer(body, ptr); ok {
			t.Errorf("Pointer(%s) = %q, want none", ptr, got)
		}
	}
}

// An answer longer than the read's limit whose end splits a secret (a
// header value echoed): the whole copies are redacted, which shrinks the
// body under the cut at max_response_bytes, and the split copy at the end
// of the read must not come in with it.
func TestProvider_ASecretSplitByTheReadLimitIsNotKept(t *testing.T) {
	t.Parallel()
	token := "tok_live_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789ABCD" // 48 characters
	limit := httpapi.DefaultMaxResponseBytes + 4<<10             // what the provider reads
	body := strings.Repeat(token, 200)
	body += strings.Repeat("x", limit-len(token)/2-len(body)) + token
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(body))
	}))
	defer srv.Close()
	p, err := httpapi.New(&httpapi.Config{URL: srv.URL, KeyHeader: "Idempotency-Key", Headers: map[string]string{"X-Api-Key": token}})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Call(context.Background(), providers.Call{Key: "k-split", Payload: []byte(`{}`)})
	text := string(r.Detail)
	if r.Err != nil {
		text += " " + r.Err.Error()
	}
	if !strings.Contains(text, providers.Redacted) {
		t.Fatalf("no redaction in the answer kept: %.200s", text)
	}
	if strings.Contains(text, token[:12]) {
		t.Fatalf("the answer kept holds the start of the secret: …%s", text[max(0, strings.Index(text, token[:12])-40):min(len(text), strings.Index(text, token[:12])+40)])
	}
}
