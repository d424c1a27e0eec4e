// Package httpapi is a provider for any HTTP API that takes an idempotency
// key in a request header: PayPal's PayPal-Request-Id, Adyen's and many
// others' Idempotency-Key, a Twilio-style I-Twilio-Idempotency-Token. It
// sends the effect's payload as the JSON body, the derived key in the
// configured header, and classifies the answer by its status with rules the
// configuration may extend.
//
// # Classification
//
// A Rule matches statuses, and optionally a value in the answer's JSON
// body:
//
//	"2xx"                      every status from 200 to 299
//	"409"                      one status
//	"400-499"                  a range
//	"4xx /errorCode=704"       a status of 4xx whose body's /errorCode (an
//	                           RFC 6901 JSON pointer) is 704 ("704" or 704)
//
// An answer takes the class of the most specific rule that matches it: a
// rule with a body condition before one without, then the narrowest range.
// Two rules of different classes that are equally specific and overlap are
// refused by New. An answer no rule matches takes the provider contract's
// class (providers.ClassifyStatus): 2xx confirmed; 408, 425 and 429
// retryable; 409 unknown (another request under the key in flight); other
// 4xx rejected; 5xx and anything else unknown. A retryable answer's
// Retry-After is honoured.
//
// # Which answers speak for the key
//
// A refusal speaks for its own attempt only (providers.ForAttempt) unless
// it matches one of the ForKey rules — the refusals the API stores under
// the key and replays, such as a payment declined by the endpoint — or the
// ReplayedHeader says "true". Only an answer for the key clears the
// evidence that an earlier attempt, whose answer was lost, was performed:
// an authentication or validation refusal after a lost answer leaves the
// effect uncertain, never failed. Name in ForKey only what the vendor's
// documentation says it stores under the key.
//
// # Reference
//
// A confirmed answer's reference is read from RefPointer, a JSON pointer
// into the body ("/id"), or from RefHeader; without either, or when the
// answer lacks it, the effect is confirmed with the derived key as its
// reference. ReplayedHeader names a header that says "true" when the API
// answered from its record of an earlier request under the key.
//
// # Secrets
//
// Every header value (static or from the environment) and the URL's user
// information and query values are secrets: never in a Result, a log or an
// error, and redacted from whatever the API echoes back. The stored answer
// (Detail) holds the status, the reference, and the body, redacted and cut
// at MaxResponseBytes.
package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sidefx/sidefx/providers"
)

// Defaults of Config.
const (
	DefaultMethod           = http.MethodPost
	DefaultTimeout          = 30 * time.Second
	DefaultKeyWindow        = 24 * time.Hour
	DefaultMaxResponseBytes = 64 << 10
	DefaultName             = "http"
)

// UserAgent is sent with every request.
const UserAgent = "sidefx-http/1"

