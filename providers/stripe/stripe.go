package stripe

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
	"golang.org/x/time/rate"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/stripe/stripecheck"
)

// DefaultBaseURL is Stripe's API.
const DefaultBaseURL = "https://api.stripe.com"

// DefaultTimeout bounds one request when Config.Timeout is zero.
const DefaultTimeout = 30 * time.Second

// MaxKeyLength is the longest idempotency key Stripe accepts.
const MaxKeyLength = 255

// KeyWindow is how long Stripe is sure to remember an idempotency key:
// Stripe may prune a key once it is at least 24 hours old, and a request
// with a pruned key is a new request. Provider.KeyWindow returns it.
const KeyWindow = 24 * time.Hour

// Errors a Call's Err wraps, for errors.Is.
var (
	// ErrIdempotencyMismatch: Stripe refused the request because its
	// idempotency key was first used with other parameters or another
	// endpoint (an idempotency_error). The effect is Rejected; something
	// upstream derived one key for two different requests, or the payload
	// changed between attempts, so it is worth an alarm: an earlier
	// request under this key may have performed an effect.
	ErrIdempotencyMismatch = errors.New("stripe idempotency key reused with different parameters")
	// ErrUnsupportedOperation: the effect's kind maps to no operation this
	// provider supports. Rejected before any request.
	// It is stripecheck.ErrUnsupportedOperation.
	ErrUnsupportedOperation = stripecheck.ErrUnsupportedOperation
	// ErrInvalidPayload: the effect's payload is not the operation's
	// parameters (or the call has no usable idempotency key). Rejected
	// before any request.
	// It is stripecheck.ErrInvalidPayload.
	ErrInvalidPayload = stripecheck.ErrInvalidPayload
)

// Config configures a Provider.
type Config struct {
	// APIKey is the secret (sk_…) or restricted (rk_…) key requests are
	// made with. Required. It is never logged and never appears in a
	// Result or an error.
	APIKey string
	// BaseURL is the address of Stripe's API. Default DefaultBaseURL; set
	// it to a stripe-mock or a test server. A trailing "/" or "/v1" is
	// ignored.
	BaseURL string
	// Timeout bounds each request, from sending it to reading the answer.
	// Default DefaultTimeout (30s); negative is an error. The context given
	// to Call bounds it too, and the earlier deadline wins.
	Timeout time.Duration
	// HTTPClient sends the requests. Default a client on
	// http.DefaultTransport. The provider uses a copy whose transport is
	// wrapped to see each answer's status and which follows no redirect
	// (Stripe's API never redirects; a 3xx is unknown); the client given is
	// not modified.
	HTTPClient *http.Client
	// Name is the provider's name in logs, metrics and limits. Default
	// "stripe".
	Name string
	// Operations maps an effect kind to the Stripe operation it performs,
	// one of Operations(). A kind not in the map uses DefaultOperation: its
	// last two dot-separated words. Nil is an empty map.
	Operations map[string]string
	// ConsistencyDelay is how long after its latest attempt an effect whose
	// object a lookup does not find is taken to be absent. Default
	// DefaultConsistencyDelay (5m); negative is an error.
	ConsistencyDelay time.Duration
	// LookupRate bounds the list requests of lookups and reconciliation,
	// per second. Default DefaultLookupRate (10); negative is an error.
	LookupRate float64
	// Now is the lookups' clock. Default time.Now.
	Now func() time.Time
}

// Provider performs effects as Stripe API calls, each with the effect's
// derived key as its Idempotency-Key, and classifies Stripe's answers. It is
// safe for concurrent use. See the package documentation for the
// classification.
type Provider struct {
	name    string
	apiKey  string
	redact  *providers.Redactor // the API key, as a peer may echo it
	timeout time.Duration
	ops     map[string]string
	api     *client.API

	consistency time.Duration
	limiter     *rate.Limiter
	now         func() time.Time
	listPage    int64 // 0: listPage; tests page through a few objects
}

var (
	_ providers.Provider    = (*Provider)(nil)
	_ providers.KeyWindower = (*Provider)(nil)
)

