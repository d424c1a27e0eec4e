package providertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/sidefx/sidefx/providers"
)

// CallPath is the path of the one endpoint of Handler: POST a call there.
const CallPath = "/call"

// Size limits of a call's body and of an answer, well above outbox's 256 KiB
// payload limit.
const (
	maxCallBytes   = 4 << 20
	maxAnswerBytes = 1 << 20
)

// wireCall is the JSON body of POST /call: the fields of a providers.Call.
type wireCall struct {
	EffectID int64           `json:"effect_id"`
	SourceID string          `json:"source_id"`
	Kind     string          `json:"kind"`
	Key      string          `json:"key"`
	Payload  json.RawMessage `json:"payload,omitempty"`
	Attempt  int             `json:"attempt"`
}

// wireResult is the JSON answer to POST /call: a providers.Result.
type wireResult struct {
	Class        string          `json:"class"` // providers.Class.String()
	Ref          string          `json:"ref,omitempty"`
	Replayed     bool            `json:"replayed,omitempty"`
	RetryAfterMS int64           `json:"retry_after_ms,omitempty"`
	Detail       json.RawMessage `json:"detail,omitempty"`
	Error        string          `json:"error,omitempty"`
}

// Handler returns an http.Handler that exposes f to another process: POST
// /call with a JSON body {"effect_id", "source_id", "kind", "key",
// "payload", "attempt"} runs f.Call with the request's context and answers
// 200 with {"class", "ref", "replayed", "retry_after_ms", "detail",
// "error"}, class being "confirmed", "rejected", "retryable" or "unknown". A
// body that is not such JSON gets 400.
//
// When the answer is lost (PerformedThenTimeout, TimeoutBeforeSend), the
// handler drops the connection without answering, so the caller sees a
// transport error after sending, as it would in production. A Hang ends when
// the caller gives up and closes the connection, or when the Server closes.
func (f *Fake) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+CallPath, f.serveCall)
	return mux
}

func (f *Fake) serveCall(w http.ResponseWriter, r *http.Request) {
	var in wireCall
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCallBytes)).Decode(&in); err != nil {
		http.Error(w, fmt.Sprintf("decode call: %v", err), http.StatusBadRequest)
		return
	}
	res := f.Call(r.Context(), providers.Call{
		EffectID: in.EffectID, SourceID: in.SourceID, Kind: in.Kind,
		Key: in.Key, Payload: in.Payload, Attempt: in.Attempt,
	})
	if errors.Is(res.Err, ErrResponseLost) || errors.Is(res.Err, ErrTimeoutBeforeSend) {
		// net/http closes the connection without a response and logs
		// nothing for this panic.
		panic(http.ErrAbortHandler)
	}
	out := wireResult{
		Class:        res.Class.String(),
		Ref:          res.Ref,
		Replayed:     res.Replayed,
		RetryAfterMS: res.RetryAfter.Milliseconds(),
		Detail:       res.Detail,
	}
	if res.Err != nil && res.Class != providers.Confirmed {
		out.Error = res.Err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out) // the caller sees a failed write as a transport error
}

// Server serves a Fake over HTTP on a loopback port, so that a dispatcher in
// another process (one a crash test kills and restarts) calls a fake whose
// memory outlives it. Reach it with a Client.
type Server struct {
	ts   *httptest.Server
	stop context.CancelFunc
}

// NewServer starts serving f.Handler on a free loopback port. Close it when
// done.
func NewServer(f *Fake) *Server {
	ctx, stop := context.WithCancel(context.Background())
	ts := httptest.NewUnstartedServer(f.Handler())
	ts.Config.BaseContext = func(net.Listener) context.Context { return ctx }
	ts.Start()
	return &Server{ts: ts, stop: stop}
}

// URL returns the server's base URL, "http://127.0.0.1:port": the URL of a
// ClientConfig.
func (s *Server) URL() string { return s.ts.URL }

// Close stops the server: calls in flight (a Hang included) see their
// context end, connections are closed, and Close returns once every handler
// has. Later calls are refused.
func (s *Server) Close() {
	s.stop()
	s.ts.CloseClientConnections()
	s.ts.Close()
}

// ClientConfig configures a Client.
type ClientConfig struct {
	// URL is the base URL of a Server (Server.URL) or of anything serving
	// Fake.Handler. Required.
	URL string
	// Name is what Name returns. Default "fake".
	Name string
	// Idempotent is what Idempotent returns: what the dispatcher believes of
	// the provider. Match the served Fake's Config.Idempotent unless the test
	// is about a mismatch. Default false.
	Idempotent bool
	// KeyWindow is what KeyWindow returns: how long the dispatcher believes
	// the provider remembers a key. Match the served Fake's
	// Config.KeyWindow. Default 0: no window.
	KeyWindow time.Duration
	// Timeout bounds each call, on top of the call's context. Default 0: only
	// the context bounds it.
	Timeout time.Duration
	// HTTPClient sends the calls. Default: a client of its own with a
	// transport that keeps up to 256 idle connections to the server, so
	// thousands of calls a second reuse connections instead of exhausting
	// ephemeral ports. Its Timeout, if any, counts as a transport error
	// (Unknown).
	HTTPClient *http.Client
}

// Client is a providers.Provider that calls a Fake over HTTP (see
// Fake.Handler). It classifies the way a real provider client must: an
// answer is decoded to its class; a request that surely was not sent (the
// connection was refused, the context was done before sending) is
// Retryable; any error once the request may have been sent (a timeout, EOF,
// a reset, the context ending) and an answer it cannot decode are Unknown.
type Client struct {
	name       string
	idempotent bool
	window     time.Duration
	endpoint   string
	timeout    time.Duration
	hc         *http.Client
	own        *http.Transport // nil when the caller gave HTTPClient
}

