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
	"slices"
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
	// DefaultKeyWindow is how long a receiver is assumed to keep the
	// webhook-ids it has processed: 24 hours, Stripe's window for its own
	// keys. Standard Webhooks tells receivers to dedupe on webhook-id but
	// sets no retention (its example keeps ids in Redis for 5 minutes), so
	// sidefx cannot know it: it assumes a day, tells receivers to keep ids
	// at least that long (see the package documentation), and a receiver
	// that keeps them for another span says so with Config.KeyWindow.
	DefaultKeyWindow = 24 * time.Hour
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
	case e.StatusCode == http.StatusFound || e.StatusCode == http.StatusSeeOther:
		msg += ": the receiver may have processed the delivery; redirects are not followed"
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

// Config configures a Provider: one receiver endpoint and its secrets.
type Config struct {
	// Name identifies the provider in logs, metrics, limits and errors.
	// Default "webhook"; give each endpoint its own name.
	Name string

	// URL is the receiver's endpoint, http or https. Required. It may carry
	// credentials or a token: its user information and every query value
	// are treated as secrets (never printed, redacted from every Result).
	URL string

	// Secret is the endpoint's Standard Webhooks signing secret: "whsec_"
	// and 24 to 64 random bytes in standard base64. Secret or Secrets is
	// required. It never appears in errors, Results, String or logs.
	Secret string

	// Secrets are more signing secrets of the same form, for rotation: each
	// delivery is signed with Secret and with every one of Secrets, and
	// webhook-signature carries one "v1,<signature>" per secret, space
	// separated, as Standard Webhooks specifies, so a receiver that knows
	// any one of them verifies the delivery. To rotate, add the new secret
	// here, give it to the receiver, then drop the old one. A secret given
	// twice signs once. Default none.
	Secrets []string

	// KeyWindow is how long the receiver keeps the webhook-ids it has
	// processed, and so how long a repeated delivery is absorbed: sidefx
	// never sends a possibly-delivered effect again after it. Default
	// DefaultKeyWindow (24h); negative is an error.
	KeyWindow time.Duration

	// Timeout bounds one delivery, from sending to reading the answer, on
	// top of the call's context. Default 10s; negative is an error.
	Timeout time.Duration

	// Headers are extra static request headers (an Authorization token the
	// receiver's gateway wants, a tenant id). Optional. They may not replace
	// the headers the provider sets (webhook-*, Idempotency-Key,
	// Content-Type, User-Agent, hop-by-hop headers). Their values are
	// treated as secrets: never printed, redacted from every Result (a
	// value, or the credentials after "Bearer " or "Basic ", of at least
	// providers.MinSecretLen bytes).
	Headers map[string]string

	// HTTPClient sends the deliveries. Default: a client of its own, with a
	// transport cloned from http.DefaultTransport (proxy from the
	// environment) that keeps up to 32 idle connections to the endpoint.
	// The provider uses a copy whose CheckRedirect stops at the first
	// redirect; the caller's client is not changed.
	HTTPClient *http.Client

	// ConfirmWhen is what proves a 2xx answer is the receiver's own and
	// not an intermediary's (a proxy's block page, a maintenance page): a
	// 2xx without it is unknown, retried under the same webhook-id inside
	// KeyWindow, then uncertain; never confirmed. Default (the zero
	// value): any 2xx, which is what Standard Webhooks counts as a
	// delivery. Set it when the receiver's answers carry a mark of their
	// own (a content type, a request-id header, a status).
	ConfirmWhen providers.ConfirmWhen

	// MaxResponseBytes bounds how much of an answer's body is read and kept
	// in a Result's Detail (escaping can make the stored text somewhat
	// longer). Default 64 KiB; at most 16 MiB, since the Detail is stored in
	// the effect's row.
	MaxResponseBytes int64
}

// String describes c without its secrets, its headers' values or the URL's
// credentials and query.
func (c Config) String() string {
	names := make([]string, 0, len(c.Headers))
	for name := range c.Headers {
		names = append(names, name)
	}
	secret := "none"
	if c.Secret != "" {
		secret = providers.Redacted
	}
	more := make([]string, len(c.Secrets))
	for i := range more {
		more[i] = providers.Redacted
	}
	return fmt.Sprintf("webhook.Config{Name:%q URL:%q Secret:%s Secrets:%v Timeout:%s KeyWindow:%s Headers:%q MaxResponseBytes:%d}",
		c.Name, providers.RedactURL(c.URL), secret, more, c.Timeout, c.KeyWindow, sortedStrings(names), c.MaxResponseBytes)
}

// GoString is String, so that %#v hides the secret too.
func (c Config) GoString() string { return c.String() }

// LogValue is String, so that slog hides the secret too.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Provider delivers effects to one webhook endpoint, signed per Standard
// Webhooks. It is safe for concurrent use.
type Provider struct {
	name    string
	shown   string // providers.RedactURL of the URL: what String shows
	secret  *secrets
	timeout time.Duration
	window  time.Duration
	maxBody int64
	// confirmWhen is Config.ConfirmWhen.
	confirmWhen providers.ConfirmWhen
	hc          *http.Client
	own         *http.Transport // nil when the caller gave HTTPClient
	now         func() time.Time
}

