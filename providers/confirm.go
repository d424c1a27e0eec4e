package providers

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// ConfirmWhen says what proves that a 2xx answer is the peer's own, and
// not an intermediary's: a TLS-intercepting egress proxy's block page, a
// maintenance page, a host a wrong base URL points at. A 2xx that lacks
// the proof is no confirmation: a provider classes it Unknown (the effect
// stays open, retried under its key inside the window, or ends uncertain),
// never Confirmed. The zero value is any 2xx, which is what the Standard
// Webhooks specification counts as a delivery.
//
// The webhook and http provider types take it as confirm_when; Stripe and
// SendGrid state their own proof in code (their packages' documentation).
type ConfirmWhen struct {
	// Statuses are the 2xx statuses that confirm. Default (empty): any
	// 2xx.
	Statuses []int `yaml:"statuses"`
	// ContentType is the media type the answer must carry
	// ("application/json"), compared without its parameters and case.
	// Default (empty): any, or none.
	ContentType string `yaml:"content_type"`
	// Headers are answer headers that must be present and not empty
	// (a request id the peer sets on every answer). Default none.
	Headers []string `yaml:"headers"`
}

// IsZero reports whether w is the default rule, any 2xx.
func (w ConfirmWhen) IsZero() bool {
	return len(w.Statuses) == 0 && w.ContentType == "" && len(w.Headers) == 0
}

// Validate calls add once per thing wrong with w, with the field at fault
// (statuses[1], content_type, headers[0]) and what is wrong with it.
func (w ConfirmWhen) Validate(add func(field, problem string)) {
	for i, s := range w.Statuses {
		if s < 200 || s > 299 {
			add(fmt.Sprintf("statuses[%d]", i), fmt.Sprintf("%d is not a 2xx status: want 200 to 299, as only a 2xx confirms", s))
		}
	}
	if w.ContentType != "" {
		if mt, params, err := mime.ParseMediaType(w.ContentType); err != nil || len(params) > 0 || !strings.Contains(mt, "/") {
			add("content_type", fmt.Sprintf("%q is not a media type: want type/subtype without parameters, such as application/json", w.ContentType))
		}
	}
	for i, h := range w.Headers {
		if h == "" || strings.IndexFunc(h, func(r rune) bool { return !isHeaderNameChar(r) }) >= 0 {
			add(fmt.Sprintf("headers[%d]", i), fmt.Sprintf("%q is not a header name", h))
		}
	}
}

func isHeaderNameChar(r rune) bool {
	return r < 0x7f && r > 0x20 && !strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
}

// Check reports why a 2xx answer with status and header does not meet w:
// "" when it does. It says what is missing, never a header's value.
func (w ConfirmWhen) Check(status int, header http.Header) string {
	var miss []string
	if len(w.Statuses) > 0 && !slices.Contains(w.Statuses, status) {
		want := make([]string, len(w.Statuses))
		for i, s := range w.Statuses {
			want[i] = strconv.Itoa(s)
		}
		miss = append(miss, fmt.Sprintf("status %d (want one of %s)", status, strings.Join(want, ", ")))
	}
	if w.ContentType != "" && !HasMediaType(header, w.ContentType) {
		miss = append(miss, fmt.Sprintf("content type %q (want %s)", mediaType(header), w.ContentType))
	}
	for _, h := range w.Headers {
		if strings.TrimSpace(header.Get(h)) == "" {
			miss = append(miss, "no "+http.CanonicalHeaderKey(h)+" header")
		}
	}
	return strings.Join(miss, ", ")
}

// HasMediaType reports whether header's Content-Type is the media type
// want, parameters (a charset) aside, case aside.
func HasMediaType(header http.Header, want string) bool {
	return strings.EqualFold(mediaType(header), want)
}

// mediaType is the media type of header's Content-Type without its
// parameters, or the raw value cut to 64 bytes when it does not parse.
func mediaType(header http.Header) string {
	v := header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(v); err == nil {
		return mt
	}
	if len(v) > 64 {
		v = v[:64]
	}
	return v
}

// NotProven is the Unknown Result of a 2xx answer that does not prove it
// is the peer's own (why says what is missing): it may be an
// intermediary's, and the request may or may not have reached the peer.
func NotProven(what string, status int, why string) Result {
	return Unsure(NotProvenError(what, status, why))
}

// NotProvenError is the error, wrapping ErrNotProven, of an answer with
// status that does not prove it is the peer's own (why says what is
// missing): NotProven's, and a lookup's or a listing's, which then says
// nothing of what the peer holds.
func NotProvenError(what string, status int, why string) error {
	return fmt.Errorf("%s: %w: status %d, %s", what, ErrNotProven, status, why)
}

// ErrNotProven is wrapped by the error of an Unknown Result whose answer
// was a 2xx without the proof that it is the peer's own (ConfirmWhen, or
// a provider's own rule): an intermediary may have answered. A lookup or
// a listing answered so fails with it too (NotProvenError): its verdict
// is NotKnown, never Absent.
var ErrNotProven = errors.New("answer not proven the provider's own")
