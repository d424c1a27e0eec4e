package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sidefx/sidefx/providers"
)

// Defaults of Config.
const (
	DefaultName             = "webhook"
	DefaultTimeout          = 10 * time.Second
	DefaultMaxResponseBytes = 64 << 10
)

// maxMaxResponseBytes bounds Config.MaxResponseBytes.
const maxMaxResponseBytes = 16 << 20

// SecretPrefix starts every Standard Webhooks symmetric signing secret:
// "whsec_" followed by the key in standard base64.
const SecretPrefix = "whsec_"

// The key sizes Standard Webhooks allows for a symmetric signing secret.
const (
	minKeyBytes = 24
	maxKeyBytes = 64
)

// Header names of a delivery. Go canonicalizes them on the wire
// ("Webhook-Id"); HTTP header names are case-insensitive.
const (
	HeaderID             = "webhook-id"
	HeaderTimestamp      = "webhook-timestamp"
	HeaderSignature      = "webhook-signature"
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderReplayed is the answer header by which a receiver says it had
	// already processed this webhook-id (a convention borrowed from Stripe,
	// not part of Standard Webhooks): value "true".
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderRequestID is the answer header whose value becomes the Result's
	// Ref when the answer's body carries no "id".
	HeaderRequestID = "X-Request-Id"
)

// UserAgent is the User-Agent of every delivery.
const UserAgent = "sidefx"

// reserved are the request headers the provider sets itself; Config.Headers
// may not set them.
var reserved = []string{
	HeaderID, HeaderTimestamp, HeaderSignature, HeaderIdempotencyKey,
	"Content-Type", "Content-Length", "Content-Encoding", "Transfer-Encoding",
	"Host", "Connection", "User-Agent", "Expect", "Te", "Trailer", "Upgrade",
}

// ErrConfig is wrapped by every configuration error from New.
var ErrConfig = errors.New("invalid webhook configuration")

// ErrBadPayload is wrapped by the error of a Result for a payload that is not
// a JSON object; no request was sent.
var ErrBadPayload = errors.New("payload is not a JSON object")

// ErrGone matches (errors.Is) the error of a Result for a 410 Gone answer:
// the receiver asks for no more deliveries to this endpoint.
var ErrGone = errors.New("webhook endpoint is gone")

// ErrRedirect matches (errors.Is) the error of a Result for a 3xx answer:
// the endpoint redirected, and redirects are not followed.
var ErrRedirect = errors.New("webhook endpoint redirected")

// StatusError is the error of a Result for an answer that is not 2xx. It
// matches ErrGone for 410 and ErrRedirect for 3xx.
type StatusError struct {
	// StatusCode is the receiver's HTTP status.
	StatusCode int
}

// Error describes the status, without anything the receiver wrote.
func (e *StatusError) Error() string {
	msg := "receiver answered " + strconv.Itoa(e.StatusCode)
	if text := http.StatusText(e.StatusCode); text != "" {
		msg += " " + text
	}
	switch {
	case e.StatusCode == http.StatusGone:
		msg += ": the endpoint asks for no more deliveries"
	case e.StatusCode >= 300 && e.StatusCode < 400:
		msg += ": redirects are not followed, configure the final URL"
	}
	return msg
}

// Is reports whether e is a 410 for ErrGone, or a 3xx for ErrRedirect.
func (e *StatusError) Is(target error) bool {
	switch target {
	case ErrGone:
		return e.StatusCode == http.StatusGone
	case ErrRedirect:
		return e.StatusCode >= 300 && e.StatusCode < 400
	}
	return false
}

