package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/config"
	"github.com/sidefx/sidefx/internal/metrics"
	"github.com/sidefx/sidefx/migrations"
)

// version is set at build time with -ldflags "-X main.version=…".
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
	cfg, err := c.loadConfig(io)
	if err != nil {
		return err
	}
	if c.databaseURL != "" {
		cfg.DatabaseURL = c.databaseURL
	}
	if c.schema != "" {
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
	rt, err := config.Build(cfg, io.Getenv, log)
	if err != nil {
		return fmt.Errorf("configuration %s:\n%w", c.configPath, err)
	}
	defer rt.Close()

	pcfg, err := pgxpool.ParseConfig(rt.DatabaseURL)
	if err != nil {
		return fmt.Errorf("database: %w", redactURL(err, rt.DatabaseURL))
	}
	if pcfg.ConnConfig.ConnectTimeout == 0 {
		// pgx sets none: a connection attempt into a silent network would
		// wait for TCP to give up. The URL's connect_timeout wins.
		pcfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("database: %w", redactURL(err, rt.DatabaseURL))
	}
	defer pool.Close()
	if !waitForDatabase(ctx, pool, log) {
		return nil // stopped while waiting
	}
	if *migrate {
		if err := migrations.Apply(ctx, pool, &rt.Migrations); err != nil {
			return err
		}
	}
	if _, missing, err := migrations.Status(ctx, pool, &rt.Migrations); err != nil {
		return err
	} else if len(missing) > 0 {
		return fmt.Errorf("schema %s lacks migrations %v: run sidefx migrate (or run --migrate)", rt.Migrations.Schema, missing)
	}
	store, err := effects.NewStore(pool, &effects.Config{Schema: rt.Dispatcher.Schema})
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := metrics.New(reg, store, &metrics.Options{Version: version, Logger: log})
	if err != nil {
		return err
	}
	served := map[string]string{}
	for kind, k := range rt.Dispatcher.Kinds {
		served[kind] = k.Provider.Name()
	}
	m.Prime(served)
	rt.Dispatcher.Observer = m
	d, err := dispatcher.New(pool, &rt.Dispatcher)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", rt.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http listen %s: %w", rt.HTTP.Listen, err)
	}
	srv := &http.Server{Handler: httpHandler(reg, pool, &rt.Migrations, d.Healthy), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	log.Info("started", "version", version, "http", ln.Addr().String(), "worker", d.WorkerID(), "kinds", len(rt.Dispatcher.Kinds))

	stopDrift, err := startDrift(ctx, pool, rt, m, d.WorkerID(), log)
	if err != nil {
		_ = srv.Close()
		return err
	}
	err = d.Run(ctx)
	stopDrift()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return err
}

// waitForDatabase pings until the database answers, backing off; a daemon
// started before its database should wait, not crash-loop. It reports false
// if ctx ended first.
func waitForDatabase(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) bool {
	delay := 100 * time.Millisecond
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pool.Ping(pctx)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		log.Warn("database not reachable; retrying", "err", err, "retry_in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// httpHandler serves /metrics, /healthz (the process is up) and /readyz (the
// dispatcher reports no persistent error, the database answers and the
// schema is current).
func httpHandler(reg *prometheus.Registry, pool *pgxpool.Pool, mc *migrations.Config, healthy func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler(reg))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := pool.Ping(ctx); err != nil {
			http.Error(w, "database unreachable", http.StatusServiceUnavailable)
			return
		}
		_, missing, err := migrations.Status(ctx, pool, mc)
		switch {
		case err != nil:
			http.Error(w, "migration status unknown", http.StatusServiceUnavailable)
		case len(missing) > 0:
			http.Error(w, fmt.Sprintf("schema lacks migrations %v", missing), http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ready")
		}
	})
	return mux
}