// secrets holds what must never be printed. Behind a pointer, fmt shows
// only its address, even when a Provider is printed by value.
type secrets struct {
	url     string              // may carry credentials or a token
	keys    [][]byte            // the HMAC keys, one per signing secret
	headers http.Header         // Config.Headers, whose values may be tokens
	redact  *providers.Redactor // every secret above, as a peer may echo it
}

var (
	_ providers.Provider    = (*Provider)(nil)
	_ providers.KeyWindower = (*Provider)(nil)
)

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
	if c.KeyWindow == 0 {
		c.KeyWindow = DefaultKeyWindow
	}
	if err := checkURL(c.URL); err != nil {
		return nil, err
	}
	keys, forms, err := decodeSecrets(c.Secret, c.Secrets)
	if err != nil {
		return nil, err
	}
	switch {
	case c.Timeout < 0:
		return nil, configErr("Timeout is %s, it must not be negative", c.Timeout)
	case c.KeyWindow < 0:
		return nil, configErr("KeyWindow is %s, it must not be negative", c.KeyWindow)
	case c.MaxResponseBytes < 0 || c.MaxResponseBytes > maxMaxResponseBytes:
		return nil, configErr("MaxResponseBytes is %d, it must be between 0 and %d (16 MiB)", c.MaxResponseBytes, maxMaxResponseBytes)
	}
	var bad []string
	c.ConfirmWhen.Validate(func(field, problem string) { bad = append(bad, "ConfirmWhen."+field+": "+problem) })
	if len(bad) > 0 {
		return nil, configErr("%s", strings.Join(bad, "; "))
	}
	headers := make(http.Header, len(c.Headers))
	for name, value := range c.Headers {
		if err := checkHeader(name, value); err != nil {
			return nil, err
		}
		headers.Set(name, value)
		forms = append(forms, providers.HeaderSecrets(value)...)
	}
	forms = append(forms, providers.URLSecrets(c.URL)...)
	p := &Provider{
		name:  c.Name,
		shown: providers.RedactURL(c.URL),
		secret: &secrets{
			url:     c.URL,
			keys:    keys,
			headers: headers,
			redact:  providers.NewRedactor(forms...),
		},
		timeout: c.Timeout,
		window:  c.KeyWindow,
		maxBody: c.MaxResponseBytes,
		now:     time.Now,

		confirmWhen: c.ConfirmWhen,
	}
	if c.HTTPClient != nil {
		hc := *c.HTTPClient
		p.hc = &hc
	} else {
		p.own = http.DefaultTransport.(*http.Transport).Clone()
		p.own.MaxIdleConnsPerHost = 32
		p.hc = &http.Client{Transport: p.own}
	}
	p.hc.Transport = providers.Traced(providers.OneRequest(p.hc.Transport))
	p.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return p, nil
}

// decodeSecrets returns the HMAC keys of the signing secrets, Secret first
// and then Secrets, each given once, with the forms of each that an answer
// could echo. Its errors name the field and never hold a secret.
func decodeSecrets(secret string, more []string) (keys [][]byte, forms []string, err error) {
	all := more
	fields := make([]string, 0, 1+len(more))
	if secret != "" {
		all = append([]string{secret}, more...)
		fields = append(fields, "Secret")
	}
	for i := range more {
		fields = append(fields, "Secrets["+strconv.Itoa(i)+"]")
	}
	if len(all) == 0 {
		return nil, nil, configErr("Secret or Secrets is required")
	}
	for i, s := range all {
		key, err := decodeSecret(fields[i], s)
		if err != nil {
			return nil, nil, err
		}
		if slices.ContainsFunc(keys, func(k []byte) bool { return bytes.Equal(k, key) }) {
			continue
		}
		keys = append(keys, key)
		forms = append(forms, secretForms(s, key)...)
	}
	return keys, forms, nil
}

// decodeSecret returns the HMAC key of a Standard Webhooks signing secret,
// "whsec_" and 24 to 64 bytes in standard base64. Its errors name field and
// never hold the secret.
func decodeSecret(field, secret string) ([]byte, error) {
	if secret == "" {
		return nil, configErr("%s is empty", field)
	}
	b64, ok := strings.CutPrefix(secret, SecretPrefix)
	if !ok {
		return nil, configErr("%s is not a Standard Webhooks secret: it must be %q followed by the key in base64", field, SecretPrefix)
	}
	if strings.ContainsAny(b64, "\r\n") {
		return nil, configErr("%s holds a line break", field)
	}
	key, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		// A CorruptInputError is an offset, never the input.
		var corrupt base64.CorruptInputError
		if errors.As(err, &corrupt) {
			return nil, configErr("%s: the part after %q is not standard base64 (bad input at byte %d)", field, SecretPrefix, int64(corrupt))
		}
		return nil, configErr("%s: the part after %q is not standard base64", field, SecretPrefix)
	}
	if len(key) < minKeyBytes || len(key) > maxKeyBytes {
		return nil, configErr("%s: the key is %d bytes, Standard Webhooks requires %d to %d", field, len(key), minKeyBytes, maxKeyBytes)
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

// KeyWindow returns Config.KeyWindow, by default DefaultKeyWindow: how long
// the receiver keeps webhook-ids.
func (p *Provider) KeyWindow() time.Duration { return p.window }

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

// sign returns the webhook-signature value of one delivery: for each key,
// "v1," and the base64 HMAC-SHA256, under the key, of id "." timestamp "."
// body; space separated, as Standard Webhooks specifies for rotation.
func sign(keys [][]byte, id string, timestamp int64, body []byte) string {
	sigs := make([]string, len(keys))
	for i, key := range keys {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id))
		mac.Write([]byte{'.'})
		mac.Write(strconv.AppendInt(nil, timestamp, 10))
		mac.Write([]byte{'.'})
		mac.Write(body)
		sigs[i] = "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	}
	return strings.Join(sigs, " ")
}