// Config configures a Provider: one receiver endpoint and its secret.
type Config struct {
	// Name identifies the provider in logs, metrics, limits and errors.
	// Default "webhook"; give each endpoint its own name.
	Name string

	// URL is the receiver's endpoint, http or https. Required. It may carry
	// credentials or a token; sidefx never prints it whole.
	URL string

	// Secret is the endpoint's Standard Webhooks signing secret: "whsec_"
	// and 24 to 64 random bytes in standard base64. Required. It never
	// appears in errors, Results, String or logs.
	Secret string

	// Timeout bounds one delivery, from sending to reading the answer, on
	// top of the call's context. Default 10s; negative is an error.
	Timeout time.Duration

	// Headers are extra static request headers (an Authorization token the
	// receiver's gateway wants, a tenant id). Optional. They may not replace
	// the headers the provider sets (webhook-*, Idempotency-Key,
	// Content-Type, User-Agent, hop-by-hop headers). Their values are
	// treated as secret: never printed.
	Headers map[string]string

	// HTTPClient sends the deliveries. Default: a client of its own, with a
	// transport cloned from http.DefaultTransport (proxy from the
	// environment) that keeps up to 32 idle connections to the endpoint.
	// The provider uses a copy whose CheckRedirect stops at the first
	// redirect; the caller's client is not changed.
	HTTPClient *http.Client

	// MaxResponseBytes bounds how much of an answer's body is read and kept
	// in a Result's Detail (escaping can make the stored text somewhat
	// longer). Default 64 KiB; at most 16 MiB, since the Detail is stored in
	// the effect's row.
	MaxResponseBytes int64
}

// String describes c without its secret, its headers' values or the URL's
// credentials and query.
func (c Config) String() string {
	names := make([]string, 0, len(c.Headers))
	for name := range c.Headers {
		names = append(names, name)
	}
	secret := "none"
	if c.Secret != "" {
		secret = "[REDACTED]"
	}
	return fmt.Sprintf("webhook.Config{Name:%q URL:%q Secret:%s Timeout:%s Headers:%q MaxResponseBytes:%d}",
		c.Name, redactURL(c.URL), secret, c.Timeout, sortedStrings(names), c.MaxResponseBytes)
}

// GoString is String, so that %#v hides the secret too.
func (c Config) GoString() string { return c.String() }

// LogValue is String, so that slog hides the secret too.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Provider delivers effects to one webhook endpoint, signed per Standard
// Webhooks. It is safe for concurrent use.
type Provider struct {
	name    string
	shown   string // redactURL of the URL: what String shows
	secret  *secrets
	timeout time.Duration
	maxBody int64
	hc      *http.Client
	own     *http.Transport // nil when the caller gave HTTPClient
	now     func() time.Time
}

// secrets holds what must never be printed. Behind a pointer, fmt shows
// only its address, even when a Provider is printed by value.
type secrets struct {
	url     string      // may carry credentials or a token
	key     []byte      // the HMAC key
	needles [][]byte    // forms of the secret to scrub from answers
	headers http.Header // Config.Headers, whose values may be tokens
}

var _ providers.Provider = (*Provider)(nil)

// New returns a Provider for the endpoint cfg describes, or an error
// wrapping ErrConfig that names the first field that is wrong.
func New(cfg *Config) (*Provider, error) {
	if cfg == nil {
		return nil, configErr("no config")
	}
	c := *cfg
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if err := checkURL(c.URL); err != nil {
		return nil, err
	}
	key, err := decodeSecret(c.Secret)
	if err != nil {
		return nil, err
	}
	switch {
	case c.Timeout < 0:
		return nil, configErr("Timeout is %s, it must not be negative", c.Timeout)
	case c.MaxResponseBytes < 0 || c.MaxResponseBytes > maxMaxResponseBytes:
		return nil, configErr("MaxResponseBytes is %d, it must be between 0 and %d (16 MiB)", c.MaxResponseBytes, maxMaxResponseBytes)
	}
	headers := make(http.Header, len(c.Headers))
	for name, value := range c.Headers {
		if err := checkHeader(name, value); err != nil {
			return nil, err
		}
		headers.Set(name, value)
	}
	p := &Provider{
		name:  c.Name,
		shown: redactURL(c.URL),
		secret: &secrets{
			url:     c.URL,
			key:     key,
			needles: secretForms(c.Secret, key),
			headers: headers,
		},
		timeout: c.Timeout,
		maxBody: c.MaxResponseBytes,
		now:     time.Now,
	}
	if c.HTTPClient != nil {
		hc := *c.HTTPClient
		p.hc = &hc
	} else {
		p.own = http.DefaultTransport.(*http.Transport).Clone()
		p.own.MaxIdleConnsPerHost = 32
		p.hc = &http.Client{Transport: p.own}
	}
	p.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return p, nil
}

