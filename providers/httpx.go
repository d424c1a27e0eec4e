package providers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// TransportResult classifies an error from sending an HTTP request (an
// error from http.Client.Do, not an HTTP status). The request certainly did
// not reach the peer when the connection was refused, the host name did not
// resolve, or the server closed an idle connection before the request was
// written: those are retryable. Anything else — a timeout, a reset or EOF
// after the request may have been written, a cancelled context — may have
// been acted on, and is unknown. what names the call in the error ("stripe
// charges.create"); err's own text is kept, so it must hold no secret.
func TransportResult(what string, err error) Result {
	if NotSent(err) {
		return Retry(fmt.Errorf("%s: not sent: %w", what, err), 0)
	}
	return Unsure(fmt.Errorf("%s: no answer: %w", what, err))
}

// NotSent reports whether err, from sending an HTTP request, proves the
// request never reached the peer.
func NotSent(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return true
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true // a dial that failed or timed out sent nothing
	}
	// net/http's own "server closed idle connection" is returned only when
	// nothing of the request was written; its error value is unexported.
	return strings.Contains(err.Error(), "http: server closed idle connection")
}

// OneRequest wraps base (nil: http.DefaultTransport) so that one call is
// one request: net/http sends again, on a new connection, a request that
// carries an Idempotency-Key header when the reused connection it was
// written on dies before an answer — and returns only the last error. When
// the peer went down after it received (and perhaps performed) the
// request, that last error is the new connection's "refused", which reads
// as "never sent": a charge made would be classified retryable, and could
// end failed with no evidence. A request sent through OneRequest is never
// resent by the transport (its GetBody is taken away, which is all that
// lets net/http rewind a body), so the error is the one of the connection
// the request was written on, and a request that may have been received
// is unknown. The dispatcher owns retries.
func OneRequest(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return oneRequest{base: base}
}

type oneRequest struct{ base http.RoundTripper }

func (t oneRequest) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.GetBody != nil && req.Body != nil && req.Body != http.NoBody {
		r := *req // a shallow copy: RoundTrip must not change req
		r.GetBody = nil
		req = &r
	}
	return t.base.RoundTrip(req)
}

// CloseIdleConnections closes the base transport's idle connections.
func (t oneRequest) CloseIdleConnections() { closeIdle(t.base) }

// RetryAfter reads a Retry-After header: delay-seconds or an HTTP date
// (relative to now). Absent, malformed or past values give zero.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		if secs <= 0 || secs > 365*24*3600 {
			return 0
		}
		return time.Duration(secs * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// ClassifyStatus gives the class of an HTTP status for a provider without
// special cases, claiming "not performed" only where the status proves it:
//
//	2xx                 confirmed  the peer accepted the request
//	408, 425, 429       retryable  refused before it was acted on: the request
//	                               was not received in full (408), not
//	                               processed as early data (425), or rate
//	                               limited (a limiter runs before the work)
//	409                 unknown    a conflict, at an API with idempotency keys
//	                               another request under the same key still in
//	                               flight: the effect may be in progress
//	other 4xx           rejected   a definite refusal of this request
//	5xx                 unknown    the peer failed while handling the request,
//	                               perhaps after it acted; a gateway's 502 or
//	                               504 may follow the upstream's work
//	1xx, 3xx, other     unknown    no decision the provider can read
//
// Providers with documented exceptions (Stripe's card errors, a receiver's
// 410) check those first.
func ClassifyStatus(code int) Class {
	switch {
	case code >= 200 && code < 300:
		return Confirmed
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code == http.StatusTooManyRequests:
		return Retryable
	case code == http.StatusConflict:
		return Unknown
	case code >= 400 && code < 500:
		return Rejected
	}
	return Unknown
}
