package dispatcher

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/providers"
)

// TracerName names the dispatcher's tracer.
const TracerName = "github.com/sidefx/sidefx/dispatcher"

func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(TracerName)
}

// producerContext returns the span context of the W3C traceparent an
// effect was enqueued under, or an invalid one.
func producerContext(traceparent string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	return trace.SpanContextFromContext(ctx)
}

// startSpan starts the span of one effect's dispatch, at its claim: the
// child of the span that enqueued it, and linked to it, when the effect
// carries a valid traceparent; a root span otherwise.
func (d *Dispatcher) startSpan(ctx context.Context, e *effects.Effect, g *group, claimedAt time.Time) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(claimedAt),
		trace.WithAttributes(
			attribute.Int64("sidefx.effect_id", e.ID),
			attribute.String("sidefx.kind", e.Kind),
			attribute.String("sidefx.source_id", e.SourceID),
			attribute.Int("sidefx.attempt", e.Attempts),
			attribute.String("sidefx.provider", g.name),
			providers.KeyAttribute.String(e.Key),
		),
	}
	if sc := producerContext(e.Traceparent); sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return d.tracer.Start(ctx, "sidefx.dispatch "+e.Kind, opts...)
}

// answeredSpan records the provider's answer on span.
func answeredSpan(span trace.Span, res providers.Result, out engine.Outcome) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String("sidefx.answer", res.Class.String()),
		attribute.Bool("sidefx.replayed", res.Replayed),
		attribute.String("sidefx.state", string(out.State)))
	if res.Ref != "" {
		span.SetAttributes(attribute.String("sidefx.provider_ref", res.Ref))
	}
	if !res.IsConfirmed() && res.Err != nil {
		// A Result's error holds no secret: it is stored as last_error.
		span.SetStatus(codes.Error, res.Err.Error())
	}
}

// recordedSpan corrects the state on span to the one recorded.
func recordedSpan(span trace.Span, st effects.State) {
	if span != nil && span.IsRecording() {
		span.SetAttributes(attribute.String("sidefx.state", string(st)))
	}
}

// endSpan ends the span of an outcome recorded, or given up.
func endSpan(span trace.Span, recorded, fenced bool) {
	if span == nil {
		return
	}
	switch {
	case !recorded:
		span.SetStatus(codes.Error, "outcome not recorded; the lease will be rescued")
	case fenced:
		span.SetAttributes(attribute.Bool("sidefx.fenced", true))
	}
	span.End()
}