// decodeSecret returns the HMAC key of a Standard Webhooks signing secret,
// "whsec_" and 24 to 64 bytes in standard base64. Its errors name the field
// and never hold the secret.
func decodeSecret(secret string) ([]byte, error) {
	if secret == "" {
		return nil, configErr("Secret is required")
	}
	b64, ok := strings.CutPrefix(secret, SecretPrefix)
	if !ok {
		return nil, configErr("Secret is not a Standard Webhooks secret: it must be %q followed by the key in base64", SecretPrefix)
	}
	if strings.ContainsAny(b64, "\r\n") {
		return nil, configErr("Secret holds a line break")
	}
	key, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		// A CorruptInputError is an offset, never the input.
		var corrupt base64.CorruptInputError
		if errors.As(err, &corrupt) {
			return nil, configErr("Secret: the part after %q is not standard base64 (bad input at byte %d)", SecretPrefix, int64(corrupt))
		}
		return nil, configErr("Secret: the part after %q is not standard base64", SecretPrefix)
	}
	if len(key) < minKeyBytes || len(key) > maxKeyBytes {
		return nil, configErr("Secret: the key is %d bytes, Standard Webhooks requires %d to %d", len(key), minKeyBytes, maxKeyBytes)
	}
	return key, nil
}

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// checkURL validates an endpoint URL; its errors never echo the URL, which
// may hold credentials or a token.
func checkURL(raw string) error {
	if raw == "" {
		return configErr("URL is required")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return configErr("URL does not parse")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return configErr("URL scheme %q is not http or https", u.Scheme)
	}
	if u.Host == "" {
		return configErr("URL has no host")
	}
	return nil
}

// checkHeader validates one of Config.Headers; its errors name the header,
// never its value.
func checkHeader(name, value string) error {
	if name == "" || strings.IndexFunc(name, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
		return configErr("Headers: %q is not a valid header name", name)
	}
	for _, r := range reserved {
		if strings.EqualFold(name, r) {
			return configErr("Headers: %q is set by the provider and cannot be configured", name)
		}
	}
	for i := 0; i < len(value); i++ {
		if b := value[i]; (b < 0x20 && b != '\t') || b == 0x7f {
			return configErr("Headers: the value of %q holds a control character", name)
		}
	}
	return nil
}

// isTokenChar reports whether r may appear in an HTTP header name (RFC 9110
// token).
func isTokenChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

// Name returns Config.Name.
func (p *Provider) Name() string { return p.name }

// Idempotent reports true: Standard Webhooks receivers must deduplicate on
// webhook-id, which is the effect's derived key on every attempt.
func (p *Provider) Idempotent() bool { return true }

// String describes p without its secret.
func (p *Provider) String() string {
	return fmt.Sprintf("webhook provider %q for %s", p.name, p.shown)
}

// GoString is String, so that %#v hides the secret too.
func (p *Provider) GoString() string { return p.String() }

// LogValue is String, so that slog hides the secret too.
func (p *Provider) LogValue() slog.Value { return slog.StringValue(p.String()) }

// Close closes the idle connections of the provider's own transport (none
// if Config.HTTPClient was given). The provider stays usable.
func (p *Provider) Close() {
	if p.own != nil {
		p.own.CloseIdleConnections()
	}
}

