package providers_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers"
)

func TestRedactor_FindsEveryForm(t *testing.T) {
	t.Parallel()
	const secret = `tok/en+a=b&c<d>"e"\f`
	r := providers.NewRedactor(secret)
	html, _ := json.Marshal(secret)
	forms := map[string]string{
		"as is":              secret,
		"query-escaped":      url.QueryEscape(secret),
		"path-escaped":       url.PathEscape(secret),
		"JSON, HTML-escaped": string(html[1 : len(html)-1]),
		"JSON":               `tok/en+a=b&c<d>\"e\"\\f`,
		"JSON, PHP slashes":  `tok\/en+a=b&c<d>\"e\"\\f`,
	}
	for name, form := range forms {
		text := "before " + form + " after " + form
		got := r.String(text)
		if got != "before [redacted] after [redacted]" {
			t.Errorf("%s: %q became %q", name, text, got)
		}
		if !r.Contains(text) {
			t.Errorf("%s: Contains is false", name)
		}
		if b := r.Bytes([]byte(text)); string(b) != got {
			t.Errorf("%s: Bytes gave %q", name, b)
		}
	}
	if got := r.String("nothing here"); got != "nothing here" || r.Contains("nothing here") {
		t.Errorf("a text without the secret became %q", got)
	}
}

func TestRedactor_LongestFormFirst(t *testing.T) {
	t.Parallel()
	// The password is inside "user:password": the longer one is replaced
	// whole, not left as "user:[redacted]" next to a Basic value.
	r := providers.NewRedactor("password-123", "partner:password-123")
	if got := r.String("x partner:password-123 y"); got != "x [redacted] y" {
		t.Fatalf("got %q", got)
	}
}

func TestRedactor_IgnoresShortValues(t *testing.T) {
	t.Parallel()
	r := providers.NewRedactor("1", "t1", "acme", "", "longer-secret")
	if got := r.String("status 401 for tenant t1 at acme: longer-secret"); got != "status 401 for tenant t1 at acme: [redacted]" {
		t.Fatalf("got %q", got)
	}
}

func TestRedactor_NilRedactsNothing(t *testing.T) {
	t.Parallel()
	var r *providers.Redactor
	res := providers.Reject(errors.New("secret-value"), json.RawMessage(`{"a":"secret-value"}`))
	if got := r.Result(res); got.Err != res.Err || string(got.Detail) != string(res.Detail) || r.String("x") != "x" || r.Contains("x") {
		t.Fatalf("a nil Redactor changed %+v into %+v", res, got)
	}
}

// Detail goes to a jsonb column: redacting it must leave valid JSON,
// whichever part of it held the secret.
func TestRedactor_JSONStaysValid(t *testing.T) {
	t.Parallel()
	r := providers.NewRedactor("s3cr3t-value", "123456789")
	cases := map[string]string{
		`{"message":"bad key s3cr3t-value"}`:           `{"message":"bad key [redacted]"}`,
		`{"s3cr3t-value":1}`:                           `{"[redacted]":1}`,
		`{"n":1234567890}`:                             `{"n":"[redacted]0"}`,
		`["a","\u0073\u0033cr3t-value"]`:               `["a","[redacted]"]`, // hidden behind escapes
		`{"nested":{"list":[{"k":"x s3cr3t-value"}]}}`: `{"nested":{"list":[{"k":"x [redacted]"}]}}`,
		`{"status":401}`:                               `{"status":401}`,   // untouched
		`{"s":"a\u003cb"}`:                             `{"s":"a\u003cb"}`, // an escape, no secret: kept as is
	}
	for in, want := range cases {
		got := r.JSON(json.RawMessage(in))
		if string(got) != want {
			t.Errorf("JSON(%s) = %s, want %s", in, got, want)
		}
		if !json.Valid(got) {
			t.Errorf("JSON(%s) = %s is not valid JSON", in, got)
		}
	}
	// Not JSON at all: kept as a JSON string of the redacted text.
	if got := r.JSON(json.RawMessage(`oops s3cr3t-value {`)); string(got) != `"oops [redacted] {"` {
		t.Errorf("invalid JSON became %s", got)
	}
	if got := r.JSON(nil); got != nil {
		t.Errorf("nil became %s", got)
	}
}

func TestRedactor_ErrorKeepsIs(t *testing.T) {
	t.Parallel()
	sentinel := errors.New("sentinel")
	r := providers.NewRedactor("s3cr3t-value")
	err := fmt.Errorf("call with s3cr3t-value: %w", sentinel)
	got := r.Error(err)
	if got.Error() != "call with [redacted]: sentinel" || !errors.Is(got, sentinel) {
		t.Fatalf("Error: %q, Is %t", got, errors.Is(got, sentinel))
	}
	if errors.Unwrap(got) != nil {
		t.Fatal("the redacted error unwraps to the original, whose text holds the secret")
	}
	clean := fmt.Errorf("no secret: %w", sentinel)
	if r.Error(clean) != clean || r.Error(nil) != nil {
		t.Fatal("an error without the secret was replaced")
	}
}