// Config configures a Provider.
type Config struct {
	// Name identifies the provider in logs and metrics. Default "http".
	Name string
	// Method is the request's method. Default POST.
	Method string
	// URL is the endpoint, http or https. Required. Its user information
	// and query values are secrets.
	URL string
	// KeyHeader is the header that carries the derived key
	// (Idempotency-Key, PayPal-Request-Id…). Required.
	KeyHeader string
	// KeyMaxLength, if positive, is the longest key the API takes (Adyen:
	// 64). A derived key longer than that is sent as the first
	// KeyMaxLength hexadecimal digits of its SHA-256, at least 32: the
	// same on every attempt, and as unique. Default 0: the key as is.
	KeyMaxLength int
	// Headers are sent with every request (an Authorization token…); each
	// value is a secret.
	Headers map[string]string
	// Timeout bounds one request. Default 30s.
	Timeout time.Duration
	// KeyWindow is how long the API keeps a key. Default 24h.
	KeyWindow time.Duration
	// Confirmed, Rejected, Retryable and Unknown are the rules that
	// classify answers (see the package documentation); an answer no
	// rule matches takes the contract's class.
	Confirmed, Rejected, Retryable, Unknown []string
	// ForKey are rules (the same syntax) for the refusals the API makes
	// behind its idempotency layer, stored under the key and replayed:
	// a rejected answer that matches one speaks for every attempt under
	// the key. Default none: a refusal speaks for its own attempt only,
	// and an effect whose earlier attempt may have been performed then
	// ends uncertain, never failed.
	ForKey []string
	// RefPointer is a JSON pointer to the reference in a confirmed
	// answer's body ("/id"). RefHeader is a header that holds it. At
	// most one.
	RefPointer, RefHeader string
	// ReplayedHeader is a header whose value "true" says the answer is a
	// replay of an earlier request's under the key (Idempotent-Replayed).
	ReplayedHeader string
	// ConfirmWhen is what proves a 2xx answer is the API's own and not an
	// intermediary's (a proxy's block page, a maintenance page, another
	// host): a 2xx classed confirmed without it is unknown instead,
	// retried with the key inside the window, then uncertain. Default
	// (the zero value): any 2xx.
	ConfirmWhen providers.ConfirmWhen
	// MaxResponseBytes bounds the answer read and stored. Default 64 KiB.
	MaxResponseBytes int64
	// HTTPClient sends the requests. Default a client of the Provider's
	// own. Redirects are never followed.
	HTTPClient *http.Client
}

// Provider is the http provider. It is idempotent within its key window.
type Provider struct {
	name, method, url, shown string
	keyHeader                string
	keyMax                   int
	headers                  http.Header
	timeout, window          time.Duration
	rules                    []rule
	forKey                   []rule
	refPointer, refHeader    string
	replayedHeader           string
	maxBody                  int64
	confirmWhen              providers.ConfirmWhen
	hc                       *http.Client
	own                      *http.Transport
	redact                   *providers.Redactor
}

// rule is one classification rule.
type rule struct {
	class    providers.Class
	lo, hi   int    // statuses
	pointer  string // a JSON pointer, or ""
	value    string // what it must hold
	text     string // as written
	fromList string // confirmed, rejected…
}

func (r rule) matches(code int, body []byte) bool {
	if code < r.lo || code > r.hi {
		return false
	}
	if r.pointer == "" {
		return true
	}
	v, ok := Pointer(body, r.pointer)
	return ok && v == r.value
}

// moreSpecific reports whether r is preferred over o for an answer both
// match.
func (r rule) moreSpecific(o rule) bool {
	if (r.pointer != "") != (o.pointer != "") {
		return r.pointer != ""
	}
	return r.hi-r.lo < o.hi-o.lo
}

// ParseRule reads one rule: a status ("409"), a class of statuses ("4xx"),
// a range ("400-499"), optionally followed by a space and a JSON pointer
// condition ("/errorCode=704").
func ParseRule(s string) (lo, hi int, pointer, value string, err error) {
	codes, cond, _ := strings.Cut(strings.TrimSpace(s), " ")
	cond = strings.TrimSpace(cond)
	switch {
	case len(codes) == 3 && strings.HasSuffix(codes, "xx") && codes[0] >= '1' && codes[0] <= '5':
		lo = int(codes[0]-'0') * 100
		hi = lo + 99
	case strings.Contains(codes, "-"):
		a, b, _ := strings.Cut(codes, "-")
		lo, err = status(a)
		if err == nil {
			hi, err = status(b)
		}
		if err == nil && hi < lo {
			err = fmt.Errorf("%q: the range ends before it starts", s)
		}
	default:
		lo, err = status(codes)
		hi = lo
	}
	if err != nil {
		return 0, 0, "", "", fmt.Errorf("%q: want a status (409), a class (4xx) or a range (400-499), then optionally a JSON pointer condition (/errorCode=704)", s)
	}
	if cond != "" {
		p, v, ok := strings.Cut(cond, "=")
		if !ok || !strings.HasPrefix(p, "/") {
			return 0, 0, "", "", fmt.Errorf("%q: the condition %q is not /json/pointer=value", s, cond)
		}
		pointer, value = p, v
	}
	return lo, hi, pointer, value, nil
}

