package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/httpbound"
	"github.com/sidefx/sidefx/internal/metrics"
	"github.com/sidefx/sidefx/internal/telemetry"
	"github.com/sidefx/sidefx/migrations"
)

// The timeouts of the server of /metrics, /healthz, /readyz and /events:
// a delivery of events (at most maxEventBody) is read within
// httpReadTimeout; /readyz answers within 3 s and /metrics within a few.
const (
	httpReadTimeout  = 15 * time.Second
	httpWriteTimeout = 30 * time.Second
)

// version is set at build time with
// -ldflags "-X github.com/sidefx/sidefx/daemon.version=…".
var version = "dev"

func runCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("run", io)
	listen := fs.String("listen", "", "HTTP `address` for /metrics, /healthz, /readyz (default: the config's http.listen)")
	migrate := fs.Bool("migrate", false, "apply missing migrations before starting")
	if err := parse(fs, args); err != nil {
		return err
	}
	if c.configPath == "" {
		return usageErr("run needs --config FILE")
	}
	if c.dbName != "" {
		return usageErr("run serves every database of the configuration: --database is for the other commands")
	}
	cfg, err := c.loadConfig(io)
	if err != nil {
		return err
	}
	if c.schema != "" {
		if len(cfg.Databases) > 0 {
			return usageErr("--schema: each database of databases has its schema in the configuration")
		}
		cfg.Schema = c.schema
	}
	if *listen != "" {
		cfg.HTTP.Listen = *listen
	}
	log, err := config.NewLogger(cfg.Log, io.Err)
	if err != nil {
		return err
	}
	log = log.With("service", "sidefx")
	for _, w := range cfg.Warnings {
		log.Warn("configuration: " + w)
	}
	// The configuration is read at start only: SIGHUP, which would end the
	// process, is caught and answered with what to do instead.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				log.Warn("SIGHUP: the configuration is not reloaded; restart the daemon to apply it (SIGTERM lets the calls in flight finish, and replicas keep dispatching meanwhile)")
			}
		}
	}()
	rt, err := config.Build(cfg, io.Getenv, log)
	if err != nil {
		return fmt.Errorf("configuration %s:\n%w", c.configPath, err)
	}
	defer rt.Close()

	tp, stopTracing, err := telemetry.Setup(ctx, telemetry.Config{Endpoint: rt.Tracing.OTLPEndpoint, SampleRatio: rt.Tracing.SampleRatio,
		ServiceName: rt.Tracing.ServiceName, Version: Version(), Headers: rt.Tracing.Headers})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(sctx); err != nil {
			log.Warn("tracing: flushing spans at shutdown failed", "err", err)
		}
	}()
	if tp != nil {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing: exporting spans failed", "err", err) }))
		log.Info("tracing", "otlp_endpoint", rt.Tracing.OTLPEndpoint, "sample_ratio", rt.Tracing.SampleRatio)
	}

	// The pools connect on first use: nothing below touches the database
	// before the HTTP server is up.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// With databases, each database's metrics carry its name as a label
	// and its logs database=NAME; database_url's are as they always were.
	several := len(cfg.Databases) > 0
	dbs := make([]*database, 0, len(rt.Databases))
	for i := range rt.Databases {
		db, err := openDatabase(ctx, &rt.Databases[i], several, reg, tp, log)
		if db != nil {
			defer db.close()
		}
		if err != nil {
			return err
		}
		dbs = append(dbs, db)
	}
	// The console, when console.listen is set, is built here (a tokens
	// file that cannot be read stops the start) and served next to the
	// HTTP endpoint, on its own address. It shows one database.
	cdb := dbs[0]
	for _, db := range dbs {
		if db.name == cfg.Console.Database {
			cdb = db
		}
	}
	con, tokens, err := consoleHandler(cfg, rt.Providers, io.Getenv, cdb.pool, cdb.store, log)
	if err != nil {
		return err
	}

	// The HTTP server starts first: /healthz answers while the daemon waits
	// for its database or its migrations, and /readyz says which.
	ln, err := net.Listen("tcp", rt.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http listen %s: %w", rt.HTTP.Listen, err)
	}
	var started atomic.Bool
	mux := httpHandler(reg, newReadiness(allReady(dbs), time.Now).get, started.Load, allHealthy(dbs))
	if len(rt.EventSources) > 0 {
		mux.Handle("POST /events/{provider}", eventsHandlerTo(eventStores(dbs), rt.EventSources, newEventsBudget(), log))
		for name := range rt.EventSources {
			for _, db := range dbs {
				if _, ok := db.rt.EventSources[name]; !ok {
					continue
				}
				for _, result := range []string{metrics.EventStored, metrics.EventDuplicate, metrics.EventForeign, metrics.EventRefused} {
					db.m.Event(name, result, 0) // every series from the start
				}
			}
			log.Info("taking provider events", "provider", name, "path", "/events/"+name)
		}
	}
	// A request is read within httpReadTimeout, its answer written within
	// httpWriteTimeout: a client sending slowly holds its connection, and
	// its share of the events' budget, no longer.
	srv := httpbound.Server(mux, httpReadTimeout, httpWriteTimeout)
	srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("serving http", "http", ln.Addr().String())
	if con != nil {
		stopConsole, err := serveConsole(con, cfg.Console.Listen, tokens, len(cfg.Console.TrustedProxies) > 0, log)
		if err != nil {
			return err
		}
		defer stopConsole()
	}

	// Each database is waited for (and migrated, with --migrate) and
	// checked in turn: the daemon starts dispatching once all are ready.
	for _, db := range dbs {
		if ok, err := waitForDatabase(ctx, db.check, *migrate, db.log); err != nil || !ok {
			return db.wrap(err) // nil if stopped while waiting
		}
		if err := checkNamespace(ctx, db.pool, db.rt.Dispatcher.Schema, cfg.Namespace); err != nil {
			return db.wrap(err)
		}
		if err := checkSession(ctx, db.session, db.rt.SessionURL != ""); err != nil {
			return db.wrap(err)
		}
	}
	warnSharedNamespaces(ctx, dbs, log)
	var stops []func()
	defer func() {
		for _, stop := range slices.Backward(stops) {
			stop()
		}
	}()
	for _, db := range dbs {
		stopDrift, err := startDrift(ctx, db.session, db.rt.Drift, db.rt.Dispatcher.Schema, db.m, db.d.WorkerID(), db.log)
		if err != nil {
			return db.wrap(err)
		}
		stops = append(stops, stopDrift)
		if db.rt.Reconcile != nil {
			db.m.PrimeReconcile(db.served)
		}
		stopReconcile, err := startReconcile(ctx, db.session, db.rt.Reconcile, db.m, db.d.WorkerID(), db.log)
		if err != nil {
			return db.wrap(err)
		}
		stops = append(stops, stopReconcile)
	}
	started.Store(true)
	for _, db := range dbs {
		db.log.Info("started", "version", Version(), "http", ln.Addr().String(), "worker", db.d.WorkerID(), "kinds", len(db.rt.Dispatcher.Kinds),
			"workers", db.rt.Dispatcher.Workers)
	}
	return runDispatchers(ctx, dbs)
}

