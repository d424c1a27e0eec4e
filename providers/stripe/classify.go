package stripe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	stripego "github.com/stripe/stripe-go/v76"

	"github.com/sidefx/sidefx/providers"
)

// APIError is Stripe's error answer to a request, reduced to the fields
// that are safe to store: no PaymentIntent or SetupIntent objects (they hold
// client secrets), only their ids. A Result's Err is an *APIError whenever
// Stripe answered with an error object; errors.As finds it.
type APIError struct {
	// Op is the operation called ("payment_intents.create").
	Op string `json:"-"`
	// Status is the HTTP status of the answer.
	Status int `json:"status"`
	// Type is Stripe's error type: card_error, invalid_request_error,
	// idempotency_error, api_error.
	Type string `json:"type,omitempty"`
	// Code is Stripe's error code (card_declined, idempotency_key_in_use,
	// lock_timeout, resource_missing…).
	Code string `json:"code,omitempty"`
	// DeclineCode is the card issuer's reason for a decline
	// (insufficient_funds…).
	DeclineCode string `json:"decline_code,omitempty"`
	// Param names the parameter at fault, if one is.
	Param string `json:"param,omitempty"`
	// Message is Stripe's human-readable explanation.
	Message string `json:"message,omitempty"`
	// RequestID is Stripe's id for the request (req_…), for its support.
	RequestID string `json:"request_id,omitempty"`
	// DocURL links Stripe's documentation of the code.
	DocURL string `json:"doc_url,omitempty"`
	// Charge is the id of the failed charge, for card errors.
	Charge string `json:"charge,omitempty"`
	// PaymentIntent is the id of the PaymentIntent the error concerns.
	PaymentIntent string `json:"payment_intent,omitempty"`
}