// Call delivers c.Payload once, signed with a fresh timestamp and
// webhook-id c.Key, and classifies the answer (see the package doc).
func (p *Provider) Call(ctx context.Context, c providers.Call) providers.Result {
	// The last guard: the parts of an answer are redacted as they are read;
	// this catches whatever else echoed a secret.
	return p.secret.redact.Result(p.call(ctx, c))
}

func (p *Provider) call(ctx context.Context, c providers.Call) providers.Result {
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
	req.Header.Set(HeaderSignature, sign(p.secret.keys, c.Key, ts, c.Payload))
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
	if !complete {
		// The read stopped at its limit (or failed): the end may be the
		// start of a secret, which redaction (whole secrets only) would
		// miss, and which the redaction's shrinking could pull under the
		// cut at maxBody.
		body = p.secret.redact.TrimPartial(body)
	}
	return p.classify(resp, body, complete, c.Key)
}

// redactSlack is how much of an answer's body is read past maxBody, so that
// a secret the cut at maxBody would split is still whole when the body is
// redacted, before the cut.
const redactSlack = 4 << 10

// readBody reads at most maxBody bytes of an answer, and up to redactSlack
// more for the redaction (see classify); complete is false when the body
// was longer than maxBody or its reading failed.
func (p *Provider) readBody(r io.Reader) (body []byte, complete bool) {
	body, err := io.ReadAll(io.LimitReader(r, p.maxBody+redactSlack))
	return body, err == nil && int64(len(body)) <= p.maxBody
}

// classify turns an answer into a Result (see the package doc's table).
func (p *Provider) classify(resp *http.Response, body []byte, complete bool, id string) providers.Result {
	redact := p.secret.redact
	// Redact, then cut: a cut first could leave the start of a secret.
	body = redact.Bytes(body)
	if int64(len(body)) > p.maxBody {
		body = body[:p.maxBody]
	}
	code := resp.StatusCode
	d := detail{Status: code, Body: providers.AnswerJSON(body, complete), Truncated: !complete}
	if rid := cleanRef([]byte(redact.String(resp.Header.Get(HeaderRequestID)))); rid != "" {
		d.RequestID = rid
	}
	if code >= 200 && code < 300 {
		if why := p.confirmWhen.Check(code, resp.Header); why != "" {
			r := providers.NotProven(p.name, code, why)
			r.Detail = d.encode()
			return r
		}
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
	after := providers.RetryAfter(resp.Header, p.now())
	if code >= 300 && code < 400 {
		// Never followed: following would resend a signed body to a URL
		// nobody configured.
		d.Location = cleanText([]byte(redact.String(resp.Header.Get("Location"))), maxRefBytes*4)
	}
	var r providers.Result
	switch {
	case code == http.StatusMovedPermanently, code == http.StatusTemporaryRedirect, code == http.StatusPermanentRedirect:
		// The endpoint moved: the request was not processed here. A
		// misconfigured URL, fixed by configuration and a retry.
		r = providers.Reject(err, nil)
	default:
		switch providers.ClassifyStatus(code) {
		case providers.Rejected:
			r = providers.Reject(err, nil) // the other 4xx: the receiver refused
		case providers.Retryable:
			r = providers.Retry(err, after) // 408, 425, 429: refused before any work
		default:
			// A 5xx (the receiver failed, perhaps after it acted), a 409
			// (another delivery of the id in progress), a 302 or 303 (the
			// answer frameworks give to a POST they processed), a 1xx or
			// a status past 599: it may have acted.
			r = providers.Unsure(err)
			r.RetryAfter = after
		}
	}
	if r.IsRejected() && strings.EqualFold(strings.TrimSpace(resp.Header.Get(HeaderReplayed)), "true") {
		// The receiver's stored answer for the webhook-id: it speaks for
		// every attempt under it.
		r = r.For(providers.ForKey)
	}
	r.Detail = d.encode()
	return r
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

// Format prints String for every verb: no verb walks the fields, which hold
// the signing key.
func (p *Provider) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, p.String()) }
