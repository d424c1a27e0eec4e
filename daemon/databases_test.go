package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

const fleetSecret = "whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw=="

// countingReceiver is the provider: it counts each delivery by its
// webhook-id (the effect's key) and keeps the order of the deliveries by
// the payload's db. hold, if set, holds a delivery of that db until the
// deliveries of release have all arrived (or 20s pass).
type countingReceiver struct {
	mu     sync.Mutex
	seen   map[string]int
	order  []string // db of each first delivery, in order
	hold   string
	want   map[string]int // release: db → deliveries
	opened chan struct{}
	got    map[string]int
}

func newCountingReceiver() *countingReceiver {
	return &countingReceiver{seen: map[string]int{}, got: map[string]int{}, opened: make(chan struct{})}
}

func (rc *countingReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var p struct {
		DB string `json:"db"`
	}
	_ = json.Unmarshal(body, &p)
	if p.DB == "" { // the webhook's envelope holds the payload under data
		var env struct {
			Data struct {
				DB string `json:"db"`
			} `json:"data"`
		}
		_ = json.Unmarshal(body, &env)
		p.DB = env.Data.DB
	}
	id := r.Header.Get("webhook-id")
	rc.mu.Lock()
	hold := rc.hold != "" && p.DB == rc.hold
	rc.mu.Unlock()
	if hold {
		select {
		case <-rc.opened:
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
			// An unfair daemon: hold no more, and let the order tell.
			rc.mu.Lock()
			rc.hold = ""
			rc.mu.Unlock()
		}
	}
	rc.mu.Lock()
	rc.seen[id]++
	if rc.seen[id] == 1 {
		rc.order = append(rc.order, p.DB)
		rc.got[p.DB]++
		if rc.want != nil {
			done := true
			for db, n := range rc.want {
				done = done && rc.got[db] >= n
			}
			if done {
				select {
				case <-rc.opened:
				default:
					close(rc.opened)
				}
			}
		}
	}
	rc.mu.Unlock()
	fmt.Fprintf(w, `{"id":"rcv_%s"}`, id[len(id)-8:])
}

func (rc *countingReceiver) snapshot() (distinct, deliveries int, order []string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, n := range rc.seen {
		deliveries += n
	}
	return len(rc.seen), deliveries, append([]string(nil), rc.order...)
}

