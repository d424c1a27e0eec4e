package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers/providertest"
)

// kind is the effect kind (sidefx) and job kind (River) of every item.
const kind = "bench.noop"

// payload is what every effect and job carries.
type payload struct {
	SourceID string `json:"source_id"`
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
}

func (payload) Kind() string { return kind }

// noopWorker is River's counterpart of the no-latency fake provider.
type noopWorker struct {
	river.WorkerDefaults[payload]
}

func (noopWorker) Work(context.Context, *river.Job[payload]) error { return nil }

// The open-item queries the drains poll, each served by an index.
const (
	sidefxOpen = `SELECT (SELECT count(*) FROM side_effects WHERE state = 'pending')
		+ (SELECT count(*) FROM side_effects WHERE state = 'fired')`
	riverOpen = `SELECT count(*) FROM river_job WHERE state IN ('available', 'running', 'retryable', 'scheduled', 'pending')`
)

// sidefxTuning is a dispatcher configuration under test.
type sidefxTuning struct {
	name       string
	workers    int
	batchSize  int
	claimLoops int // 0: the default
}

// riverTuning is a River client configuration under test.
type riverTuning struct {
	name          string
	maxWorkers    int
	fetchCooldown time.Duration
	pollInterval  time.Duration
}

var (
	sidefxDefault = sidefxTuning{name: "default (Workers 200, BatchSize 200)"}
	// sidefxTuned is the best of sidefxCandidates on the 2-core machine
	// (see docs/benchmarks.md; --tune measures them all again).
	// Workers twice the batch lets the next claim run while the last
	// batch's outcomes are written.
	sidefxTuned      = sidefxTuning{name: "tuned (Workers 1000, BatchSize 500)", workers: 1000, batchSize: 500}
	sidefxCandidates = []sidefxTuning{
		{name: "Workers 100, BatchSize 100 (the default before)", workers: 100, batchSize: 100},
		{name: "Workers 128, BatchSize 100", workers: 128, batchSize: 100},
		{name: "Workers 256, BatchSize 250", workers: 256, batchSize: 250},
		{name: "Workers 512, BatchSize 500", workers: 512, batchSize: 500},
		sidefxTuned,
		{name: "Workers 1000, BatchSize 1000", workers: 1000, batchSize: 1000},
		{name: "Workers 1000, BatchSize 500, 1 claim loop", workers: 1000, batchSize: 500, claimLoops: 1},
		{name: "Workers 1000, BatchSize 500, 3 claim loops", workers: 1000, batchSize: 500, claimLoops: 3},
	}
	// riverDefault: River has no default MaxWorkers; 100 is the value of
	// its documentation's examples.
	riverDefault = riverTuning{name: "default (MaxWorkers 100)", maxWorkers: 100}
	riverTuned   = riverTuning{name: "tuned (MaxWorkers 1000, FetchCooldown 5ms)", maxWorkers: 1000, fetchCooldown: 5 * time.Millisecond}
	riverCands   = []riverTuning{
		{name: "MaxWorkers 500", maxWorkers: 500},
		riverTuned,
		{name: "MaxWorkers 2000, FetchCooldown 1ms", maxWorkers: 2000, fetchCooldown: time.Millisecond},
	}
)

// loadSidefx enqueues n pending effects with source ids prefix-0 ….
func loadSidefx(ctx context.Context, pool *pgxpool.Pool, prefix string, n int) error {
	for start := 0; start < n; start += 1000 {
		batch := make([]outbox.Effect, 0, 1000)
		for i := start; i < min(n, start+1000); i++ {
			batch = append(batch, outbox.Effect{SourceID: fmt.Sprintf("%s-%d", prefix, i), Kind: kind,
				Payload: payload{SourceID: fmt.Sprintf("%s-%d", prefix, i), Amount: 4200, Currency: "eur"}})
		}
		if _, err := outbox.EnqueueMany(ctx, pool, batch); err != nil {
			return fmt.Errorf("load effects: %w", err)
		}
	}
	return nil
}

