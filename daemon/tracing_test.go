package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/internal/lab/syncbuf"
	"github.com/sidefx/sidefx/outbox"
)

// With tracing.otlp_endpoint set, sidefx run exports a span per dispatch
// to the collector, in the trace that enqueued the effect, and flushes it
// at shutdown; the collector's header from headers_env is sent.
func TestRun_TracingExportsDispatchSpans(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	var mu sync.Mutex
	var spans []string // "name trace parent"
	var keys []string
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := &coltrace.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(body, req); err != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get("X-Api-Key"))
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					spans = append(spans, fmt.Sprintf("%s %x %x", s.Name, s.TraceId, s.ParentSpanId))
				}
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	receiver := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer receiver.Close()

	path := filepath.Join(t.TempDir(), "sidefx.yaml")
	cfg := fmt.Sprintf(`database_url: %q
dispatcher: {poll_interval: 20ms}
providers:
  partner: {type: webhook, url: %q, secret_env: PARTNER_WEBHOOK_SECRET}
kinds:
  webhook.order_paid: {provider: partner}
tracing:
  otlp_endpoint: %s
  headers_env: {X-Api-Key: COLLECTOR_KEY}
`, url, receiver.URL, collector.URL)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PARTNER_WEBHOOK_SECRET": "whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw==", "COLLECTOR_KEY": "SECRETcollector"}

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 1},
		SpanID: trace.SpanID{7, 7, 7, 7, 7, 7, 7, 1}, TraceFlags: trace.FlagsSampled})
	if _, err := outbox.Enqueue(trace.ContextWithSpanContext(ctx, sc), pool, outbox.Effect{SourceID: "order-1", Kind: "webhook.order_paid", Payload: map[string]any{"n": 1}}); err != nil {
		t.Fatal(err)
	}

	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs syncbuf.Buffer
	go func() {
		done <- Run(rctx, []string{"run", "--config", path, "--listen", "127.0.0.1:0"}, &IO{Out: &bytes.Buffer{}, Err: &logs, Getenv: func(k string) string { return env[k] }})
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var state string
		if err := pool.QueryRow(ctx, "SELECT state FROM side_effects WHERE source_id = 'order-1'").Scan(&state); err != nil {
			t.Fatal(err)
		}
		if state == "confirmed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not confirmed; log:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// inspect shows the trace the effect was enqueued in.
	var inspectOut bytes.Buffer
	if err := Run(ctx, []string{"inspect", "--source", "order-1", "--database-url", url}, &IO{Out: &inspectOut, Err: &bytes.Buffer{}, Getenv: func(string) string { return "" }}); err != nil {
		t.Fatal(err)
	}
	if want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; !strings.Contains(inspectOut.String(), want) {
		t.Errorf("inspect does not show the traceparent %s:\n%s", want, inspectOut.String())
	}
	stop() // the shutdown flushes the spans
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	mu.Lock()
	defer mu.Unlock()
	want := fmt.Sprintf("sidefx.dispatch webhook.order_paid %s %s", sc.TraceID(), sc.SpanID())
	found := false
	for _, s := range spans {
		found = found || s == want
	}
	if !found {
		t.Errorf("the collector got spans %q, want %q", spans, want)
	}
	if len(keys) == 0 || keys[0] != "SECRETcollector" {
		t.Errorf("the collector's header: %q", keys)
	}
	if strings.Contains(logs.String(), "SECRETcollector") {
		t.Errorf("the daemon logged the collector's key")
	}
}