// Error describes the error in one line: operation, status, type, code,
// decline code, request id, then Stripe's message.
func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "stripe %s: status %d", e.Op, e.Status)
	for _, f := range []struct{ name, v string }{{"", e.Type}, {"", e.Code}, {"decline_code ", e.DeclineCode}, {"param ", e.Param}, {"request ", e.RequestID}} {
		if f.v != "" {
			b.WriteString(", " + f.name + f.v)
		}
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// Is reports whether e is an idempotency mismatch (ErrIdempotencyMismatch):
// an idempotency_error that is not a key in use by a concurrent request.
func (e *APIError) Is(target error) bool {
	return target == ErrIdempotencyMismatch && e.mismatch()
}

func (e *APIError) mismatch() bool {
	return e.Type == string(stripego.ErrorTypeIdempotency) && !e.inUse()
}

// inUse: the key is held by a request still in flight (409 Conflict,
// idempotency_key_in_use) or the object is locked (lock_timeout); the
// answer to a later attempt may differ.
func (e *APIError) inUse() bool {
	return e.Status == http.StatusConflict || e.Code == string(stripego.ErrorCodeIdempotencyKeyInUse) || e.Code == string(stripego.ErrorCodeLockTimeout)
}

// newAPIError keeps the safe fields of se, each passed through redact.
func newAPIError(op string, se *stripego.Error, redact func(string) string) *APIError {
	e := &APIError{
		Op: op, Status: se.HTTPStatusCode, Type: redact(string(se.Type)), Code: redact(string(se.Code)),
		DeclineCode: redact(string(se.DeclineCode)), Param: redact(se.Param), Message: redact(se.Msg),
		RequestID: redact(se.RequestID), DocURL: redact(se.DocURL), Charge: redact(se.ChargeID),
	}
	if se.PaymentIntent != nil {
		e.PaymentIntent = redact(se.PaymentIntent.ID)
	}
	return e
}

// classifyAPIError gives the class of Stripe's error answer; header is the
// answer's (for Retry-After and Stripe-Should-Retry).
func classifyAPIError(e *APIError, header http.Header) providers.Result {
	after := providers.RetryAfter(header, time.Now())
	detail, _ := json.Marshal(e)
	switch {
	case e.Type == string(stripego.ErrorTypeCard):
		return providers.Reject(e, detail) // declined: no later attempt differs
	case e.inUse():
		// Checked before the mismatch: a key in use is a request still in
		// flight that may yet succeed, and calling it failed would leave
		// a performed effect marked failed. A mismatch answered as 409
		// would only be retried until the attempts run out.
		return providers.Retry(e, after)
	case e.mismatch():
		return providers.Reject(fmt.Errorf("%w: %w", e, ErrIdempotencyMismatch), detail)
	case e.Status == http.StatusTooManyRequests:
		return providers.Retry(e, after)
	case header.Get("Stripe-Should-Retry") == "true" && e.Status < 500:
		return providers.Retry(e, after) // Stripe's own hint that a retry may succeed
	}
	switch providers.ClassifyStatus(e.Status) {
	case providers.Rejected:
		return providers.Reject(e, detail)
	case providers.Retryable:
		// 5xx: Stripe either failed before executing the request (then the
		// key is not recorded and a retry runs it) or recorded this answer
		// for the key (then a retry replays it). Either way a retry with
		// the same key cannot perform the effect twice.
		return providers.Retry(e, after)
	}
	return providers.Unsure(e)
}

// classify turns what stripe-go returned for operation op into a Result.
func (p *Provider) classify(op string, obj *object, err error, ex *exchange) providers.Result {
	what := "stripe " + op
	if err == nil {
		return confirm(obj, nil)
	}
	var se *stripego.Error
	if errors.As(err, &se) {
		var header http.Header
		if se.LastResponse != nil {
			header = se.LastResponse.Header
		}
		return classifyAPIError(newAPIError(op, se, p.redact), header)
	}
	status, header, sent := ex.result()
	switch {
	case status >= 200 && status < 300:
		// Stripe performed the request; its answer was lost or unreadable
		// (stripe-go failed reading or decoding the body).
		return confirm(obj, header)
	case status != 0:
		// An answer without a Stripe error object: a proxy's or load
		// balancer's page, which stripe-go reports as a plain error.
		e := fmt.Errorf("%s: status %d without a stripe error object", what, status)
		switch providers.ClassifyStatus(status) {
		case providers.Rejected:
			return providers.Reject(e, nil)
		case providers.Retryable:
			return providers.Retry(e, providers.RetryAfter(header, time.Now()))
		}
		return providers.Unsure(e)
	case !sent:
		// stripe-go refused to build the request: nothing left the host,
		// and another attempt would fail the same way.
		return providers.Reject(fmt.Errorf("%s: request not built: %w", what, err), nil)
	}
	// A transport error: stripe-go returns http.Client.Do's *url.Error as
	// it is, so providers.TransportResult sees its cause (ECONNREFUSED, a
	// dial error, a context error).
	return providers.TransportResult(what, err)
}

// confirmed is a Confirmed Result's Detail.
type confirmed struct {
	ID       string `json:"id,omitempty"`
	Object   string `json:"object,omitempty"`
	Status   string `json:"status,omitempty"`
	Amount   *int64 `json:"amount,omitempty"`
	Currency string `json:"currency,omitempty"`
	Livemode *bool  `json:"livemode,omitempty"`
	Replayed bool   `json:"replayed"`
	// RequestID is Stripe's id for the request; on a replay, the original
	// request's.
	RequestID string `json:"request_id,omitempty"`
	// Unread: Stripe answered 2xx but the object could not be read; the
	// effect is done, and its object can be found by its metadata.
	Unread bool `json:"unread,omitempty"`
}

// confirm builds a Confirmed Result from obj; header is the answer's, when
// obj has none (an answer stripe-go could not read).
func confirm(obj *object, header http.Header) providers.Result {
	var d confirmed
	if obj != nil {
		d = confirmed{ID: obj.ID, Object: obj.Object, Status: obj.Status, Amount: obj.Amount, Currency: obj.Currency, Livemode: obj.Livemode}
		if obj.resp != nil {
			header = obj.resp.Header
		}
	}
	if d.ID == "" {
		d = confirmed{Unread: true}
	}
	d.Replayed = header.Get("Idempotent-Replayed") == "true"
	d.RequestID = header.Get("Request-Id")
	detail, _ := json.Marshal(d)
	return providers.Confirm(d.ID, d.Replayed, detail)
}

// observer wraps the HTTP client's transport to record, for the call whose
// context carries an exchange, that a request was handed to the transport
// and the status and header of its answer: stripe-go reports some answers
// (a 503 page from a proxy, a 200 whose body was cut off) as plain errors
// without their status.
type observer struct {
	base http.RoundTripper
}

// RoundTrip sends req with the base transport and records the answer.
func (o *observer) RoundTrip(req *http.Request) (*http.Response, error) {
	ex, _ := req.Context().Value(exchangeKey{}).(*exchange)
	if ex == nil {
		return o.base.RoundTrip(req)
	}
	ex.begin()
	resp, err := o.base.RoundTrip(req)
	if err == nil {
		ex.answer(resp.StatusCode, resp.Header.Clone())
	}
	return resp, err
}

// CloseIdleConnections closes the base transport's idle connections.
func (o *observer) CloseIdleConnections() {
	if c, ok := o.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

type exchangeKey struct{}

// exchange is what the transport saw of one Call's request.
type exchange struct {
	mu     sync.Mutex
	sent   bool // handed to the transport: it may have left the host
	status int
	header http.Header
}

func withExchange(ctx context.Context, ex *exchange) context.Context {
	return context.WithValue(ctx, exchangeKey{}, ex)
}

func (ex *exchange) begin() {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.sent = true
}

func (ex *exchange) answer(status int, header http.Header) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.status, ex.header = status, header
}

func (ex *exchange) result() (status int, header http.Header, sent bool) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return ex.status, ex.header, ex.sent
}

const redacted = "[redacted]"

// redact removes the API key from s. Stripe masks a key it quotes, but a
// mock or a proxy may not (stripe-mock quotes the Authorization header of
// a key it finds malformed).
func (p *Provider) redact(s string) string {
	return strings.ReplaceAll(s, p.apiKey, redacted)
}

// scrub removes the API key from a Result, wherever a peer or a library
// might have echoed it: the last line of defence, as nothing the provider
// writes holds it and Stripe's error fields are redacted as they are read.
func (p *Provider) scrub(r providers.Result) providers.Result {
	if r.Err != nil && strings.Contains(r.Err.Error(), p.apiKey) {
		r.Err = &scrubbed{msg: p.redact(r.Err.Error()), err: r.Err}
	}
	r.Ref = p.redact(r.Ref)
	if bytes.Contains(r.Detail, []byte(p.apiKey)) {
		r.Detail = bytes.ReplaceAll(r.Detail, []byte(p.apiKey), []byte(redacted))
	}
	return r
}

// scrubbed is an error whose text had the API key removed. It does not
// unwrap (the original's text holds the key) but answers errors.Is for it.
type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }

func (e *scrubbed) Is(target error) bool { return errors.Is(e.err, target) }
