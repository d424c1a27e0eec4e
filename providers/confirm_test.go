package providers_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/providers"
)

// The rule a webhook or http provider is configured with: each part of a
// 2xx answer it asks for is checked, and what is missing is said without
// a header's value.
func TestConfirmWhen_Check(t *testing.T) {
	t.Parallel()
	rule := providers.ConfirmWhen{Statuses: []int{200, 201}, ContentType: "application/json", Headers: []string{"x-request-id"}}
	good := http.Header{"Content-Type": {"application/json; charset=utf-8"}, "X-Request-Id": {"req_1"}}
	cases := []struct {
		name   string
		rule   providers.ConfirmWhen
		status int
		header http.Header
		miss   []string // parts of the answer that must be named; none: it confirms
	}{
		{"everything there", rule, 201, good, nil},
		{"the default confirms a proxy's page", providers.ConfirmWhen{}, 200, http.Header{"Content-Type": {"text/html"}}, nil},
		{"a status not listed", rule, 202, good, []string{"status 202 (want one of 200, 201)"}},
		{"a proxy's page", rule, 200, http.Header{"Content-Type": {"text/html"}}, []string{`content type "text/html" (want application/json)`, "no X-Request-Id header"}},
		{"no content type", rule, 200, http.Header{"X-Request-Id": {"req_1"}}, []string{`content type "" (want application/json)`}},
		{"an empty request id", rule, 200, http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"  "}}, []string{"no X-Request-Id header"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := c.rule.Check(c.status, c.header)
			if len(c.miss) == 0 {
				if got != "" {
					t.Fatalf("Check = %q, want it to confirm", got)
				}
				return
			}
			for _, m := range c.miss {
				if !strings.Contains(got, m) {
					t.Errorf("Check = %q, want it to name %q", got, m)
				}
			}
			if strings.Contains(got, "req_1") {
				t.Errorf("Check = %q names a header's value", got)
			}
		})
	}
}

// A rule that cannot be met, or names no media type or header, is refused
// at load with the field at fault.
func TestConfirmWhen_Validate(t *testing.T) {
	t.Parallel()
	var got []string
	providers.ConfirmWhen{
		Statuses:    []int{200, 404, 199},
		ContentType: "json",
		Headers:     []string{"X-Request-Id", "", "Bad Header"},
	}.Validate(func(field, problem string) { got = append(got, field+": "+problem) })
	want := []string{
		"statuses[1]: 404 is not a 2xx status",
		"statuses[2]: 199 is not a 2xx status",
		`content_type: "json" is not a media type`,
		`headers[1]: "" is not a header name`,
		`headers[2]: "Bad Header" is not a header name`,
	}
	if len(got) != len(want) {
		t.Fatalf("Validate said %d things, want %d: %q", len(got), len(want), got)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d = %q, want it to begin %q", i, got[i], want[i])
		}
	}
	providers.ConfirmWhen{Statuses: []int{200}, ContentType: "application/json", Headers: []string{"Request-Id"}}.Validate(func(field, problem string) {
		t.Errorf("a good rule refused: %s: %s", field, problem)
	})
}

// An answer not proven the peer's own is Unknown, never Confirmed, and
// says so through ErrNotProven.
func TestNotProven_IsUnknown(t *testing.T) {
	t.Parallel()
	r := providers.NotProven("webhook", 200, "no X-Request-Id header")
	if r.Class != providers.Unknown {
		t.Fatalf("class = %v, want Unknown", r.Class)
	}
	if !errors.Is(r.Err, providers.ErrNotProven) {
		t.Fatalf("error %v does not wrap ErrNotProven", r.Err)
	}
}