// loadRiver inserts n available jobs.
func loadRiver(ctx context.Context, pool *pgxpool.Pool, prefix string, n int) error {
	client, err := riverClient(pool, nil)
	if err != nil {
		return err
	}
	for start := 0; start < n; start += 1000 {
		batch := make([]river.InsertManyParams, 0, 1000)
		for i := start; i < min(n, start+1000); i++ {
			batch = append(batch, river.InsertManyParams{Args: payload{SourceID: fmt.Sprintf("%s-%d", prefix, i), Amount: 4200, Currency: "eur"}})
		}
		if _, err := client.InsertMany(ctx, batch); err != nil {
			return fmt.Errorf("load jobs: %w", err)
		}
	}
	return nil
}

// recorder is a dispatcher.Observer that stamps each recorded outcome.
type recorder struct {
	mu   sync.Mutex
	done map[int64]time.Time
}

func newRecorder() *recorder { return &recorder{done: map[int64]time.Time{}} }

func (r *recorder) mark(id int64) {
	now := time.Now()
	r.mu.Lock()
	r.done[id] = now
	r.mu.Unlock()
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.done)
}

func (r *recorder) Recorded(d dispatcher.Dispatch) {
	if d.State == effects.Confirmed {
		r.mark(d.EffectID)
	}
}
func (r *recorder) Rescued(effects.Rescued) {}
func (r *recorder) Reaped(int64)            {}

// startSidefx runs a dispatcher until the returned stop is called.
func startSidefx(pool *pgxpool.Pool, t sidefxTuning, obs dispatcher.Observer) (stop func() error, err error) {
	fake := providertest.New(providertest.Config{Name: "fake", Idempotent: true, MaxRecords: 1})
	d, err := dispatcher.New(pool, &dispatcher.Config{
		Kinds:      map[string]dispatcher.Kind{kind: {Provider: fake}},
		Workers:    t.workers,
		BatchSize:  t.batchSize,
		ClaimLoops: t.claimLoops,
		Logger:     logger,
		Observer:   obs,
	})
	if err != nil {
		return nil, err
	}
	return runUntilStopped(d), nil
}

// runUntilStopped runs d until the returned stop is called, which waits
// a minute at most for Run to return.
func runUntilStopped(d *dispatcher.Dispatcher) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	return func() error {
		cancel()
		select {
		case err := <-done:
			if err != nil && err != context.Canceled {
				return err
			}
			return nil
		case <-time.After(time.Minute):
			return fmt.Errorf("dispatcher did not stop within a minute")
		}
	}
}

// riverClient builds a River client; with t nil an insert-only one.
func riverClient(pool *pgxpool.Pool, t *riverTuning) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
	cfg := &river.Config{Workers: workers, Logger: logger}
	if t != nil {
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: t.maxWorkers}}
		cfg.FetchCooldown = t.fetchCooldown
		cfg.FetchPollInterval = t.pollInterval
	}
	return river.NewClient(riverpgxv5.New(pool), cfg)
}

// startRiver starts a working River client, which also inserts (so its
// inserts notify its own producer), calling onDone with each
// completed job's id once River has recorded it.
func startRiver(pool *pgxpool.Pool, t riverTuning, onDone func(int64)) (client *river.Client[pgx.Tx], stop func() error, err error) {
	client, err = riverClient(pool, &t)
	if err != nil {
		return nil, nil, err
	}
	var wg sync.WaitGroup
	unsubscribe := func() {}
	if onDone != nil {
		events, cancel := client.SubscribeConfig(&river.SubscribeConfig{Kinds: []river.EventKind{river.EventKindJobCompleted}, ChanSize: 200000})
		unsubscribe = cancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range events {
				onDone(ev.Job.ID)
			}
		}()
	}
	if err := client.Start(context.Background()); err != nil {
		unsubscribe()
		wg.Wait()
		return nil, nil, err
	}
	return client, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := client.Stop(ctx)
		unsubscribe()
		wg.Wait()
		return err
	}, nil
}