// database is one database the daemon serves and what runs on it.
type database struct {
	name    string
	several bool // one of databases: its errors name it
	rt      *config.Database
	pool    *pgxpool.Pool
	session *pgxpool.Pool // pool, or the session URL's
	store   *engine.Store
	m       *metrics.Metrics
	d       *dispatcher.Dispatcher
	check   dbCheck
	served  map[string]string // kind → provider
	log     *slog.Logger
}

// openDatabase makes the pools (which connect on first use), metrics and
// dispatcher of one database. A database returned is closed by close, even
// with an error.
func openDatabase(ctx context.Context, rt *config.Database, several bool, reg *prometheus.Registry, tp trace.TracerProvider, log *slog.Logger) (*database, error) {
	db := &database{name: rt.Name, several: several, rt: rt, log: log}
	field, sessionField := "database_url", "session_database_url"
	var r prometheus.Registerer = reg
	if several {
		db.log = log.With("database", rt.Name)
		field = "databases " + rt.Name + " url"
		r = prometheus.WrapRegistererWith(prometheus.Labels{"database": rt.Name}, reg)
	}
	var err error
	if db.pool, err = openPool(ctx, field, rt.URL, 0, rt.SessionURL != ""); err != nil {
		return nil, err
	}
	// What needs a session (LISTEN, the drift job's lock, the migrations)
	// has its own connections when database_url goes through a pooler in
	// transaction mode.
	db.session = db.pool
	dc := rt.Dispatcher
	if rt.SessionURL != "" {
		if db.session, err = openPool(ctx, sessionField, rt.SessionURL, 4, false); err != nil {
			db.session = nil
			return db, err
		}
		dc.ListenPool = db.session
	}
	if db.store, err = engine.NewStore(db.pool, &engine.StoreConfig{Schema: dc.Schema}); err != nil {
		return db, err
	}
	db.served = map[string]string{}
	for kind, k := range dc.Kinds {
		db.served[kind] = k.Provider.Name()
	}
	// The table's gauges label the kinds served; the others are summed.
	if db.m, err = metrics.New(r, db.store, &metrics.Options{Version: Version(), Logger: db.log,
		Kinds: slices.Sorted(maps.Keys(db.served))}); err != nil {
		return db, err
	}
	db.m.Prime(db.served)
	dc.Observer, dc.Logger = db.m, db.log
	if tp != nil {
		dc.TracerProvider = tp
	}
	if db.d, err = dispatcher.New(db.pool, &dc); err != nil {
		return db, db.wrap(err)
	}
	db.check = dbCheck{pool: db.pool, session: db.session, mc: &rt.Migrations, url: rt.URL}
	return db, nil
}