// sign returns the webhook-signature value of one delivery: "v1," and the
// base64 HMAC-SHA256, under key, of id "." timestamp "." body.
func sign(key []byte, id string, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write(strconv.AppendInt(nil, timestamp, 10))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Call delivers c.Payload once, signed with a fresh timestamp and
// webhook-id c.Key, and classifies the answer (see the package doc).
func (p *Provider) Call(ctx context.Context, c providers.Call) providers.Result {
	if !isObject(c.Payload) {
		return providers.Reject(fmt.Errorf("%s: %w", p.name, ErrBadPayload), nil)
	}
	if !validID(c.Key) {
		return providers.Reject(fmt.Errorf("%s: key %q is not a valid webhook-id (1 to 255 visible ASCII characters)", p.name, c.Key), nil)
	}
	if err := ctx.Err(); err != nil {
		return providers.Retry(fmt.Errorf("%s: not sent: %w", p.name, err), 0)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.secret.url, bytes.NewReader(c.Payload))
	if err != nil {
		// The URL was checked by New; the error would echo it.
		return providers.Reject(fmt.Errorf("%s: cannot build the request for %s", p.name, p.shown), nil)
	}
	for name, values := range p.secret.headers {
		req.Header[name] = values
	}
	ts := p.now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", UserAgent)
	req.Header.Set(HeaderID, c.Key)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, sign(p.secret.key, c.Key, ts, c.Payload))
	req.Header.Set(HeaderIdempotencyKey, c.Key)

	resp, err := p.hc.Do(req)
	if err != nil {
		// A *url.Error's text holds the URL, which may hold a token: keep
		// the transport's own error only.
		var ue *url.Error
		if errors.As(err, &ue) && ue.Err != nil {
			err = ue.Err
		}
		return providers.TransportResult(p.name, err)
	}
	defer resp.Body.Close()
	body, complete := p.readBody(resp.Body)
	return p.classify(resp, body, complete, c.Key)
}

// readBody reads at most maxBody bytes of an answer; complete is false when
// the body was longer or its reading failed.
func (p *Provider) readBody(r io.Reader) (body []byte, complete bool) {
	body, err := io.ReadAll(io.LimitReader(r, p.maxBody+1))
	if int64(len(body)) > p.maxBody {
		return body[:p.maxBody], false
	}
	return body, err == nil
}

// classify turns an answer into a Result.
func (p *Provider) classify(resp *http.Response, body []byte, complete bool, id string) providers.Result {
	body = p.redact(body)
	code := resp.StatusCode
	d := detail{Status: code, Body: bodyJSON(body, complete), Truncated: !complete}
	if rid := cleanRef(p.redact([]byte(resp.Header.Get(HeaderRequestID)))); rid != "" {
		d.RequestID = rid
	}
	if code >= 200 && code < 300 {
		ref := ""
		if complete {
			ref = bodyID(body)
		}
		if ref == "" {
			ref = d.RequestID
		}
		if ref == "" {
			ref = id
		}
		replayed := strings.EqualFold(strings.TrimSpace(resp.Header.Get(HeaderReplayed)), "true")
		return providers.Confirm(ref, replayed, d.encode())
	}
	err := fmt.Errorf("%s: %w", p.name, &StatusError{StatusCode: code})
	switch {
	case code < 200 || code >= 600:
		// 1xx as a final answer, or not an HTTP status: no decision.
		r := providers.Unsure(err)
		r.Detail = d.encode()
		return r
	case code >= 300 && code < 400:
		// Not followed: a webhook endpoint that redirects is misconfigured,
		// and the redirect says the request was not processed here.
		d.Location = cleanText(p.redact([]byte(resp.Header.Get("Location"))), maxRefBytes*4)
		return providers.Reject(err, d.encode())
	}
	if providers.ClassifyStatus(code) == providers.Retryable {
		r := providers.Retry(err, providers.RetryAfter(resp.Header, time.Now()))
		r.Detail = d.encode()
		return r
	}
	return providers.Reject(err, d.encode()) // the other 4xx
}

// isObject reports whether payload is one valid JSON object in UTF-8
// (surrounding white space allowed).
func isObject(payload []byte) bool {
	t := bytes.TrimLeft(payload, " \t\r\n")
	return len(t) > 0 && t[0] == '{' && json.Valid(payload) && utf8.Valid(payload)
}

// validID reports whether id can be sent as a webhook-id and an
// Idempotency-Key: 1 to 255 visible ASCII characters.
func validID(id string) bool {
	if id == "" || len(id) > maxRefBytes {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] >= 0x7f {
			return false
		}
	}
	return true
}

// redactURL shows scheme, host and path of a URL, never its user
// information, query or fragment.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(invalid URL)"
	}
	shown := u.Scheme + "://" + u.Host + u.EscapedPath()
	if u.RawQuery != "" {
		shown += "?…"
	}
	return shown
}

// Format prints String for every verb: no verb walks the fields, which hold
// the signing key.
func (p *Provider) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, p.String()) }
