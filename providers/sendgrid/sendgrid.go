package sendgrid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/sendgrid/rest"
	sg "github.com/sendgrid/sendgrid-go"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/sendgrid/sendgridcheck"
)

// Defaults of Config.
const (
	DefaultName    = sendgridcheck.DefaultName
	DefaultBaseURL = "https://api.sendgrid.com"
	DefaultTimeout = 30 * time.Second
)

// Endpoint is the path of SendGrid's v3 Mail Send operation, appended to
// Config.BaseURL.
const Endpoint = "/v3/mail/send"

// The custom_args that Call adds to every personalization of a mail, so that
// SendGrid's events and activity name the effect they belong to.
const (
	ArgKey      = "sidefx_key"       // the effect's derived key
	ArgSourceID = "sidefx_source_id" // the effect's source id, when not empty
	ArgKind     = "sidefx_kind"      // the effect's kind, when not empty
)

// HeaderKey is the mail header (in the body's "headers", not an HTTP
// header) that Call sets to the effect's derived key.
const HeaderKey = "X-Sidefx-Key"

// HeaderMessageID is the answer header whose value becomes a confirmed
// Result's Ref.
const HeaderMessageID = "X-Message-Id"

// maxAnswerBytes bounds how much of an answer's body is read; SendGrid's
// answers are a few hundred bytes.
const maxAnswerBytes = 1 << 20

// maxRefBytes bounds a Ref taken from X-Message-Id (SendGrid's are 22).
const maxRefBytes = 255

// ErrConfig is wrapped by every configuration error from New.
var ErrConfig = errors.New("invalid sendgrid configuration")

// ErrBadPayload is wrapped by the error of a Rejected Result for a payload
// that is not a mail Call can send; no request was made.
// It is sendgridcheck.ErrBadPayload.
var ErrBadPayload = sendgridcheck.ErrBadPayload

// Config configures a Provider.
type Config struct {
	// APIKey is the SendGrid API key, sent as "Authorization: Bearer …".
	// Required. It never appears in a Result, an error or a log.
	APIKey string
	// BaseURL is the scheme, host and optional path prefix that Endpoint is
	// appended to. Default DefaultBaseURL ("https://api.sendgrid.com"); set
	// it to "https://api.eu.sendgrid.com" for EU subusers, or to a local
	// test server or Prism.
	BaseURL string
	// Timeout bounds each Call, on top of the Call's context; a call that
	// runs out of time after sending is Unknown. Default DefaultTimeout
	// (30s); negative is an error.
	Timeout time.Duration
	// Name is what Name returns, and starts the message of every error of
	// Call. Default DefaultName ("sendgrid").
	Name string
	// HTTPClient sends the requests. Default: a client of the Provider's
	// own, with a transport cloned from http.DefaultTransport. The Provider
	// uses a copy of it that follows no redirect (a 3xx is classified, see
	// the package documentation) and reads at most 1 MiB of an answer. Its
	// transport must not resend a request on its own: net/http's does not
	// resend a POST once any of it was written, and Call adds no
	// Idempotency-Key header that would let it.
	HTTPClient *http.Client
}

// Provider sends mail through SendGrid's v3 Mail Send API, one Call per
// mail. It is safe for concurrent use.
type Provider struct {
	name    string
	apiKey  string
	redact  *providers.Redactor // the API key, as a peer may echo it
	baseURL string
	timeout time.Duration
	now     func() time.Time // reads Retry-After and X-RateLimit-Reset
	client  *rest.Client
	own     *http.Transport // nil when Config.HTTPClient was given
}

var _ providers.Provider = (*Provider)(nil)

// New returns a Provider configured by cfg, or an error wrapping ErrConfig
// that says what is wrong. The error never contains the API key.
func New(cfg *Config) (*Provider, error) {
	if cfg == nil {
		return nil, fmt.Errorf("new sendgrid provider: %w: nil Config", ErrConfig)
	}
	if err := checkAPIKey(cfg.APIKey); err != nil {
		return nil, fmt.Errorf("new sendgrid provider: %w: %w", ErrConfig, err)
	}
	redact := providers.NewRedactor(cfg.APIKey)
	base, err := checkBaseURL(cfg.BaseURL)
	if err != nil {
		// A key pasted into the URL is not repeated in the error.
		return nil, fmt.Errorf("new sendgrid provider: %w: %s", ErrConfig, redact.String(err.Error()))
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("new sendgrid provider: %w: negative Timeout %s", ErrConfig, cfg.Timeout)
	}
	p := &Provider{
		name:    cfg.Name,
		apiKey:  cfg.APIKey,
		redact:  redact,
		baseURL: base,
		timeout: cfg.Timeout,
		now:     time.Now,
	}
	if p.name == "" {
		p.name = DefaultName
	}
	if p.timeout == 0 {
		p.timeout = DefaultTimeout
	}
	hc := cfg.HTTPClient
	if hc == nil {
		p.own = newTransport()
		hc = &http.Client{Transport: p.own}
	}
	mine := *hc // a copy: the caller's client keeps its own redirect policy
	rt := mine.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	mine.Transport = providers.Traced(providers.OneRequest(limitedTransport{rt}))
	mine.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	p.client = &rest.Client{HTTPClient: &mine}
	return p, nil
}