var (
	_ providers.Provider    = (*Client)(nil)
	_ providers.KeyWindower = (*Client)(nil)
)

// NewClient returns a Client configured by cfg.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.URL == "" {
		return nil, errors.New("new fake provider client: URL is required")
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("new fake provider client: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("new fake provider client: URL %q is not an http(s) URL with a host", cfg.URL)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("new fake provider client: negative Timeout %s", cfg.Timeout)
	}
	if cfg.Name == "" {
		cfg.Name = "fake"
	}
	c := &Client{
		name:       cfg.Name,
		idempotent: cfg.Idempotent,
		window:     cfg.KeyWindow,
		endpoint:   strings.TrimSuffix(u.String(), "/") + CallPath,
		timeout:    cfg.Timeout,
		hc:         cfg.HTTPClient,
	}
	if c.hc == nil {
		c.own = &http.Transport{
			Proxy: nil, // loopback: never through a proxy from the environment
			DialContext: (&net.Dialer{
				Timeout:   5 * time.Second,
				KeepAlive: 30 * time.Second,
			}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}
		c.hc = &http.Client{Transport: c.own}
	}
	return c, nil
}

// Name returns ClientConfig.Name.
func (c *Client) Name() string { return c.name }

// Idempotent returns ClientConfig.Idempotent.
func (c *Client) Idempotent() bool { return c.idempotent }

// KeyWindow returns ClientConfig.KeyWindow.
func (c *Client) KeyWindow() time.Duration { return c.window }

// Close closes the idle connections of the Client's own transport (none if
// ClientConfig.HTTPClient was given). The Client stays usable.
func (c *Client) Close() {
	if c.own != nil {
		c.own.CloseIdleConnections()
	}
}

// Call posts call to the fake and classifies the answer.
func (c *Client) Call(ctx context.Context, call providers.Call) providers.Result {
	body, err := json.Marshal(wireCall{
		EffectID: call.EffectID, SourceID: call.SourceID, Kind: call.Kind,
		Key: call.Key, Payload: call.Payload, Attempt: call.Attempt,
	})
	if err != nil {
		return providers.Reject(fmt.Errorf("call %s: encode call: %w", c.name, err), nil)
	}
	if err := ctx.Err(); err != nil {
		return providers.Retry(fmt.Errorf("call %s: not sent: %w", c.name, err), 0)
	}
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return providers.Reject(fmt.Errorf("call %s: %w", c.name, err), nil)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		if notSent(err) {
			return providers.Retry(fmt.Errorf("call %s: %w", c.name, err), 0)
		}
		return providers.Unsure(fmt.Errorf("call %s: %w", c.name, err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return providers.Unsure(fmt.Errorf("call %s: read answer: %w", c.name, err))
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		return c.decode(data)
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		// The fake refused the request before calling anything.
		return providers.Reject(fmt.Errorf("call %s: %s: %s", c.name, resp.Status, bytes.TrimSpace(data)), nil)
	default:
		return providers.Unsure(fmt.Errorf("call %s: unexpected answer %s", c.name, resp.Status))
	}
}

// decode turns a 200 answer into a Result; anything malformed is Unknown.
func (c *Client) decode(data []byte) providers.Result {
	var w wireResult
	if err := json.Unmarshal(data, &w); err != nil {
		return providers.Unsure(fmt.Errorf("call %s: malformed answer: %w", c.name, err))
	}
	if w.RetryAfterMS < 0 {
		return providers.Unsure(fmt.Errorf("call %s: malformed answer: retry_after_ms %d", c.name, w.RetryAfterMS))
	}
	err := remoteError(w.Error)
	switch w.Class {
	case providers.Confirmed.String():
		return providers.Confirm(w.Ref, w.Replayed, w.Detail)
	case providers.Rejected.String():
		return providers.Reject(err, w.Detail)
	case providers.Retryable.String():
		return providers.Retry(err, time.Duration(w.RetryAfterMS)*time.Millisecond)
	case providers.Unknown.String():
		return providers.Unsure(err)
	}
	return providers.Unsure(fmt.Errorf("call %s: malformed answer: class %q", c.name, w.Class))
}

// remoteError rebuilds the error of an answer, as the package's sentinel
// where the message shows one, so errors.Is works across HTTP.
func remoteError(msg string) error {
	if msg == "" {
		return nil
	}
	for _, s := range []error{ErrUnavailable, ErrRateLimited, ErrRejected, ErrTimeoutBeforeSend, ErrResponseLost, ErrServerError} {
		if msg == s.Error() {
			return s
		}
		if prefix, ok := strings.CutSuffix(msg, ": "+s.Error()); ok {
			return fmt.Errorf("%s: %w", prefix, s)
		}
	}
	return errors.New(msg)
}

// notSent reports whether err shows that the server cannot have received
// the request: the connection could not be made, or the pooled connection
// picked for it had been closed by the server before the request was
// written. net/http reports the latter with an unexported error,
// "http: server closed idle connection", which it returns only when the
// server's EOF arrived while no request was outstanding on the connection;
// it retries such a request itself only when it is idempotent, and a POST
// without an Idempotency-Key header is not. (The Client sends no such
// header on purpose: with it, net/http would also resend requests that the
// server may have read, hiding the very outcomes the fake injects.)
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil && ue.Err.Error() == "http: server closed idle connection" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}