// fleet is an in-process sidefx run serving several databases.
type fleet struct {
	t      *testing.T
	cfg    string
	env    map[string]string
	listen string
	logs   *syncBuffer
	stop   context.CancelFunc
	exited chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startFleet writes the configuration (databases, by name → URL, each
// serving webhook.order_paid at rc) and runs sidefx run in-process.
func startFleet(t *testing.T, rc http.Handler, workers int, names []string, urls map[string]string) *fleet {
	t.Helper()
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	var dbs strings.Builder
	for _, name := range names {
		fmt.Fprintf(&dbs, "  - {name: %s, url: %q, kinds: [webhook.order_paid]}\n", name, urls[name])
	}
	f := &fleet{t: t, listen: freeAddr(t), logs: &syncBuffer{}, exited: make(chan error, 1),
		env: map[string]string{"PARTNER_WEBHOOK_SECRET": fleetSecret}}
	f.cfg = filepath.Join(t.TempDir(), "sidefx.yaml")
	cfg := fmt.Sprintf(`databases:
%shttp: {listen: %q}
log: {level: info, format: json}
dispatcher: {workers: %d, batch_size: 10, poll_interval: 10ms, shutdown_timeout: 5s}
providers:
  partner: {type: webhook, url: %q, secret_env: PARTNER_WEBHOOK_SECRET, timeout: 30s}
kinds:
  webhook.order_paid: {provider: partner, backoff_base: 50ms, backoff_max: 1s}
`, dbs.String(), f.listen, workers, srv.URL+"/hooks")
	if err := os.WriteFile(f.cfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.stop = cancel
	go func() {
		f.exited <- Run(ctx, []string{"run", "--config", f.cfg}, &IO{Out: f.logs, Err: f.logs, Getenv: func(k string) string { return f.env[k] }})
	}()
	t.Cleanup(func() {
		cancel()
		<-f.exited
	})
	return f
}

// cli runs another sidefx command with the fleet's configuration.
func (f *fleet) cli(args ...string) (string, error) {
	var out, errOut bytes.Buffer
	err := Run(context.Background(), append(args, "--config", f.cfg), &IO{Out: &out, Err: &errOut, Getenv: func(k string) string { return f.env[k] }})
	return out.String() + errOut.String(), err
}

func (f *fleet) get(path string) string {
	f.t.Helper()
	resp, err := http.Get("http://" + f.listen + path)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// waitUntil polls cond until it holds, failing after 60s.
func (f *fleet) waitUntil(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case err := <-f.exited:
			f.t.Fatalf("sidefx run ended (%v) while waiting for %s\n%s", err, what, f.logs)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s did not happen\n%s", what, f.logs)
		}
	}
}

func enqueueIn(t *testing.T, url, db string, n int) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	es := make([]outbox.Effect, n)
	for i := range es {
		// Sources of their own: the databases share no namespace, so the
		// same source and kind would be the same key at the provider.
		es[i] = outbox.Effect{SourceID: fmt.Sprintf("%s-order-%d", db, i), Kind: "webhook.order_paid", Payload: map[string]any{"db": db, "i": i}}
	}
	if _, err := outbox.EnqueueMany(context.Background(), pool, es); err != nil {
		t.Fatal(err)
	}
}

// One sidefx run drains three databases: every effect of each confirmed
// exactly once at the provider; sidefx status shows each database's
// counts, /metrics labels each database's series, and list and inspect
// want --database.
func TestFleet_OneDaemonDrainsThreeDatabases(t *testing.T) {
	t.Parallel()
	names := []string{"eu", "us", "ap"}
	counts := map[string]int{"eu": 3, "us": 5, "ap": 7}
	urls := map[string]string{}
	for _, name := range names {
		urls[name] = pgtest.URL(t) // three databases on the one throwaway server
		enqueueIn(t, urls[name], name, counts[name])
	}
	rc := newCountingReceiver()
	f := startFleet(t, rc, 6, names, urls)
	(&daemon{t: t, listen: f.listen, exited: make(chan error)}).waitFor("/readyz", http.StatusOK, "ready")
	f.waitUntil("15 deliveries", func() bool { d, _, _ := rc.snapshot(); return d == 15 })
	for _, name := range names {
		f.waitUntil(name+"'s effects confirmed", func() bool {
			out, err := f.cli("status", "--json", "--database", name)
			var st statusJSON
			return err == nil && json.Unmarshal([]byte(out), &st) == nil && st.Total[effects.Confirmed] == int64(counts[name])
		})
	}
	if d, n, order := rc.snapshot(); d != 15 || n != 15 {
		t.Errorf("the provider got %d deliveries of %d effects, want 15 of 15 (%v)", n, d, order)
	}
	byDB := map[string]int{}
	_, _, order := rc.snapshot()
	for _, db := range order {
		byDB[db]++
	}
	for _, name := range names {
		if byDB[name] != counts[name] {
			t.Errorf("%s: %d effects delivered, want %d", name, byDB[name], counts[name])
		}
	}

	// sidefx status: a section per database, and a list in --json.
	out, err := f.cli("status")
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	for _, name := range names {
		i := strings.Index(out, "database "+name+"\n")
		if i < 0 {
			t.Fatalf("status has no section for %s:\n%s", name, out)
		}
		section := out[i:]
		if j := strings.Index(section[1:], "\ndatabase "); j >= 0 {
			section = section[:j+1]
		}
		if got := confirmedIn(section, "webhook.order_paid"); got != fmt.Sprint(counts[name]) {
			t.Errorf("%s's section shows %q confirmed, want %d:\n%s", name, got, counts[name], section)
		}
	}
	out, err = f.cli("status", "--json")
	if err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	var all statusDatabasesJSON
	if err := json.Unmarshal([]byte(out), &all); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if len(all.Databases) != 3 {
		t.Fatalf("status --json: %d databases\n%s", len(all.Databases), out)
	}
	for i, d := range all.Databases {
		if d.Database != names[i] || d.Total[effects.Confirmed] != int64(counts[names[i]]) || d.Total[effects.Pending] != 0 {
			t.Errorf("status --json, database %d: %s with %v, want %s with %d confirmed", i, d.Database, d.Total, names[i], counts[names[i]])
		}
	}

	// /metrics: each database's series carry its name.
	metricsPage := f.get("/metrics")
	for _, name := range names {
		want := fmt.Sprintf(`sidefx_dispatch_total{database=%q,kind="webhook.order_paid",outcome="confirmed",provider="partner"} %d`, name, counts[name])
		if !strings.Contains(metricsPage, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(metricsPage, "sidefx_dispatch_total{kind=") {
		t.Errorf("/metrics has dispatch series without a database label")
	}
	// The logs name the database.
	for _, name := range names {
		if !strings.Contains(f.logs.String(), `"database":"`+name+`"`) {
			t.Errorf("no log line names database %s", name)
		}
	}

	// The three derive keys in the same (empty) namespace and serve the
	// same kind: the daemon says so, once per pair.
	if n := strings.Count(f.logs.String(), "two databases derive keys in the same namespace"); n != 3 {
		t.Errorf("%d warnings of databases sharing a namespace, want 3 (one per pair)\n%s", n, f.logs)
	}

	// list and inspect want --database, naming the databases.
	for _, cmd := range [][]string{{"list"}, {"inspect", "1"}} {
		out, err := f.cli(cmd...)
		if err == nil || !strings.Contains(err.Error(), "give --database NAME (eu, us, ap)") {
			t.Errorf("%s without --database: %v\n%s", cmd[0], err, out)
		}
	}
	if out, err := f.cli("list", "--database", "asia"); err == nil || !strings.Contains(err.Error(), "--database asia: no such database in the configuration (databases: eu, us, ap)") {
		t.Errorf("list --database asia: %v\n%s", err, out)
	}
	out, err = f.cli("list", "--database", "us", "--json")
	if err != nil || strings.Count(out, `"source_id"`) != 5 || !strings.Contains(out, "us-order-4") || strings.Contains(out, "eu-order") {
		t.Errorf("list --database us: %v\n%s", err, out)
	}
	if out, err := f.cli("inspect", "--database", "ap", "--source", "ap-order-6"); err != nil || !strings.Contains(out, "confirmed") {
		t.Errorf("inspect --database ap: %v\n%s", err, out)
	}
	// --database-url wins over the file's URL of the database named (to
	// connect as another role, its owner say), and is not taken for
	// SIDEFX_DATABASE_URL, which databases: refuses.
	out, err = f.cli("list", "--database", "us", "--database-url", urls["eu"], "--json")
	if err != nil || strings.Count(out, `"source_id"`) != 3 || !strings.Contains(out, "eu-order") {
		t.Errorf("list --database us --database-url (eu's): %v\n%s", err, out)
	}
}

// confirmedIn reads the confirmed column of kind's row in sidefx status's
// table.
func confirmedIn(table, kind string) string {
	col := -1
	for line := range strings.Lines(table) {
		fields := strings.Fields(line)
		if len(fields) > 0 && fields[0] == "KIND" {
			col = slices.Index(fields, string(effects.Confirmed))
		}
		if len(fields) > 0 && fields[0] == kind && col > 0 && col < len(fields) {
			return fields[col]
		}
	}
	return ""
}

// The workers are shared fairly: a database with a few effects has them
// confirmed while another's backlog waits, its deliveries held at the
// provider until the few have arrived. A daemon serving its databases
// one after another would hold them until the backlog drained.
func TestFleet_AFewEffectsAreNotStuckBehindAnotherDatabasesBacklog(t *testing.T) {
	t.Parallel()
	urls := map[string]string{"big": pgtest.URL(t), "small": pgtest.URL(t)}
	enqueueIn(t, urls["big"], "big", 300)
	enqueueIn(t, urls["small"], "small", 4)
	rc := newCountingReceiver()
	rc.hold, rc.want = "big", map[string]int{"small": 4}
	f := startFleet(t, rc, 4, []string{"big", "small"}, urls)
	f.waitUntil("304 deliveries", func() bool { d, _, _ := rc.snapshot(); return d == 304 })
	_, _, order := rc.snapshot()
	small, big := 0, 0
	for _, db := range order {
		switch db {
		case "small":
			small++
		case "big":
			big++
		}
		if small == 4 {
			break
		}
	}
	if big > 8 { // the big database's share of the workers (2) per claim at most
		t.Errorf("the small database's 4 effects arrived after %d of the backlog's 300: its share of the workers waited", big)
	}
}
