package edgemetrics_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sidefx/sidefx/edge"
	"github.com/sidefx/sidefx/edge/edgemetrics"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Keyed requests, replays and mismatches through a real edge are counted
// per route.
func TestObserver_CountsKeyedRequests(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := edgemetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	e, err := edge.New(&edge.Config{Pool: pgtest.DB(t), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(201) })))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	post := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		req.Header.Set(edge.HeaderKey, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	post("k", "a")
	post("k", "a")
	post("k", "b")
	post("other", "a")
	expect := `
# HELP sidefx_edge_keyed_requests_total Requests that carried an Idempotency-Key, by route.
# TYPE sidefx_edge_keyed_requests_total counter
sidefx_edge_keyed_requests_total{route="POST /orders"} 4
# HELP sidefx_edge_mismatches_total Keys reused for another request (422), by route.
# TYPE sidefx_edge_mismatches_total counter
sidefx_edge_mismatches_total{route="POST /orders"} 1
# HELP sidefx_edge_replays_total Keyed requests answered from the stored answer, by route.
# TYPE sidefx_edge_replays_total counter
sidefx_edge_replays_total{route="POST /orders"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expect), "sidefx_edge_keyed_requests_total", "sidefx_edge_replays_total", "sidefx_edge_mismatches_total"); err != nil {
		t.Error(err)
	}
}