func (db *database) close() {
	if db.session != nil && db.session != db.pool {
		db.session.Close()
	}
	if db.pool != nil {
		db.pool.Close()
	}
}

// wrap names the database in err, of several.
func (db *database) wrap(err error) error {
	if err == nil || !db.several {
		return err
	}
	return fmt.Errorf("database %s: %w", db.name, err)
}

// allReady is ready when every database is, naming those that are not.
func allReady(dbs []*database) func(context.Context) error {
	return func(ctx context.Context) error {
		var errs []error
		for _, db := range dbs {
			errs = append(errs, db.wrap(db.check.check(ctx)))
		}
		return errors.Join(errs...)
	}
}

// allHealthy is healthy when every database's dispatcher is.
func allHealthy(dbs []*database) func() error {
	return func() error {
		var errs []error
		for _, db := range dbs {
			errs = append(errs, db.wrap(db.d.Healthy()))
		}
		return errors.Join(errs...)
	}
}

// runDispatchers runs every database's dispatcher until ctx ends or one of
// them fails, which stops the others: the daemon serves all of its
// databases or ends.
func runDispatchers(ctx context.Context, dbs []*database) error {
	if len(dbs) == 1 {
		return dbs[0].d.Run(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(dbs))
	var wg sync.WaitGroup
	for i, db := range dbs {
		wg.Go(func() {
			if err := db.d.Run(ctx); err != nil {
				errs[i] = db.wrap(err)
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// dbCheck tells whether the daemon's database answers and holds its
// current schema, for the wait at start and for /readyz.
type dbCheck struct {
	pool    *pgxpool.Pool
	session *pgxpool.Pool // for the migrations: pool, or the session_database_url's
	mc      *migrations.Config
	url     string // to redact its password from errors
}

// runMigrateHint adds the daemon's own way to migrate to a schema that is
// behind (a *migrations.SchemaBehindError).
type runMigrateHint struct{ *migrations.SchemaBehindError }

func (e runMigrateHint) Error() string {
	return e.SchemaBehindError.Error() + " (or sidefx run --migrate)"
}

// check reports why the database is not ready: unreachable, its migration
// status unreadable, a runMigrateHint (a *migrations.SchemaBehindError), or a
// *migrations.NewerSchemaError; nil if it is.
func (c dbCheck) check(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.pool.Ping(pctx); err != nil {
		return fmt.Errorf("database unreachable: %w", redactURL(err, c.url))
	}
	applied, missing, err := migrations.Status(pctx, c.pool, c.mc)
	if err != nil {
		return redactURL(err, c.url)
	}
	if err := migrations.CheckNotNewer(c.mc.Schema, applied); err != nil {
		return err
	}
	if len(missing) > 0 {
		schema := c.mc.Schema
		if schema == "" {
			schema = "public"
		}
		return runMigrateHint{&migrations.SchemaBehindError{Schema: schema, Applied: applied, Missing: missing}}
	}
	return nil
}

// waitForDatabase checks the database until it answers with a current
// schema, backing off, and applies the missing migrations if migrate is
// set: a daemon started before its database, or before its migrations,
// waits and says why (a warning per retry, /readyz) rather than
// crash-looping. It reports false if ctx ended first, and an error if
// applying the migrations failed or the schema is newer than this build.
func waitForDatabase(ctx context.Context, db dbCheck, migrate bool, log *slog.Logger) (bool, error) {
	delay := 100 * time.Millisecond
	for {
		err := db.check(ctx)
		if behind, ok := errors.AsType[runMigrateHint](err); ok && migrate {
			log.Info("applying migrations", "schema", behind.Schema, "missing", behind.Missing)
			if err := migrations.Apply(ctx, db.session, db.mc); err != nil {
				return false, err
			}
			migrate = false // once; a schema still behind is waited for
			continue
		}
		if err == nil {
			return true, nil
		}
		// A schema a newer sidefx migrated does not become older by
		// waiting: this daemon would not make that schema's statements.
		if _, ok := errors.AsType[*migrations.NewerSchemaError](err); ok {
			return false, err
		}
		if ctx.Err() != nil {
			return false, nil
		}
		log.Warn("not ready; retrying", "reason", err, "retry_in", delay.String())
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, nil
		case <-t.C:
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// readyInterval is how long a readiness check's result is reused, and
// readyTimeout how long one may take.
const (
	readyInterval = time.Second
	readyTimeout  = 3 * time.Second
)

// readiness shares the database's readiness check between /readyz
// requests: at most one check runs at a time, so at most one of the pool's
// connections serves them, and checks start at least readyInterval apart,
// every request in between answered with the last result. A request that
// ends first (its client gone) does not end the check.
type readiness struct {
	check func(context.Context) error
	now   func() time.Time

	mu      sync.Mutex
	at      time.Time // when the last check started
	err     error     // its result
	checked bool
	running chan struct{} // closed when the check in flight ends; nil if none
}

func newReadiness(check func(context.Context) error, now func() time.Time) *readiness {
	return &readiness{check: check, now: now}
}

// get returns the last check's result if it started within readyInterval,
// else that of the check in flight, starting one if none is.
func (r *readiness) get(ctx context.Context) error {
	r.mu.Lock()
	if r.checked && r.now().Sub(r.at) < readyInterval {
		defer r.mu.Unlock()
		return r.err
	}
	done := r.running
	if done == nil {
		done = make(chan struct{})
		r.running, r.at = done, r.now()
		go r.run(done)
	}
	r.mu.Unlock()
	select {
	case <-done:
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("the readiness check did not answer: %w", ctx.Err())
	}
}

func (r *readiness) run(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	err := r.check(ctx)
	r.mu.Lock()
	r.err, r.checked, r.running = err, true, nil
	r.mu.Unlock()
	close(done)
}

// httpHandler serves /metrics, /healthz (the process is up, whatever the
// database) and /readyz: 200 once the database answers, the schema is
// current (ready, shared and at most once a readyInterval), the daemon has
// started and the dispatcher reports no persistent error; else 503 with
// the reason.
func httpHandler(reg *prometheus.Registry, ready func(context.Context) error, started func() bool, healthy func() error) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler(reg))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := ready(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if !started() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		if err := healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// The source and kind whose key the database derives tells its namespace
// (checkNamespace, warnSharedNamespaces): the daemon's role may not read
// sidefx_settings.
const nsProbeSource, nsProbeKind = "sidefx-namespace-check", "sidefx.check"

// warnSharedNamespaces warns of databases that derive keys in the same
// namespace and serve a kind in common: an effect of the same source id
// and kind in two of them has the same key, and a provider that keeps
// keys would answer the second with the first's result (a replay), never
// performing it. Shards whose source ids never repeat across them are
// fine; others give each database its own namespace (sidefx migrate
// --namespace).
func warnSharedNamespaces(ctx context.Context, dbs []*database, log *slog.Logger) {
	if len(dbs) < 2 {
		return
	}
	byKey := map[string][]*database{}
	for _, db := range dbs {
		key, err := db.store.DatabaseKey(ctx, nsProbeSource, nsProbeKind)
		if err != nil {
			db.log.Warn("could not read the database's key namespace to compare it with the others'", "err", err)
			continue
		}
		byKey[key] = append(byKey[key], db)
	}
	for _, same := range byKey {
		for i, a := range same {
			for _, b := range same[i+1:] {
				var common []string
				for k := range a.served {
					if _, ok := b.served[k]; ok {
						common = append(common, k)
					}
				}
				if len(common) > 0 {
					slices.Sort(common)
					log.Warn("two databases derive keys in the same namespace and serve the same kinds: an effect of the same source id and kind in both has the same key, "+
						"and a provider that keeps keys answers the second with the first's result; unless source ids never repeat across them, give each its own namespace (sidefx migrate --namespace)",
						"databases", []string{a.name, b.name}, "kinds", common)
				}
			}
		}
	}
}

// checkNamespace refuses a configured key namespace that is not the
// database's: keys are derived with the database's (every producer, in any
// language, reads it there), so the configured one would be silently
// ignored. "" configures none. The daemon's role may not read
// sidefx_settings: it compares a key the database derives
// (sidefx_key(source, kind), which reads the namespace with its owner's
// rights, schema 21) with the key of the configured namespace.
func checkNamespace(ctx context.Context, pool *pgxpool.Pool, schema, want string) error {
	if want == "" {
		return nil
	}
	store, err := engine.NewStore(pool, &engine.StoreConfig{Schema: schema})
	if err != nil {
		return err
	}
	key, err := store.DatabaseKey(ctx, nsProbeSource, nsProbeKind)
	if err != nil {
		return fmt.Errorf("check the database's key namespace: %w", err)
	}
	if key != derive.KeyNS(want, nsProbeSource, nsProbeKind) {
		if key == derive.KeyNS("", nsProbeSource, nsProbeKind) {
			return fmt.Errorf("the configuration's namespace is %q, the database has none: keys are derived with the database's, so the configured one would be ignored; "+
				"remove namespace from the configuration, or give an empty database the namespace with sidefx migrate --namespace %s", want, want)
		}
		return fmt.Errorf("the configuration's namespace is %q, the database's is another: keys are derived with the database's, so the configured one would be ignored; "+
			"set the database's namespace in the configuration (sidefx_settings.namespace), or remove it", want)
	}
	return nil
}
