package httpapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/ptype"
)

// TypeName is the value of the type field of an http provider in the
// daemon's configuration.
const TypeName = "http"

// Settings are an http provider's own fields in the daemon's configuration
// (type: http): any HTTP API that takes an idempotency key in a header.
type Settings struct {
	// URL is the API's endpoint, http or https. Required. Its user
	// information and query values are secrets: it is never printed whole.
	URL string `yaml:"url"`

	// Method is the request's method. Default POST.
	Method string `yaml:"method"`

	// KeyHeader is the request header that carries the effect's derived
	// idempotency key: Idempotency-Key, PayPal-Request-Id,
	// I-Twilio-Idempotency-Token… Required.
	KeyHeader string `yaml:"key_header"`

	// KeyMaxLength is the longest key the API takes, at least 32: a longer
	// derived key (69 characters) is sent as that many hexadecimal digits
	// of its SHA-256, the same on every attempt. Adyen takes 64. Default 0:
	// the key as it is.
	KeyMaxLength int `yaml:"key_max_length"`

	// Headers are static request headers sent with every request. Default
	// none. Their values are treated as secrets: never printed, and
	// redacted from whatever the API echoes back.
	Headers map[string]string `yaml:"headers"`

	// HeadersEnv are request headers whose values the daemon reads from
	// the environment at start: header name → the name of the environment
	// variable holding its value (an Authorization token, say). Default
	// none. A header may not be in both headers and headers_env. Their
	// values are secrets, as Headers' are.
	HeadersEnv map[string]string `yaml:"headers_env"`

	// KeyWindow is how long the API keeps an idempotency key: sidefx never
	// sends a possibly-performed effect again after it. Positive. Default
	// 24h.
	KeyWindow ptype.Duration `yaml:"key_window"`

	// Statuses are rules that classify the API's answers, beyond the
	// provider contract's defaults.
	Statuses StatusRules `yaml:"statuses"`

	// Reference says where a confirmed answer holds the API's reference
	// for what it made. Default: none, and the effect is confirmed with
	// its key as the reference.
	Reference ReferenceSettings `yaml:"reference"`

	// ReplayedHeader is a response header whose value "true" says the API
	// answered from its record of an earlier request under the key, such
	// as Idempotent-Replayed. Default none.
	ReplayedHeader string `yaml:"replayed_header"`

	// ConfirmWhen is what proves a 2xx answer is the API's own, not an
	// intermediary's (a proxy's block page, a maintenance page, another
	// host): statuses (a list of 2xx statuses), content_type (a media
	// type, such as application/json) and headers (names of headers that
	// must be present, such as the API's request id). A 2xx without the
	// proof is unknown: retried with the key inside key_window, then
	// uncertain, never confirmed. Default: any 2xx.
	ConfirmWhen providers.ConfirmWhen `yaml:"confirm_when"`
}

// StatusRules classify an http provider's answers. Each rule is a status
// ("409"), a class of statuses ("4xx") or a range ("500-504"), optionally
// followed by a JSON pointer condition on the answer's body
// ("4xx /errorCode=704"). An answer takes the class of the most specific
// rule that matches it (a body condition before none, then the narrowest
// range); one no rule matches takes the contract's class: 2xx confirmed;
// 408, 425, 429 retryable; 409 unknown; other 4xx rejected; 5xx unknown.
type StatusRules struct {
	// Confirmed: the API performed the request, or replayed its answer.
	// Default none beyond 2xx.
	Confirmed []string `yaml:"confirmed"`
	// Rejected: definitely not performed, and retrying will not help.
	// Default none beyond the contract's.
	Rejected []string `yaml:"rejected"`
	// Retryable: definitely not performed, worth asking again later.
	// Default none beyond 408, 425 and 429.
	Retryable []string `yaml:"retryable"`
	// Unknown: may have been performed (another request under the key in
	// flight, a failure after the work began): retried with the same key
	// inside the key window. Default none beyond 409 and 5xx.
	Unknown []string `yaml:"unknown"`
	// ForKey: the refusals the API makes behind its idempotency layer,
	// stored under the key and replayed (a declined payment, for one): a
	// rejected answer matching one of these speaks for every attempt under
	// the key. Default none: a refusal speaks for its own attempt, and an
	// effect an earlier attempt may have performed ends uncertain, never
	// failed.
	ForKey []string `yaml:"for_key"`
}

// ReferenceSettings say where an http provider's confirmed answer holds
// the API's reference. At most one of their fields.
type ReferenceSettings struct {
	// JSONPointer is an RFC 6901 pointer into the answer's JSON body, such
	// as /id. Default "".
	JSONPointer string `yaml:"json_pointer"`
	// Header is a response header that holds it. Default "".
	Header string `yaml:"header"`
}

// String prints the settings with the URL's credentials and query and the
// headers' values hidden.
func (s Settings) String() string {
	type plain Settings
	q := plain(s)
	if q.URL != "" {
		q.URL = providers.RedactURL(q.URL)
	}
	if s.Headers != nil {
		q.Headers = make(map[string]string, len(s.Headers))
		for name := range s.Headers {
			q.Headers[name] = providers.Redacted
		}
	}
	return fmt.Sprintf("%+v", q)
}