func status(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 100 || n > 599 {
		return 0, errors.New("not a status")
	}
	return n, nil
}

// New returns a Provider for cfg, or an error naming what is wrong (never
// a header value, or the URL's secrets).
func New(cfg *Config) (*Provider, error) {
	if cfg == nil {
		return nil, errors.New("httpapi: no config")
	}
	c := *cfg
	p := &Provider{name: c.Name, method: c.Method, keyHeader: http.CanonicalHeaderKey(strings.TrimSpace(c.KeyHeader)), keyMax: c.KeyMaxLength,
		timeout: c.Timeout, window: c.KeyWindow, refPointer: c.RefPointer, refHeader: c.RefHeader, replayedHeader: c.ReplayedHeader, maxBody: c.MaxResponseBytes,
		confirmWhen: c.ConfirmWhen}
	if p.name == "" {
		p.name = DefaultName
	}
	if p.method == "" {
		p.method = DefaultMethod
	}
	if p.timeout == 0 {
		p.timeout = DefaultTimeout
	}
	if p.window == 0 {
		p.window = DefaultKeyWindow
	}
	if p.maxBody == 0 {
		p.maxBody = DefaultMaxResponseBytes
	}
	u, err := url.Parse(c.URL)
	switch {
	case c.URL == "":
		return nil, errors.New("httpapi: URL is required")
	case err != nil:
		return nil, errors.New("httpapi: URL is not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("httpapi: URL scheme %q is not http or https", u.Scheme)
	case u.Host == "":
		return nil, errors.New("httpapi: URL has no host")
	}
	p.url, p.shown = c.URL, providers.RedactURL(c.URL)
	if !validToken(p.method) {
		return nil, fmt.Errorf("httpapi: method %q is not an HTTP method", p.method)
	}
	if p.keyHeader == "" || !validToken(p.keyHeader) {
		return nil, fmt.Errorf("httpapi: key header %q is not a header name", c.KeyHeader)
	}
	if p.keyMax != 0 && p.keyMax < 32 {
		return nil, fmt.Errorf("httpapi: key max length %d is below 32: a key that short could collide", p.keyMax)
	}
	if p.timeout < 0 || p.window < 0 || p.maxBody < 0 {
		return nil, errors.New("httpapi: timeout, key window and response bound must not be negative")
	}
	if p.refPointer != "" && p.refHeader != "" {
		return nil, errors.New("httpapi: give the reference's JSON pointer or its header, not both")
	}
	if p.refPointer != "" && !strings.HasPrefix(p.refPointer, "/") {
		return nil, fmt.Errorf("httpapi: reference pointer %q is not a JSON pointer (want e.g. /id)", p.refPointer)
	}
	var bad []string
	c.ConfirmWhen.Validate(func(field, problem string) { bad = append(bad, "confirm when "+field+": "+problem) })
	if len(bad) > 0 {
		return nil, errors.New("httpapi: " + strings.Join(bad, "; "))
	}
	secrets := providers.URLSecrets(c.URL)
	p.headers = http.Header{}
	for name, v := range c.Headers {
		if !validToken(name) {
			return nil, fmt.Errorf("httpapi: header %q is not a header name", name)
		}
		if strings.EqualFold(name, p.keyHeader) || strings.EqualFold(name, "Content-Type") {
			return nil, fmt.Errorf("httpapi: header %s is set by the provider", http.CanonicalHeaderKey(name))
		}
		if strings.ContainsAny(v, "\r\n") {
			return nil, fmt.Errorf("httpapi: the value of header %s holds a line break", http.CanonicalHeaderKey(name))
		}
		p.headers.Set(name, v)
		secrets = append(secrets, providers.HeaderSecrets(v)...)
	}
	p.redact = providers.NewRedactor(secrets...)
	for _, l := range []struct {
		name  string
		class providers.Class
		rules []string
	}{{"confirmed", providers.Confirmed, c.Confirmed}, {"rejected", providers.Rejected, c.Rejected},
		{"retryable", providers.Retryable, c.Retryable}, {"unknown", providers.Unknown, c.Unknown}} {
		for _, s := range l.rules {
			lo, hi, ptr, val, err := ParseRule(s)
			if err != nil {
				return nil, fmt.Errorf("httpapi: %s: %w", l.name, err)
			}
			r := rule{class: l.class, lo: lo, hi: hi, pointer: ptr, value: val, text: s, fromList: l.name}
			for _, o := range p.rules {
				overlap := o.lo <= r.hi && r.lo <= o.hi
				sameCondition := r.pointer == o.pointer && r.value == o.value
				if o.class != r.class && overlap && sameCondition && !r.moreSpecific(o) && !o.moreSpecific(r) {
					return nil, fmt.Errorf("httpapi: %s %q and %s %q overlap and neither is more specific: which class an answer takes would be a guess", o.fromList, o.text, l.name, s)
				}
			}
			p.rules = append(p.rules, r)
		}
	}
	for _, s := range c.ForKey {
		lo, hi, ptr, val, err := ParseRule(s)
		if err != nil {
			return nil, fmt.Errorf("httpapi: for_key: %w", err)
		}
		p.forKey = append(p.forKey, rule{class: providers.Rejected, lo: lo, hi: hi, pointer: ptr, value: val, text: s, fromList: "for_key"})
	}
	if c.HTTPClient != nil {
		hc := *c.HTTPClient
		p.hc = &hc
	} else {
		p.own = http.DefaultTransport.(*http.Transport).Clone()
		p.hc = &http.Client{Transport: p.own}
	}
	p.hc.Transport = providers.Traced(providers.OneRequest(p.hc.Transport))
	p.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return p, nil
}

// validToken reports whether s is an HTTP token (a method or header name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return true
}

