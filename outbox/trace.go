package outbox

import (
	"context"
	"encoding/hex"

	"go.opentelemetry.io/otel/trace"
)

// Traceparent returns the W3C traceparent of the span in ctx
// ("00-<trace id>-<span id>-<flags>"), or "" when ctx holds no valid span
// context. Enqueue stores it with each effect it inserts, and the
// dispatcher's span for the effect links to it: a trace runs from the
// request that enqueued an effect to the provider call that performs it.
// Only the OpenTelemetry API is read, so a producer that does not trace
// pays nothing but this check.
func Traceparent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	var b [55]byte
	copy(b[:], "00-")
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	flags := sc.TraceFlags()
	hex.Encode(b[53:55], []byte{byte(flags)})
	return string(b[:])
}