// newTransport returns a clone of http.DefaultTransport, or, where a
// program replaced that with another RoundTripper, a transport with the
// same settings.
func newTransport() *http.Transport {
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		return t.Clone()
	}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
	}
}

func checkAPIKey(key string) error {
	if key == "" {
		return errors.New("APIKey is required")
	}
	for _, r := range key {
		if r > unicode.MaxASCII || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			// Say what is wrong, not what the key is.
			return errors.New("APIKey has a space, control or non-ASCII character")
		}
	}
	return nil
}

func checkBaseURL(raw string) (string, error) {
	if raw == "" {
		return DefaultBaseURL, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which may hold a credential
		}
		return "", fmt.Errorf("BaseURL is not a URL: %w", err)
	}
	shown := *u
	shown.User = nil // a credential, perhaps the key itself
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("BaseURL %q: scheme must be http or https", shown.String())
	case u.Host == "":
		return "", fmt.Errorf("BaseURL %q has no host", shown.String())
	case u.User != nil:
		return "", fmt.Errorf("BaseURL %q has user info: the API key goes in APIKey", shown.String())
	case u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("BaseURL %q has a query or fragment", shown.String())
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// Name returns Config.Name.
func (p *Provider) Name() string { return p.name }

// Idempotent returns false: SendGrid's Mail Send has no idempotency key, so
// a mail whose answer was lost may have been sent.
func (p *Provider) Idempotent() bool { return false }

// Close closes the idle connections of the Provider's own transport (none
// when Config.HTTPClient was given). The Provider stays usable.
func (p *Provider) Close() {
	if p.own != nil {
		p.own.CloseIdleConnections()
	}
}

