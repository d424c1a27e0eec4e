package providers

import (
	"context"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// TracerName names the tracer of the providers' HTTP spans.
const TracerName = "github.com/sidefx/sidefx/providers"

// KeyAttribute is the span attribute that carries an effect's derived
// idempotency key, on the dispatcher's span and on each HTTP span.
const KeyAttribute = attribute.Key("sidefx.idempotency_key")

type keyCtx struct{}

// WithKey returns ctx carrying the derived key of the call it is for, for
// the HTTP spans of Traced. The dispatcher sets it on every Call's context.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// KeyFrom returns the key WithKey put in ctx, or "".
func KeyFrom(ctx context.Context) string {
	k, _ := ctx.Value(keyCtx{}).(string)
	return k
}

// Traced wraps base (nil: http.DefaultTransport) so that a request made
// under a recording span is a client span, its child, named by the method,
// from the span's own TracerProvider: a provider needs no configuration,
// and sends nothing more when the dispatcher does not trace. The span holds
// the method, the server's host and port, the answer's status and the key
// (KeyFrom), and nothing else of the request: no path, query or header,
// any of which may carry a secret (a webhook URL's token, an API key), and
// no transport error text (it quotes the URL), only that it failed. The
// request is sent as it is: no trace header is added to it.
func Traced(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return tracedTransport{base: base}
}

type tracedTransport struct{ base http.RoundTripper }

func (t tracedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	parent := trace.SpanFromContext(req.Context())
	if !parent.IsRecording() {
		return t.base.RoundTrip(req)
	}
	attrs := []attribute.KeyValue{
		attribute.String("http.request.method", req.Method),
		attribute.String("server.address", req.URL.Hostname()),
	}
	if port := req.URL.Port(); port != "" {
		if n, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, attribute.Int("server.port", n))
		}
	}
	if key := KeyFrom(req.Context()); key != "" {
		attrs = append(attrs, KeyAttribute.String(key))
	}
	ctx, span := parent.TracerProvider().Tracer(TracerName).Start(req.Context(), req.Method,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	defer span.End()
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		span.SetStatus(codes.Error, "no answer")
		return resp, err
	}
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	if resp.StatusCode >= 500 {
		span.SetStatus(codes.Error, strconv.Itoa(resp.StatusCode))
	}
	return resp, nil
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// wrapped transport.
func (t tracedTransport) CloseIdleConnections() { closeIdle(t.base) }

// closeIdle closes rt's idle connections, if it has any: a wrapping
// transport's CloseIdleConnections.
func closeIdle(rt http.RoundTripper) {
	if c, ok := rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
