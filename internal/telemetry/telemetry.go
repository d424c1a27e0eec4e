// Package telemetry sets up the daemon's OpenTelemetry tracing from its
// configuration: an OTLP/HTTP exporter in a batching TracerProvider, with
// parent-based ratio sampling, or nothing at all when tracing is off.
package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// Config says where spans go.
type Config struct {
	// Endpoint is the collector's OTLP/HTTP address (http://host:4318) or
	// its traces URL (…/v1/traces); "" turns tracing off.
	Endpoint string
	// SampleRatio is the share of root traces sampled; a span whose parent
	// was sampled is. 0 means 1.
	SampleRatio float64
	// ServiceName is the resource's service.name.
	ServiceName string
	// Version is the resource's service.version.
	Version string
	// Headers are sent with every export. Their values are secrets: no
	// error or log of this package shows them.
	Headers map[string]string
}

// Setup returns the TracerProvider cfg describes and the function that
// flushes and stops it. With no Endpoint it returns nil and a no-op
// shutdown: nothing is started, and a nil TracerProvider makes the
// dispatcher trace nothing.
func Setup(ctx context.Context, cfg Config) (trace.TracerProvider, func(context.Context) error, error) {
	if cfg.Endpoint == "" {
		return nil, func(context.Context) error { return nil }, nil
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, nil, fmt.Errorf("tracing.otlp_endpoint: want an http(s) URL such as http://127.0.0.1:4318")
	}
	path := strings.TrimSuffix(u.Path, "/")
	if !strings.HasSuffix(path, "/v1/traces") {
		path += "/v1/traces"
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path)}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	if len(cfg.Headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(cfg.Headers))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: %w", err)
	}
	ratio := cfg.SampleRatio
	if ratio <= 0 || ratio > 1 {
		ratio = 1
	}
	name := cfg.ServiceName
	if name == "" {
		name = "sidefx"
	}
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(name), semconv.ServiceVersion(cfg.Version))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	)
	return tp, tp.Shutdown, nil
}