func TestRedactor_Result(t *testing.T) {
	t.Parallel()
	r := providers.NewRedactor("s3cr3t-value")
	res := providers.Unsure(context.DeadlineExceeded)
	res.Ref = "ref-s3cr3t-value"
	res.Detail = json.RawMessage(`{"echo":"s3cr3t-value"}`)
	res.Err = fmt.Errorf("echoed s3cr3t-value: %w", context.DeadlineExceeded)
	res.RetryAfter = time.Second
	got := r.Result(res)
	if got.Ref != "ref-[redacted]" || string(got.Detail) != `{"echo":"[redacted]"}` || got.Err.Error() != "echoed [redacted]: context deadline exceeded" ||
		!errors.Is(got.Err, context.DeadlineExceeded) || got.Class != providers.Unknown || got.RetryAfter != time.Second {
		t.Fatalf("got %+v", got)
	}
}

func TestURLSecrets(t *testing.T) {
	t.Parallel()
	got := providers.URLSecrets("https://partner:pa%2Fss%40x@hooks.example/x/y?token=a%2Bb&tenant=acme;sig=q+r")
	for _, want := range []string{"partner", "pa/ss@x", "partner:pa/ss@x", base64.StdEncoding.EncodeToString([]byte("partner:pa/ss@x")),
		"partner:pa%2Fss%40x", "pa%2Fss%40x", "a%2Bb", "a+b", "acme", "q+r", "q r"} {
		if !slices.Contains(got, want) {
			t.Errorf("URLSecrets lacks %q: %q", want, got)
		}
	}
	for _, never := range []string{"hooks.example", "/x/y", "https"} {
		if slices.Contains(got, never) {
			t.Errorf("URLSecrets holds %q, which is no secret", never)
		}
	}
	if got := providers.URLSecrets("https://[::1/x"); len(got) != 1 || got[0] != "https://[::1/x" {
		t.Errorf("an unparsable URL: %q", got)
	}
	// What an HTTP client sends for the URL's user information is found.
	r := providers.NewRedactor(providers.URLSecrets("https://partner:pa%2Fss@hooks.example/")...)
	if got := r.String("Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("partner:pa/ss"))); got != "Authorization: Basic [redacted]" {
		t.Errorf("Basic credentials: %q", got)
	}
}

func TestHeaderSecrets(t *testing.T) {
	t.Parallel()
	basic := base64.StdEncoding.EncodeToString([]byte("user:hunter2-secret"))
	for value, want := range map[string][]string{
		"Bearer abc.def-123":  {"Bearer abc.def-123", "abc.def-123"},
		"plain-token-value":   {"plain-token-value"},
		"Basic " + basic:      {"Basic " + basic, basic, "user:hunter2-secret", "hunter2-secret"},
		"Basic not-base64!!!": {"Basic not-base64!!!", "not-base64!!!"},
	} {
		if got := providers.HeaderSecrets(value); !slices.Equal(got, want) {
			t.Errorf("HeaderSecrets(%q) = %q, want %q", value, got, want)
		}
	}
	r := providers.NewRedactor(providers.HeaderSecrets("Bearer abc.def-123")...)
	if got := r.String(`{"error":"invalid token abc.def-123"}`); !strings.Contains(got, "invalid token [redacted]") {
		t.Errorf("the bare token was not found: %s", got)
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://u:p@hooks.example/x/y?token=t#frag": "https://hooks.example/x/y?[redacted]",
		"http://hooks.example:8080/a%20b":            "http://hooks.example:8080/a%20b",
		"not a url":                                  "(invalid URL)",
		"https://[::1/x":                             "(invalid URL)",
	} {
		if got := providers.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A read cut at its limit may end with the start of a secret: TrimPartial
// drops the longest such ending, in any form, and nothing else.
func TestRedactor_TrimPartial(t *testing.T) {
	t.Parallel()
	secret := "tok_live_AbCdEfGhIjKlMnOpQrStUvWx"
	r := providers.NewRedactor(secret)
	for _, tc := range []struct{ in, want string }{
		{"answer " + secret[:20], "answer "},
		{"answer " + secret[:1], "answer "},
		{"answer " + secret, "answer " + secret}, // whole: Bytes redacts it
		{"answer tok_", "answer "},
		{"answer x", "answer x"},
		{"", ""},
	} {
		if got := string(r.TrimPartial([]byte(tc.in))); got != tc.want {
			t.Errorf("TrimPartial(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := string((*providers.Redactor)(nil).TrimPartial([]byte("a tok"))); got != "a tok" {
		t.Errorf("a nil Redactor trimmed: %q", got)
	}
}
