package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sidefx/sidefx/internal/telemetry"
)

func TestSetup_OffWithoutAnEndpoint(t *testing.T) {
	tp, shutdown, err := telemetry.Setup(context.Background(), telemetry.Config{SampleRatio: 0.5, Headers: map[string]string{"X-Api-Key": "k"}})
	if err != nil || tp != nil {
		t.Fatalf("Setup without an endpoint = %v, %v; want nothing", tp, err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Spans reach an OTLP/HTTP collector, with the configured headers and the
// service's name, on the traces path whether or not the endpoint names it.
func TestSetup_ExportsToTheCollector(t *testing.T) {
	for _, path := range []string{"", "/v1/traces"} {
		var mu sync.Mutex
		var got []*coltrace.ExportTraceServiceRequest
		var paths, keys []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			req := &coltrace.ExportTraceServiceRequest{}
			if err := proto.Unmarshal(body, req); err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
				http.Error(w, "bad export", http.StatusBadRequest)
				return
			}
			mu.Lock()
			got = append(got, req)
			paths = append(paths, r.URL.Path)
			keys = append(keys, r.Header.Get("X-Api-Key"))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/x-protobuf")
		}))
		tp, shutdown, err := telemetry.Setup(context.Background(), telemetry.Config{Endpoint: srv.URL + path, ServiceName: "sidefx-test",
			Headers: map[string]string{"X-Api-Key": "SECRETcollectorKEY"}})
		if err != nil {
			t.Fatal(err)
		}
		_, span := tp.Tracer("t").Start(context.Background(), "sidefx.dispatch email.receipt")
		span.End()
		if err := shutdown(context.Background()); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		srv.Close()
		mu.Lock()
		if len(got) != 1 || paths[0] != "/v1/traces" || keys[0] != "SECRETcollectorKEY" {
			t.Fatalf("endpoint %q: %d exports at %v with keys %v", srv.URL+path, len(got), paths, keys)
		}
		rs := got[0].ResourceSpans[0]
		var service string
		for _, a := range rs.Resource.Attributes {
			if a.Key == "service.name" {
				service = a.Value.GetStringValue()
			}
		}
		if service != "sidefx-test" || rs.ScopeSpans[0].Spans[0].Name != "sidefx.dispatch email.receipt" {
			t.Errorf("exported service %q span %q", service, rs.ScopeSpans[0].Spans[0].Name)
		}
		mu.Unlock()
	}
}

func TestSetup_RefusesABadEndpoint(t *testing.T) {
	_, _, err := telemetry.Setup(context.Background(), telemetry.Config{Endpoint: "collector:4318", Headers: map[string]string{"X-Api-Key": "SECRETcollectorKEY"}})
	if err == nil || !strings.Contains(err.Error(), "tracing.otlp_endpoint") || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("Setup with a bad endpoint: %v", err)
	}
}