// New returns a Provider for cfg, or an error saying what in cfg is wrong.
func New(cfg *Config) (*Provider, error) {
	return newProvider(cfg, &stripego.LeveledLogger{Level: stripego.LevelNull})
}

// newProvider is New with the logger stripe-go writes to; tests pass one
// that records everything, to check it holds no secret.
func newProvider(cfg *Config, logger stripego.LeveledLoggerInterface) (*Provider, error) {
	if cfg == nil {
		return nil, errors.New("stripe: new provider: nil config")
	}
	p := &Provider{name: cfg.Name, apiKey: cfg.APIKey, timeout: cfg.Timeout, ops: make(map[string]string, len(cfg.Operations))}
	switch {
	case cfg.APIKey == "":
		return nil, errors.New("stripe: new provider: APIKey is required")
	case strings.TrimSpace(cfg.APIKey) != cfg.APIKey || strings.ContainsAny(cfg.APIKey, " \t\r\n"):
		// The key itself is not quoted: it is a secret.
		return nil, errors.New("stripe: new provider: APIKey holds whitespace")
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("stripe: new provider: Timeout %s is negative", cfg.Timeout)
	case cfg.ConsistencyDelay < 0 || cfg.LookupRate < 0:
		return nil, errors.New("stripe: new provider: ConsistencyDelay and LookupRate must not be negative")
	}
	p.consistency, p.now = cmp.Or(cfg.ConsistencyDelay, DefaultConsistencyDelay), cfg.Now
	if p.now == nil {
		p.now = time.Now
	}
	p.limiter = rate.NewLimiter(rate.Limit(cmp.Or(cfg.LookupRate, DefaultLookupRate)), 1)
	if p.name == "" {
		p.name = "stripe"
	}
	// The key as sent ("Bearer sk_…"), and as Basic credentials with an
	// empty password, the other way Stripe takes it.
	p.redact = providers.NewRedactor(cfg.APIKey, base64.StdEncoding.EncodeToString([]byte(cfg.APIKey+":")))
	if p.timeout == 0 {
		p.timeout = DefaultTimeout
	}
	baseURL := cfg.BaseURL
	if baseURL == "" {
		baseURL = DefaultBaseURL
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("stripe: new provider: BaseURL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("stripe: new provider: BaseURL %q: want http(s)://host[:port][/path]", u.Redacted())
	}
	for kind, op := range cfg.Operations {
		if kind == "" {
			return nil, errors.New("stripe: new provider: Operations has an empty kind")
		}
		if _, ok := operations[op]; !ok {
			return nil, fmt.Errorf("stripe: new provider: Operations maps kind %q to %q (supported: %s): %w",
				kind, op, strings.Join(Operations(), ", "), ErrUnsupportedOperation)
		}
		p.ops[kind] = op
	}

	httpClient := &http.Client{}
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient
		httpClient = &c
	}
	base := httpClient.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	httpClient.Transport = providers.Traced(providers.OneRequest(&observer{base: base}))
	// A redirect followed would resend the request, key and all, to a URL
	// nobody configured.
	httpClient.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	backend := stripego.GetBackendWithConfig(stripego.APIBackend, &stripego.BackendConfig{
		URL:        stripego.String(baseURL),
		HTTPClient: httpClient,
		// The dispatcher owns retries: one Call is one request.
		MaxNetworkRetries: stripego.Int64(0),
		// No request ids carried from one request into the next.
		EnableTelemetry: stripego.Bool(false),
		LeveledLogger:   logger,
	})
	p.api = &client.API{}
	p.api.Init(p.apiKey, &stripego.Backends{API: backend, Connect: backend, Uploads: backend})
	return p, nil
}

// Livemode reports whether the provider's API key is a live-mode key
// (sk_live_…, rk_live_…) or a test-mode one, and whether the key says
// which.
func (p *Provider) Livemode() (live, known bool) {
	for _, pre := range []string{"sk_live_", "rk_live_"} {
		if strings.HasPrefix(p.apiKey, pre) {
			return true, true
		}
	}
	for _, pre := range []string{"sk_test_", "rk_test_"} {
		if strings.HasPrefix(p.apiKey, pre) {
			return false, true
		}
	}
	return false, false
}

