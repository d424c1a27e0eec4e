package stripe

import (
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

// inUse: another request under the same key is still executing (409
// Conflict, idempotency_key_in_use). It may perform the effect.
func (e *APIError) inUse() bool {
	return e.Status == http.StatusConflict || e.Code == string(stripego.ErrorCodeIdempotencyKeyInUse)
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
// answer's (for Retry-After and Stripe-Should-Retry). Stripe saves the
// answer under the key once the endpoint began executing — success or
// failure, a 500 included — and replays it to every retry with the key;
// validation failures, 409 concurrent-use conflicts and 429 rate limits
// (the limiter runs before the idempotency layer) are not saved. See the
// package documentation for the table and its reasons.
func classifyAPIError(e *APIError, header http.Header) providers.Result {
	after := providers.RetryAfter(header, time.Now())
	detail, _ := json.Marshal(e)
	replayed := header.Get("Idempotent-Replayed") == "true"
	with := func(r providers.Result) providers.Result {
		r.Detail = detail
		if r.RetryAfter == 0 {
			r.RetryAfter = after
		}
		if replayed && r.Speaks == providers.ForAttempt {
			// Stripe's idempotency layer answered from what it stored
			// under the key: the answer speaks for every attempt.
			r.Speaks = providers.ForKey
		}
		return r
	}
	switch {
	case e.Status >= 500:
		// The endpoint may have begun executing, and acted, before it
		// failed; Stripe then saved this 500 for the key and replays it
		// to every retry. Nothing proves the effect was not performed.
		return with(providers.Unsure(e))
	case e.inUse():
		// Checked before the mismatch: another attempt under our key is
		// executing and may perform the effect. Retried with the key, the
		// answer becomes that attempt's.
		return with(providers.Unsure(e))
	case e.Type == string(stripego.ErrorTypeCard):
		// Declined: definitely refused, by the endpoint, which Stripe
		// stored under the key: it speaks for every attempt.
		return with(providers.Reject(e, detail).For(providers.ForKey))
	case e.mismatch():
		// This request is refused, and an earlier one under the key
		// reached Stripe (with other parameters) and may have performed
		// something: an alarm, and evidence.
		return with(providers.Reject(fmt.Errorf("%w: %w", e, ErrIdempotencyMismatch), detail).For(providers.ForEarlier))
	case e.Status == http.StatusTooManyRequests:
		// Rate limited, or an object locked (lock_timeout): refused before
		// the endpoint ran.
		return with(providers.Retry(e, after))
	case header.Get("Stripe-Should-Retry") == "true":
		return with(providers.Retry(e, after)) // a 4xx Stripe says a retry may cure
	}
	return with(statusResult(e.Status, e, after))
}

// statusResult classifies an error answer by its status alone
// (providers.ClassifyStatus): a 4xx refusal is rejected, 408, 425 and 429
// retryable, a 409, a 5xx and anything else unknown.
func statusResult(status int, err error, after time.Duration) providers.Result {
	switch providers.ClassifyStatus(status) {
	case providers.Rejected:
		return providers.Reject(err, nil)
	case providers.Retryable:
		return providers.Retry(err, after)
	}
	r := providers.Unsure(err)
	r.RetryAfter = after // a 503's Retry-After still paces the retry with the key
	return r
}

// classify turns what stripe-go returned for operation op into a Result.
func (p *Provider) classify(op string, obj *object, err error, ex *exchange) providers.Result {
	what := "stripe " + op
	status, header, sent := ex.result()
	if err == nil {
		if status != 0 && (status < 200 || status >= 300) {
			// stripe-go decodes any answer below 400 as the object: a 3xx
			// (never followed) or 1xx is no confirmation.
			return providers.Unsure(fmt.Errorf("%s: status %d is no answer to the request", what, status))
		}
		if obj != nil && obj.resp != nil {
			header = obj.resp.Header
		}
		if why := proof(obj, header); why != "" {
			return providers.NotProven(what, status, why)
		}
		return confirm(obj, header)
	}
	var se *stripego.Error
	if errors.As(err, &se) {
		var header http.Header
		if se.LastResponse != nil {
			header = se.LastResponse.Header
		}
		return classifyAPIError(newAPIError(op, se, p.redact.String), header)
	}
	switch {
	case status >= 200 && status < 300:
		// A 2xx whose body stripe-go could not read or decode: cut off, or
		// not Stripe's at all (an intermediary's page). No object id
		// proves it Stripe's: unknown, retried with the key, and Stripe
		// replays its stored answer whole.
		return providers.NotProven(what, status, "body not read as a stripe object: "+err.Error())
	case status != 0:
		// An answer without a Stripe error object: a proxy's or load
		// balancer's page, which stripe-go reports as a plain error.
		// Nothing proves Stripe refused: a 408, 425 or 429 is retryable,
		// anything else unknown (a 5xx from a gateway may follow Stripe's
		// work; a proxy's 4xx is no refusal of Stripe's).
		e := fmt.Errorf("%s: status %d without a stripe error object", what, status)
		after := providers.RetryAfter(header, time.Now())
		if providers.ClassifyStatus(status) == providers.Retryable {
			return providers.Retry(e, after)
		}
		r := providers.Unsure(e)
		r.RetryAfter = after
		return r
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
}

// stripes is what every answer of Stripe's API carries: JSON
// (Content-Type application/json) and a Request-Id header.
var stripes = providers.ConfirmWhen{ContentType: "application/json", Headers: []string{"Request-Id"}}

// proof says what a 2xx answer lacks to be Stripe's own: Stripe's marks
// (stripes), and the object with its id, which a create or an action
// returns. "" when nothing is missing.
func proof(obj *object, header http.Header) string {
	var miss []string
	if why := stripes.Check(http.StatusOK, header); why != "" {
		miss = append(miss, why)
	}
	if obj == nil || obj.ID == "" {
		miss = append(miss, "no object id")
	}
	return strings.Join(miss, ", ")
}

// listProof says what the answer to a list request lacks to be Stripe's
// own: a 200 with Stripe's marks (stripes) whose body is a list object,
// {"object": "list", "data": […]}, each of its objects with an id. "" when
// nothing is missing. It never quotes the answer.
func listProof(answer *stripego.APIResponse) string {
	if answer == nil {
		return "no answer read"
	}
	rule := stripes
	rule.Statuses = []int{http.StatusOK}
	var miss []string
	if why := rule.Check(answer.StatusCode, answer.Header); why != "" {
		miss = append(miss, why)
	}
	var list struct {
		Object string `json:"object"`
		Data   *[]struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	switch err := json.Unmarshal(answer.RawJSON, &list); {
	case err != nil:
		miss = append(miss, "body not a list object")
	case list.Object != "list":
		miss = append(miss, fmt.Sprintf(`object %q (want "list")`, cut(list.Object)))
	case list.Data == nil:
		miss = append(miss, "no data array")
	default:
		for i, o := range *list.Data {
			if o.ID == "" {
				miss = append(miss, fmt.Sprintf("data[%d] has no id", i))
				break
			}
		}
	}
	return strings.Join(miss, ", ")
}

// cut shortens what a peer wrote to 32 bytes, for a message.
func cut(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}

// confirm builds a Confirmed Result from obj, which proof accepted with
// header, its answer's.
func confirm(obj *object, header http.Header) providers.Result {
	d := confirmed{ID: obj.ID, Object: obj.Object, Status: obj.Status, Amount: obj.Amount, Currency: obj.Currency, Livemode: obj.Livemode}
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