// Name returns the provider's name.
func (p *Provider) Name() string { return p.name }

// Idempotent is true: the key travels in KeyHeader.
func (p *Provider) Idempotent() bool { return true }

// KeyWindow returns how long the API keeps a key.
func (p *Provider) KeyWindow() time.Duration { return p.window }

// Close closes the idle connections of the provider's own transport.
func (p *Provider) Close() {
	if p.own != nil {
		p.own.CloseIdleConnections()
	}
}

// String names the provider and its endpoint without secrets.
func (p *Provider) String() string {
	return fmt.Sprintf("httpapi.Provider{%s %s %s}", p.name, p.method, p.shown)
}

// HeaderKey returns what the provider sends in its key header for key.
func (p *Provider) HeaderKey(key string) string {
	if p.keyMax == 0 || len(key) <= p.keyMax {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])[:min(p.keyMax, 64)]
}

// Call sends the effect once and classifies the answer.
func (p *Provider) Call(ctx context.Context, c providers.Call) providers.Result {
	if t := bytes.TrimSpace(c.Payload); !json.Valid(t) || len(t) == 0 || t[0] != '{' {
		return providers.Reject(fmt.Errorf("%s: the payload is not a JSON object", p.name), nil)
	}
	if err := ctx.Err(); err != nil {
		return providers.Retry(fmt.Errorf("%s: not sent: %w", p.name, err), 0)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, p.method, p.url, bytes.NewReader(c.Payload))
	if err != nil {
		return providers.Reject(fmt.Errorf("%s: cannot build the request for %s", p.name, p.shown), nil)
	}
	for name, values := range p.headers {
		req.Header[name] = values
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", UserAgent)
	req.Header.Set(p.keyHeader, p.HeaderKey(c.Key))
	resp, err := p.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) && ue.Err != nil {
			err = ue.Err // its text holds the URL
		}
		return p.redact.Result(providers.TransportResult(p.name, err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.maxBody+4<<10))
	complete := err == nil && int64(len(body)) <= p.maxBody
	if !complete {
		// The read stopped at its limit (or failed): the end may be the
		// start of a secret, which redaction (whole secrets only) would
		// miss, and which the redaction's shrinking could pull under the
		// cut at maxBody.
		body = p.redact.TrimPartial(body)
	}
	return p.classify(resp, body, complete, c.Key)
}