// Name returns Config.Name, by default "stripe".
func (p *Provider) Name() string { return p.name }

// DashboardLink is the page of Stripe's dashboard that shows a payment
// (pi_…, ch_…): providers.DashboardLinker, for the console.
func (p *Provider) DashboardLink(ref string) string {
	if strings.HasPrefix(ref, "pi_") || strings.HasPrefix(ref, "ch_") {
		return "https://dashboard.stripe.com/payments/" + url.PathEscape(ref)
	}
	return ""
}

// Idempotent returns true: Stripe honours Idempotency-Key on every POST, so
// a repeated call with the same key performs the effect at most once — for
// as long as Stripe keeps the key (KeyWindow).
func (p *Provider) Idempotent() bool { return true }

// KeyWindow returns KeyWindow, 24 hours: a possibly-performed effect must
// not be sent again once its first attempt is older.
func (p *Provider) KeyWindow() time.Duration { return KeyWindow }

// Operation returns the Stripe operation an effect kind maps to, and whether
// the provider supports it.
func (p *Provider) Operation(kind string) (string, bool) {
	op, ok := p.ops[kind]
	if !ok {
		op = DefaultOperation(kind)
	}
	_, ok = operations[op]
	return op, ok
}

// Call performs c as the Stripe operation its kind maps to and classifies
// the answer; see the package documentation for the table.
func (p *Provider) Call(ctx context.Context, c providers.Call) providers.Result {
	// The last guard: nothing the provider writes holds the key, and
	// Stripe's error fields are redacted as they are read; this catches
	// whatever a peer or a library echoed elsewhere.
	return p.redact.Result(p.call(ctx, c))
}

func (p *Provider) call(ctx context.Context, c providers.Call) providers.Result {
	name, ok := p.Operation(c.Kind)
	if !ok {
		return providers.Reject(fmt.Errorf("stripe: kind %q maps to operation %q (supported: %s): %w",
			c.Kind, name, strings.Join(Operations(), ", "), ErrUnsupportedOperation), nil)
	}
	what := "stripe " + name
	switch {
	case c.Key == "":
		// stripe-go would make up a random key: the effect could happen
		// once per attempt.
		return providers.Reject(fmt.Errorf("%s: no idempotency key: %w", what, ErrInvalidPayload), nil)
	case len(c.Key) > MaxKeyLength || strings.TrimSpace(c.Key) != c.Key:
		return providers.Reject(fmt.Errorf("%s: idempotency key of %d bytes: want 1 to %d, no surrounding space: %w", what, len(c.Key), MaxKeyLength, ErrInvalidPayload), nil)
	}
	op := operations[name]
	params, id, err := op.build(c)
	if err != nil {
		return providers.Reject(fmt.Errorf("%s: payload: %s: %w", what, err, ErrInvalidPayload), nil)
	}
	if err := ctx.Err(); err != nil {
		return providers.Retry(fmt.Errorf("%s: not sent: %w", what, err), 0)
	}

	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	ex := &exchange{}
	params.GetParams().Context = withExchange(ctx, ex)
	obj, err := op.send(p.api, id, params)
	return p.classify(name, obj, err, ex)
}

// String names the provider; it never shows the API key.
func (p *Provider) String() string { return fmt.Sprintf("stripe provider %q", p.name) }

// GoString is String, so %#v shows no secret either.
func (p *Provider) GoString() string { return p.String() }

// Format prints String for every verb: no verb walks the fields, which hold
// the API key.
func (p *Provider) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, p.String()) }

// LogValue is String, for log/slog.
func (p *Provider) LogValue() slog.Value { return slog.StringValue(p.String()) }

var _ providers.PayloadChecker = (*Provider)(nil)

// CheckPayload decodes payload strictly as the parameters of the operation
// kind maps to, as Call does before any request: an unknown or mistyped
// parameter is an error naming it. It is stripecheck.CheckPayload with the
// provider's operations, which a producer can link without the provider.
func (p *Provider) CheckPayload(kind string, payload json.RawMessage) error {
	return stripecheck.CheckPayload(p.ops, kind, payload)
}