// Type is the provider type "http": a Provider per configured API.
var Type = ptype.New(ptype.Spec[Settings]{
	Name:    TypeName,
	Timeout: DefaultTimeout,
	Keys:    ptype.WithKeys,
	Defaults: func(s *Settings) {
		if s.KeyWindow == 0 {
			s.KeyWindow = ptype.Duration(DefaultKeyWindow)
		}
		if s.Method == "" {
			s.Method = DefaultMethod
		}
	},
	Check: checkSettings,
	Build: buildProvider,
	KeyWindow: func(s *Settings) (time.Duration, string) {
		return time.Duration(s.KeyWindow), fmt.Sprintf("the API's %s key window (key_window)", s.KeyWindow)
	},
	// The API takes any payload the provider can send: nothing to check.
	CheckPayload: func(*Settings, ptype.Kind, json.RawMessage) error { return nil },
})

func checkSettings(s *Settings, p *ptype.Problems) {
	p.URL("url", s.URL, TypeName)
	if !ptype.IsToken(s.Method) {
		p.Add("method", "%q is not an HTTP method", s.Method)
	}
	switch {
	case s.KeyHeader == "":
		p.Add("key_header", "required for http providers: the request header that carries the idempotency key (Idempotency-Key, PayPal-Request-Id…)")
	case !ptype.IsToken(s.KeyHeader):
		p.Add("key_header", "%q is not a header name", s.KeyHeader)
	}
	if s.KeyMaxLength != 0 && s.KeyMaxLength < 32 {
		p.Add("key_max_length", "%d: want at least 32, or 0 for no limit (a key that short could collide)", s.KeyMaxLength)
	}
	p.Headers(s.Headers, s.HeadersEnv)
	for _, h := range slices.Concat(slices.Collect(maps.Keys(s.Headers)), slices.Collect(maps.Keys(s.HeadersEnv))) {
		if strings.EqualFold(h, s.KeyHeader) || strings.EqualFold(h, "Content-Type") {
			p.Add("headers", "%s is set by the provider", h)
		}
	}
	if s.KeyWindow <= 0 {
		p.Add("key_window", "%s: want a positive duration, how long the API keeps an idempotency key (default %s)", s.KeyWindow, ptype.Duration(DefaultKeyWindow))
	}
	for _, l := range []struct {
		name  string
		rules []string
	}{{"confirmed", s.Statuses.Confirmed}, {"rejected", s.Statuses.Rejected}, {"retryable", s.Statuses.Retryable}, {"unknown", s.Statuses.Unknown}, {"for_key", s.Statuses.ForKey}} {
		for i, r := range l.rules {
			if _, _, _, _, err := ParseRule(r); err != nil {
				p.Add(fmt.Sprintf("statuses.%s[%d]", l.name, i), "%v", err)
			}
		}
	}
	ref := s.Reference
	switch {
	case ref.JSONPointer != "" && ref.Header != "":
		p.Add("reference", "json_pointer or header, not both")
	case ref.JSONPointer != "" && !strings.HasPrefix(ref.JSONPointer, "/"):
		p.Add("reference.json_pointer", "%q is not a JSON pointer (want e.g. /id)", ref.JSONPointer)
	case ref.Header != "" && !ptype.IsToken(ref.Header):
		p.Add("reference.header", "%q is not a header name", ref.Header)
	}
	s.ConfirmWhen.Validate(func(field, problem string) { p.Add("confirm_when."+field, "%s", problem) })
	if s.ReplayedHeader != "" && !ptype.IsToken(s.ReplayedHeader) {
		p.Add("replayed_header", "%q is not a header name", s.ReplayedHeader)
	}
}

// newFrom builds the provider the settings describe, with headers (the
// values of headers_env) added to the static ones.
func newFrom(s *Settings, name string, timeout time.Duration, headers map[string]string) (*Provider, error) {
	all := maps.Clone(s.Headers)
	if len(headers) > 0 && all == nil {
		all = map[string]string{}
	}
	maps.Copy(all, headers)
	return New(&Config{Name: name, Method: s.Method, URL: s.URL, KeyHeader: s.KeyHeader, KeyMaxLength: s.KeyMaxLength,
		Headers: all, Timeout: timeout, KeyWindow: time.Duration(s.KeyWindow),
		Confirmed: s.Statuses.Confirmed, Rejected: s.Statuses.Rejected, Retryable: s.Statuses.Retryable, Unknown: s.Statuses.Unknown, ForKey: s.Statuses.ForKey,
		RefPointer: s.Reference.JSONPointer, RefHeader: s.Reference.Header, ReplayedHeader: s.ReplayedHeader,
		ConfirmWhen: s.ConfirmWhen})
}

func buildProvider(s *Settings, b *ptype.Build) (providers.Provider, error) {
	var headers map[string]string
	for _, h := range slices.Sorted(maps.Keys(s.HeadersEnv)) {
		if headers == nil {
			headers = map[string]string{}
		}
		if b.DryRun {
			headers[h] = "stand-in"
			continue
		}
		field := "headers_env[" + strconv.Quote(h) + "]"
		v := b.Secret(field, s.HeadersEnv[h])
		if v == "" {
			continue
		}
		headers[h] = v
		// Each value is tried on its own, without the other headers, so
		// that a refusal names its field.
		alone := *s
		alone.Headers, alone.HeadersEnv = nil, nil
		if p, err := newFrom(&alone, b.Name, b.Timeout, map[string]string{h: v}); err != nil {
			b.Unusable(field, s.HeadersEnv[h], err)
		} else {
			p.Close()
		}
	}
	if b.Failed() {
		return nil, nil
	}
	p, err := newFrom(s, b.Name, b.Timeout, headers)
	if err != nil {
		// The settings passed their dry run and each value its own try:
		// what is refused now is a header value.
		if !b.DryRun {
			b.Add("headers_env", "a header value is not usable: %s", b.Redact(err.Error()))
		}
		return nil, err
	}
	return p, nil
}