// answer is a Result's Detail.
type answer struct {
	Status    int             `json:"status"`
	Ref       string          `json:"ref,omitempty"`
	Body      json.RawMessage `json:"body,omitempty"`
	Truncated bool            `json:"truncated,omitempty"`
	Rule      string          `json:"rule,omitempty"`
}

func (p *Provider) classify(resp *http.Response, body []byte, complete bool, key string) providers.Result {
	// Redact, then cut: a cut first could leave the start of a secret.
	body = p.redact.Bytes(body)
	if int64(len(body)) > p.maxBody {
		body = body[:p.maxBody]
	}
	code := resp.StatusCode
	class := providers.ClassifyStatus(code)
	var best *rule
	for i := range p.rules {
		r := &p.rules[i]
		if r.matches(code, body) && (best == nil || r.moreSpecific(*best)) {
			best = r
		}
	}
	a := answer{Status: code, Body: providers.AnswerJSON(body, complete), Truncated: !complete}
	if best != nil {
		class, a.Rule = best.class, best.fromList+" "+best.text
	}
	detail := func() json.RawMessage {
		b, err := json.Marshal(a)
		if err != nil {
			b, _ = json.Marshal(answer{Status: code, Truncated: true})
		}
		return b
	}
	what := fmt.Sprintf("%s: %s %s answered %d", p.name, p.method, p.shown, code)
	switch class {
	case providers.Confirmed:
		if code >= 200 && code < 300 {
			if why := p.confirmWhen.Check(code, resp.Header); why != "" {
				r := providers.NotProven(what, code, why)
				r.Detail = detail()
				return p.redact.Result(r)
			}
		}
		ref := ""
		switch {
		case p.refPointer != "":
			ref, _ = Pointer(body, p.refPointer)
		case p.refHeader != "":
			ref = p.redact.String(strings.TrimSpace(resp.Header.Get(p.refHeader)))
		}
		if len(ref) > 255 {
			ref = ref[:255]
		}
		if ref == "" {
			ref = key
		}
		a.Ref = ref
		replayed := p.replayedHeader != "" && strings.EqualFold(strings.TrimSpace(resp.Header.Get(p.replayedHeader)), "true")
		return providers.Confirm(ref, replayed, detail())
	case providers.Rejected:
		r := providers.Reject(errors.New(what), detail())
		if p.speaksForKey(resp, code, body) {
			r = r.For(providers.ForKey)
		}
		return p.redact.Result(r)
	case providers.Retryable:
		r := providers.Retry(errors.New(what), providers.RetryAfter(resp.Header, time.Now()))
		r.Detail = detail()
		return p.redact.Result(r)
	}
	r := providers.Unsure(errors.New(what))
	r.Detail = detail()
	return p.redact.Result(r)
}

// speaksForKey reports whether a refusal came from behind the API's
// idempotency layer: it matches a ForKey rule, or the API says it replayed
// it.
func (p *Provider) speaksForKey(resp *http.Response, code int, body []byte) bool {
	if p.replayedHeader != "" && strings.EqualFold(strings.TrimSpace(resp.Header.Get(p.replayedHeader)), "true") {
		return true
	}
	for _, r := range p.forKey {
		if r.matches(code, body) {
			return true
		}
	}
	return false
}

// Pointer returns the value at the RFC 6901 JSON pointer ptr in body, as a
// string for a string and as its JSON text for a number or a boolean, and
// whether there is one.
func Pointer(body []byte, ptr string) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return "", false
	}
	if ptr == "" {
		return "", false
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch n := v.(type) {
		case map[string]any:
			e, ok := n[tok]
			if !ok {
				return "", false
			}
			v = e
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(n) || (len(tok) > 1 && tok[0] == '0') {
				return "", false
			}
			v = n[i]
		default:
			return "", false
		}
	}
	switch s := v.(type) {
	case string:
		return s, true
	case json.Number:
		return s.String(), true
	case bool:
		return strconv.FormatBool(s), true
	}
	return "", false
}