// Call sends the mail of c.Payload, tagged with c's key, and classifies
// SendGrid's answer as the package documentation describes.
func (p *Provider) Call(ctx context.Context, c providers.Call) providers.Result {
	what := p.callName()
	body, err := buildBody(c)
	if err != nil {
		return p.redact.Result(providers.Reject(fmt.Errorf("%s: %w", what, err), nil))
	}
	if err := ctx.Err(); err != nil {
		return providers.Retry(fmt.Errorf("%s: not sent: %w", what, err), 0)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	var trace sendTrace
	ctx = httptrace.WithClientTrace(ctx, trace.clientTrace())

	req := sg.GetRequest(p.apiKey, Endpoint, p.baseURL)
	req.Method = rest.Post
	req.Body = body
	resp, err := p.client.SendWithContext(ctx, req)
	if resp == nil {
		if err == nil {
			err = errors.New("no answer and no error")
		}
		if trace.notSent() {
			return p.redact.Result(providers.Retry(fmt.Errorf("%s: not sent: %w", what, err), 0))
		}
		return p.redact.Result(providers.TransportResult(what, err))
	}
	// With an answer, err can only be a failure to read its body: the
	// status is SendGrid's decision all the same.
	return p.redact.Result(p.classify(what, resp, p.now()))
}

// callName names the call in errors: "sendgrid mail send", after the
// provider's name when it has another ("mail: sendgrid mail send"), so that
// a provider named for what it sends does not read "mail mail send".
func (p *Provider) callName() string {
	return sendgridcheck.CallName(p.name)
}

// classify turns an answer into a Result.
func (p *Provider) classify(what string, resp *rest.Response, now time.Time) providers.Result {
	h := http.Header(resp.Headers)
	class := providers.ClassifyStatus(resp.StatusCode)
	if class == providers.Confirmed {
		// SendGrid's Mail Send answers 202 Accepted with the message's id
		// in X-Message-Id: that is its proof. Any other 2xx, or a 202
		// without the id, may be an intermediary's (a proxy's page, a
		// wrong base URL's host): not confirmed.
		ref := truncate(p.redact.String(strings.TrimSpace(h.Get(HeaderMessageID))), maxRefBytes)
		var miss []string
		if resp.StatusCode != http.StatusAccepted {
			miss = append(miss, "want 202 Accepted")
		}
		if ref == "" {
			miss = append(miss, "no "+HeaderMessageID+" header")
		}
		if len(miss) == 0 {
			return providers.Confirm(ref, false, nil)
		}
		apiErr := parseAnswer(resp.StatusCode, resp.Body, p.redact.String)
		r := providers.Unsure(fmt.Errorf("%s: %w: status %d, %s: %w", what, providers.ErrNotProven, resp.StatusCode, strings.Join(miss, ", "), apiErr))
		r.Detail = apiErr.detail()
		return r
	}
	apiErr := parseAnswer(resp.StatusCode, resp.Body, p.redact.String)
	if class == providers.Rejected && len(apiErr.Errors) == 0 {
		// A refusal without SendGrid's error JSON ({"errors": […]}): a
		// proxy's or gateway's page, which is no proof that SendGrid
		// refused the mail. Unknown, so the mail ends uncertain for an
		// operator rather than failed on an intermediary's word.
		class = providers.Unknown
	}
	err := fmt.Errorf("%s: %w", what, apiErr)
	after := providers.RetryAfter(h, now)
	if after == 0 && resp.StatusCode == http.StatusTooManyRequests {
		after = rateLimitReset(h, now)
	}
	var r providers.Result
	switch class {
	case providers.Rejected:
		r = providers.Reject(err, nil)
	case providers.Retryable:
		r = providers.Retry(err, after)
	default:
		// A 5xx: SendGrid failed while processing a valid request, and
		// does not say the mail was not queued. A 409 (undocumented for
		// Mail Send), a 1xx or 3xx: no answer to a mail send. The mail may
		// have been accepted.
		r = providers.Unsure(err)
		r.RetryAfter = after
	}
	r.Detail = apiErr.detail()
	return r
}

// rateLimitReset reads SendGrid's X-RateLimit-Reset (the unix time, in
// seconds, at which the rate limit window resets) as a wait from now. Absent,
// malformed, past or more than a day ahead (a clock far off) give zero.
func rateLimitReset(h http.Header, now time.Time) time.Duration {
	secs, err := strconv.ParseInt(strings.TrimSpace(h.Get("X-RateLimit-Reset")), 10, 64)
	if err != nil {
		return 0
	}
	d := time.Unix(secs, 0).Sub(now)
	if d <= 0 || d > 24*time.Hour {
		return 0
	}
	return d
}

// sendTrace records whether a request got a connection. A transport that
// went looking for one (GetConn) and never had one (GotConn) wrote nothing:
// the request certainly did not reach SendGrid, whatever the error (a
// context that ended during a slow dial included). A transport that reports
// neither, not being an *http.Transport, proves nothing.
type sendTrace struct {
	getConn, gotConn atomic.Bool
}

func (s *sendTrace) clientTrace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GetConn: func(string) { s.getConn.Store(true) },
		GotConn: func(httptrace.GotConnInfo) { s.gotConn.Store(true) },
	}
}

func (s *sendTrace) notSent() bool { return s.getConn.Load() && !s.gotConn.Load() }

// limitedTransport reads at most maxAnswerBytes of an answer's body:
// sendgrid-go's rest package reads whole bodies into memory.
type limitedTransport struct{ rt http.RoundTripper }

func (t limitedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if resp != nil && resp.Body != nil {
		resp.Body = limitedBody{io.LimitReader(resp.Body, maxAnswerBytes), resp.Body}
	}
	return resp, err
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// wrapped transport.
func (t limitedTransport) CloseIdleConnections() {
	if c, ok := t.rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

type limitedBody struct {
	io.Reader
	io.Closer
}

// String names the provider; it never shows the API key.
func (p *Provider) String() string { return fmt.Sprintf("sendgrid provider %q", p.name) }

// GoString is String, so %#v shows no secret either.
func (p *Provider) GoString() string { return p.String() }

// Format prints String for every verb: no verb walks the fields, which hold
// the API key.
func (p *Provider) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, p.String()) }

// LogValue is String, for log/slog.
func (p *Provider) LogValue() slog.Value { return slog.StringValue(p.String()) }

var _ providers.PayloadChecker = (*Provider)(nil)

// CheckPayload checks payload as a mail-send body, as Call does before any
// request: sendgridcheck.CheckPayload, which a producer can link without
// the provider.
func (p *Provider) CheckPayload(_ string, payload json.RawMessage) error {
	return sendgridcheck.CheckPayload(p.name, payload)
}
