package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sidefx/sidefx/internal/engine"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/sidefx/sidefx/internal/lab/pgcluster"
	"github.com/sidefx/sidefx/outbox"
)

const drainTimeout = 10 * time.Minute

// ---- Workload 1: enqueue inside a business transaction ----

// enqueuer runs one business transaction of batch business rows and, unless
// it is the baseline, batch effects or jobs.
type enqueuer func(ctx context.Context, tx pgx.Tx, producer, seq, batch int) error

func insertOrders(ctx context.Context, tx pgx.Tx, batch int) error {
	var err error
	if batch == 1 {
		_, err = tx.Exec(ctx, `INSERT INTO orders (customer, amount) VALUES ($1, $2)`, "c-42", 4200)
	} else {
		_, err = tx.Exec(ctx, `INSERT INTO orders (customer, amount) SELECT $1, $2 FROM generate_series(1, $3)`, "c-42", 4200, batch)
	}
	return err
}

func sourceID(producer, seq, i int) string { return fmt.Sprintf("p%d-%d-%d", producer, seq, i) }

// baselineEnqueuer writes the business rows alone.
func baselineEnqueuer(ctx context.Context, tx pgx.Tx, _, _, batch int) error {
	return insertOrders(ctx, tx, batch)
}

// sidefxEnqueuer writes the business rows and enqueues one effect for each.
func sidefxEnqueuer(ctx context.Context, tx pgx.Tx, p, seq, batch int) error {
	if err := insertOrders(ctx, tx, batch); err != nil {
		return err
	}
	if batch == 1 {
		id := sourceID(p, seq, 0)
		_, err := outbox.Enqueue(ctx, tx, outbox.Effect{SourceID: id, Kind: kind, Payload: payload{SourceID: id, Amount: 4200, Currency: "eur"}})
		return err
	}
	es := make([]outbox.Effect, batch)
	for i := range es {
		id := sourceID(p, seq, i)
		es[i] = outbox.Effect{SourceID: id, Kind: kind, Payload: payload{SourceID: id, Amount: 4200, Currency: "eur"}}
	}
	_, err := outbox.EnqueueMany(ctx, tx, es)
	return err
}

func (e *env) enqueueAll(ctx context.Context) error {
	type contender struct {
		col, tmpl string
		fn        func(pool *pgxpool.Pool) (enqueuer, error)
	}
	baseline := func(*pgxpool.Pool) (enqueuer, error) { return baselineEnqueuer, nil }
	sfx := func(*pgxpool.Pool) (enqueuer, error) { return sidefxEnqueuer, nil }
	riv := func(unique bool) func(pool *pgxpool.Pool) (enqueuer, error) {
		return func(pool *pgxpool.Pool) (enqueuer, error) {
			client, err := riverClient(pool, nil)
			if err != nil {
				return nil, err
			}
			var opts *river.InsertOpts
			if unique {
				opts = &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
			}
			return func(ctx context.Context, tx pgx.Tx, p, seq, batch int) error {
				if err := insertOrders(ctx, tx, batch); err != nil {
					return err
				}
				if batch == 1 {
					id := sourceID(p, seq, 0)
					_, err := client.InsertTx(ctx, tx, payload{SourceID: id, Amount: 4200, Currency: "eur"}, opts)
					return err
				}
				ps := make([]river.InsertManyParams, batch)
				for i := range ps {
					id := sourceID(p, seq, i)
					ps[i] = river.InsertManyParams{Args: payload{SourceID: id, Amount: 4200, Currency: "eur"}, InsertOpts: opts}
				}
				_, err := client.InsertManyTx(ctx, tx, ps)
				return err
			}, nil
		}
	}
	contenders := []contender{
		{colFloor, tmplPlain, baseline},
		{colSidefx, e.sidefxTemplate(), sfx},
		{colRiver, tmplRiver, riv(false)},
		{colRiverU, tmplRiver, riv(true)},
	}
	if e.child {
		contenders = contenders[1:2]
	}
	shapes := []struct{ producers, batch int }{{1, 1}, {8, 1}, {1, 100}, {8, 100}}
	if e.o.shape != "" { // a --against child measures the shape it is given
		var p, b int
		if _, err := fmt.Sscanf(e.o.shape, "%d,%d", &p, &b); err != nil {
			return fmt.Errorf("--shape %q: %w", e.o.shape, err)
		}
		shapes = []struct{ producers, batch int }{{p, b}}
	}
	dur := time.Duration(e.o.enqueueSeconds * float64(time.Second))
	for run := 1; run <= e.o.runs; run++ {
		for _, sh := range shapes {
			variant := enqueueVariant(sh.producers)
			unit := "tx/s"
			if sh.batch > 1 {
				variant = fmt.Sprintf("%d producer(s), %d rows + %d effects per tx", sh.producers, sh.batch, sh.batch)
				unit = "effects/s"
			}
			e.t.row("1. enqueue", variant, unit).perTx = float64(sh.batch * sh.producers)
			for _, c := range contenders {
				if c.col == colSidefx {
					if err := e.rev.measure(ctx, e, "enqueue", fmt.Sprintf("%d,%d", sh.producers, sh.batch)); err != nil {
						return err
					}
				}
				pool, db, drop, err := e.fresh(ctx, c.tmpl)
				if err != nil {
					return err
				}
				if c.col == colSidefx { // its producers enqueue as the producer role
					producer, _, done, err := e.sidefxPools(ctx, db, pool)
					if err != nil {
						drop()
						return err
					}
					pool = producer
					prev := drop
					drop = func() { done(); prev() }
				}
				if err := e.label(ctx, pool, fmt.Sprintf("%s, %d×%d", c.col, sh.producers, sh.batch)); err != nil {
					drop()
					return err
				}
				fn, err := c.fn(pool)
				if err == nil {
					var rate float64
					rate, err = enqueueRate(ctx, pool, fn, sh.producers, sh.batch, dur)
					if err == nil {
						e.t.add("1. enqueue", variant, unit, c.col, rate)
					}
				}
				drop()
				if err != nil {
					return fmt.Errorf("enqueue %s: %w", c.col, err)
				}
			}
		}
	}
	return nil
}

// enqueueVariant names workload 1's row of one effect per transaction.
func enqueueVariant(producers int) string {
	return fmt.Sprintf("%d producer(s), 1 effect per tx", producers)
}

// enqueueRate runs producers loops of business transactions for dur and
// returns the committed effects (business rows for the baseline) per second.
func enqueueRate(ctx context.Context, pool *pgxpool.Pool, fn enqueuer, producers, batch int, dur time.Duration) (float64, error) {
	var committed atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	began := time.Now()
	end := began.Add(dur)
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; time.Now().Before(end); seq++ {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fn(ctx, tx, p, seq, batch) })
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				committed.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(committed.Load()*int64(batch)) / time.Since(began).Seconds(), nil
}

// ---- Workload 2: drain ----

func (e *env) drainAll(ctx context.Context) error {
	sfx, riv := []sidefxTuning{sidefxDefault, sidefxTuned}, []riverTuning{riverDefault, riverTuned}
	if e.o.tune {
		sfx, riv = append(sfx, sidefxCandidates...), append(riv, riverCands...)
	}
	n := e.o.drainN
	unit := "effects/s"
	if e.child {
		riv = nil
	}
	for run := 1; run <= e.o.runs; run++ {
		if err := e.rev.measure(ctx, e, "drain", ""); err != nil {
			return err
		}
		for i, t := range sfx {
			rate, err := e.drainSidefx(ctx, nil, t, n)
			if err != nil {
				return err
			}
			e.t.add("2. drain", drainVariant(i, t.name), unit, colSidefx, rate)
		}
		for i, t := range riv {
			rate, err := e.drainRiver(ctx, nil, t, n)
			if err != nil {
				return err
			}
			e.t.add("2. drain", drainVariant(i, t.name), unit, colRiver, rate)
		}
		for i, fl := range []floorTuning{floorDefault, floorTuned} {
			if e.child {
				break
			}
			rate, err := e.floor(ctx, nil, fl, n)
			if err != nil {
				return err
			}
			e.t.add("2. drain", drainVariant(i, ""), unit, colFloor, rate)
		}
	}
	return nil
}

// drainVariant names the drain rows by their index, so each contender's
// default shares a row, and so does each one's best settings.
func drainVariant(i int, name string) string {
	switch i {
	case 0:
		return "default settings"
	case 1:
		return "best settings found"
	}
	return "candidate: " + name
}

// drainSidefx loads n pending effects into pool (a fresh database when nil)
// and times a dispatcher confirming them all.
func (e *env) drainSidefx(ctx context.Context, pool *pgxpool.Pool, t sidefxTuning, n int) (float64, error) {
	return e.drainSidefxOpen(ctx, pool, t, n, sidefxOpen)
}

// drainSidefxOpen is drainSidefx ending when the count query open, of the
// effects still to drain, reads 0.
func (e *env) drainSidefxOpen(ctx context.Context, pool *pgxpool.Pool, t sidefxTuning, n int, open string) (float64, error) {
	daemon := pool
	if pool == nil {
		p, db, drop, err := e.fresh(ctx, e.sidefxTemplate())
		if err != nil {
			return 0, err
		}
		defer drop()
		pool = p
		_, d, done, err := e.sidefxPools(ctx, db, pool)
		if err != nil {
			return 0, err
		}
		defer done()
		daemon = d
	}
	e.seq++
	if err := loadSidefx(ctx, pool, fmt.Sprintf("d%d", e.seq), n); err != nil {
		return 0, err
	}
	if err := prepare(ctx, pool, "side_effects"); err != nil {
		return 0, err
	}
	rec := newRecorder()
	began := time.Now()
	stop, err := startSidefx(daemon, t, rec)
	if err != nil {
		return 0, err
	}
	err = waitDone(ctx, func() int64 { return int64(rec.count()) }, int64(n), drainTimeout)
	if err == nil { // what the dispatcher reported recorded is in the table
		err = waitZero(ctx, pool, open, drainTimeout)
	}
	elapsed := time.Since(began)
	if serr := stop(); err == nil {
		err = serr
	}
	if err != nil {
		return 0, fmt.Errorf("sidefx drain %s: %w", t.name, err)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// drainRiver is drainSidefx for River.
func (e *env) drainRiver(ctx context.Context, pool *pgxpool.Pool, t riverTuning, n int) (float64, error) {
	if pool == nil {
		p, _, drop, err := e.fresh(ctx, tmplRiver)
		if err != nil {
			return 0, err
		}
		defer drop()
		pool = p
	}
	e.seq++
	if err := loadRiver(ctx, pool, fmt.Sprintf("d%d", e.seq), n); err != nil {
		return 0, err
	}
	if err := prepare(ctx, pool, "river_job"); err != nil {
		return 0, err
	}
	var done atomic.Int64
	began := time.Now()
	_, stop, err := startRiver(pool, t, func(int64) { done.Add(1) })
	if err != nil {
		return 0, err
	}
	err = waitDone(ctx, done.Load, int64(n), drainTimeout)
	if err == nil {
		err = waitZero(ctx, pool, riverOpen, drainTimeout)
	}
	elapsed := time.Since(began)
	if serr := stop(); err == nil {
		err = serr
	}
	if err != nil {
		return 0, fmt.Errorf("river drain %s: %w", t.name, err)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// ---- Workload 5: the floor ----

// floorTuning is a pgbench run: clients each looping claim then record.
type floorTuning struct{ clients, batch int }

var (
	floorDefault = floorTuning{clients: 1, batch: 200}
	floorTuned   = floorTuning{clients: 4, batch: 500}
)

// floorScript is sidefx's own claim statement followed by its batched
// outcome statement (engine.Engine.DispatchSQL, so the floor runs exactly
// what the dispatcher runs), each committed on its own as the dispatcher
// does, with no provider call between them. The claim hands the claimed ids
// and attempts to the outcome statement through pgbench variables, as
// arrays; the statements' parameters become pgbench expressions.
func floorScript() (string, error) {
	eng, err := engine.New(nil, "")
	if err != nil {
		return "", err
	}
	claim, complete := eng.DispatchSQL()
	claim = strings.NewReplacer(
		"$1::text[]", "'{bench.noop}'::text[]",
		"$2", ":batch",
		"$3", "60000",
		"$4", "'pgbench'",
		"$5::bigint[]", "'{0}'::bigint[]", // the kind's key window: none
		"$6::bigint[]", "'{60000}'::bigint[]", // its call's margin: the lease
		"$7::bigint", "16777216::bigint", // the claim's bytes: the default budget
	).Replace(claim)
	complete = strings.NewReplacer(
		"$1::bigint[]", "':ids'::bigint[]",
		"$2::integer[]", "':atts'::integer[]",
		"$3::text[]", "array_fill('confirmed'::text, ARRAY[:n])",
		"$4::text[]", "array_fill('fake_ref'::text, ARRAY[:n])",
		"$5::text[]", "array_fill(NULL::text, ARRAY[:n])",
		"$6::text[]", "array_fill(NULL::text, ARRAY[:n])",
		"$7::bigint[]", "array_fill(0::bigint, ARRAY[:n])",
		// Evidence and key windows: a definite answer (not maybe
		// performed) from a provider that honours keys (it settles every
		// attempt), no key window, the lease as the margin.
		"$8::boolean[]", "array_fill(false, ARRAY[:n])",
		"$9::boolean[]", "array_fill(true, ARRAY[:n])",
		"$10::bigint[]", "array_fill(0::bigint, ARRAY[:n])",
		"$11::bigint[]", "array_fill(60000::bigint, ARRAY[:n])",
		// Nobody awaits the outcome: no notification.
		"$12::text", "'sidefx_outcome_public'",
		"$13::boolean[]", "array_fill(false, ARRAY[:n])",
	).Replace(complete)
	if strings.Contains(claim+complete, "$") {
		return "", fmt.Errorf("floor script: a parameter of sidefx's statements was not replaced:\n%s\n%s", claim, complete)
	}
	// pgbench runs one statement per line: fold each onto one line.
	oneLine := func(q string) string { return strings.Join(strings.Fields(q), " ") }
	return "WITH u AS (" + oneLine(claim) + ") SELECT coalesce(array_agg(id), '{}')::text AS ids, " +
		"coalesce(array_agg(attempts), '{}')::text AS atts, count(*) AS n FROM u\n\\gset\n" +
		oneLine(complete) + ";\n", nil
}

// floor loads n pending effects and times pgbench draining them with the
// floor script.
func (e *env) floor(ctx context.Context, pool *pgxpool.Pool, fl floorTuning, n int) (float64, error) {
	db := ""
	if pool == nil {
		p, name, drop, err := e.fresh(ctx, tmplSidefx)
		if err != nil {
			return 0, err
		}
		defer drop()
		pool, db = p, name
	} else {
		db = pool.Config().ConnConfig.Database
	}
	e.seq++
	if err := loadSidefx(ctx, pool, fmt.Sprintf("f%d", e.seq), n); err != nil {
		return 0, err
	}
	if err := prepare(ctx, pool, "side_effects"); err != nil {
		return 0, err
	}
	bin, err := pgcluster.FindBinaries()
	if err != nil {
		return 0, err
	}
	script := filepath.Join(os.TempDir(), fmt.Sprintf("sidefx-bench-floor-%d.sql", os.Getpid()))
	text, err := floorScript()
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(script, []byte(text), 0o644); err != nil {
		return 0, err
	}
	defer os.Remove(script)
	perClient := (n + fl.batch*fl.clients - 1) / (fl.batch * fl.clients)
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pgbench"), "-n", "-h", "127.0.0.1",
		"-p", strconv.Itoa(e.c.Port()), "-U", "postgres",
		"-c", strconv.Itoa(fl.clients), "-j", strconv.Itoa(fl.clients),
		"-t", strconv.Itoa(perClient+1), "-D", "batch="+strconv.Itoa(fl.batch), "-f", script, db)
	began := time.Now()
	out, err := cmd.CombinedOutput()
	elapsed := time.Since(began)
	if err != nil {
		return 0, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	var open int64
	if err := pool.QueryRow(ctx, sidefxOpen).Scan(&open); err != nil {
		return 0, err
	}
	if open != 0 {
		return 0, fmt.Errorf("pgbench left %d effects open:\n%s", open, out)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// ---- Workload 3: latency ----

func (e *env) latencyAll(ctx context.Context) error {
	for run := 1; run <= e.o.runs; run++ {
		if err := e.rev.measure(ctx, e, "latency", ""); err != nil {
			return err
		}
		if err := e.latencyRun(ctx, nil, nil, "3. latency"); err != nil {
			return err
		}
		if err := e.latencyRun(ctx, nil, nil, longTxWorkload); err != nil {
			return err
		}
	}
	return nil
}

// longTxWorkload is the latency workload with one more producer holding a
// transaction open for the whole run, which enqueued its effect first: no
// other effect may wait for it (with the notification scheme of migration
// 0004, it held its kind's notification lock, and every other effect
// waited for the poll).
const longTxWorkload = "3. latency, one long transaction open"

// latencyRun measures both contenders once, in fresh databases unless
// sfxPool and rivPool are given.
func (e *env) latencyRun(ctx context.Context, sfxPool, rivPool *pgxpool.Pool, workload string) error {
	cols := []string{colSidefx, colRiver}
	if e.child {
		cols = cols[:1]
	}
	for _, col := range cols {
		pool, tmpl := sfxPool, e.sidefxTemplate()
		if col == colRiver {
			pool, tmpl = rivPool, tmplRiver
		}
		if pool == nil {
			p, _, drop, err := e.fresh(ctx, tmpl)
			if err != nil {
				return err
			}
			defer drop()
			pool = p
		}
		lat, err := e.latency(ctx, pool, col, workload == longTxWorkload)
		if err != nil {
			return fmt.Errorf("latency %s: %w", col, err)
		}
		variant := fmt.Sprintf("%d/s for %d s, default settings", e.o.latencyRate, e.o.latencySeconds)
		e.t.add(workload, variant, "p50 ms", col, lat[0])
		e.t.add(workload, variant, "p99 ms", col, lat[1])
		e.t.add(workload, variant, "max ms", col, lat[2])
	}
	return nil
}

// latency enqueues at the fixed rate, each item in its own business
// transaction, and returns p50, p99 and max in milliseconds from the moment
// an item was due to be enqueued to the moment its outcome was recorded.
//
// With longTx, one more transaction enqueues its item before the run starts
// and commits only after the last item was released; its own latency is
// not counted.
func (e *env) latency(ctx context.Context, pool *pgxpool.Pool, col string, longTx bool) ([3]float64, error) {
	rec := newRecorder()
	var stop func() error
	var err error
	var client *river.Client[pgx.Tx]
	producers := pool // the pool the producers' transactions run on
	if col == colSidefx {
		var daemon *pgxpool.Pool
		var done func()
		producers, daemon, done, err = e.sidefxPools(ctx, pool.Config().ConnConfig.Database, pool)
		if err != nil {
			return [3]float64{}, err
		}
		defer done()
		stop, err = startSidefx(daemon, sidefxDefault, rec)
	} else {
		client, stop, err = startRiver(pool, riverDefault, rec.mark)
	}
	if err != nil {
		return [3]float64{}, err
	}
	defer func() {
		if err := stop(); err != nil {
			logf("stop: %v", err)
		}
	}()
	e.seq++
	prefix := fmt.Sprintf("l%d", e.seq)
	enqueueOne := func(tx pgx.Tx, id string) (int64, error) {
		if err := insertOrders(ctx, tx, 1); err != nil {
			return 0, err
		}
		p := payload{SourceID: id, Amount: 4200, Currency: "eur"}
		if col == colSidefx {
			res, err := outbox.Enqueue(ctx, tx, outbox.Effect{SourceID: id, Kind: kind, Payload: p})
			return res.ID, err
		}
		res, err := client.InsertTx(ctx, tx, p, nil)
		if err != nil {
			return 0, err
		}
		return res.Job.ID, nil
	}
	// One item first, waited for: the run measures a contender that is
	// running, not its start-up (which put every run's slowest item at its
	// first instant).
	if err := pgx.BeginFunc(ctx, producers, func(tx pgx.Tx) error {
		_, err := enqueueOne(tx, prefix+"-warm")
		return err
	}); err != nil {
		return [3]float64{}, fmt.Errorf("the first item: %w", err)
	}
	if err := waitUntil(ctx, time.Minute, func() bool { return rec.count() >= 1 }); err != nil {
		return [3]float64{}, fmt.Errorf("the first item: %w", err)
	}
	extra := 1 // items recorded but not counted: the first, and the long transaction's
	var long pgx.Tx
	if longTx {
		if long, err = producers.Begin(ctx); err != nil {
			return [3]float64{}, err
		}
		defer long.Rollback(ctx) //nolint:errcheck // committed below; a rollback after that is a no-op
		if _, err := enqueueOne(long, prefix+"-long"); err != nil {
			return [3]float64{}, fmt.Errorf("the long transaction: %w", err)
		}
		extra++
	}

	type item struct {
		seq int
		due time.Time
	}
	var mu sync.Mutex
	due := map[int64]time.Time{}
	items := make(chan item, 1<<16)
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range items {
				id := fmt.Sprintf("%s-%d", prefix, it.seq)
				var got int64
				err := pgx.BeginFunc(ctx, producers, func(tx pgx.Tx) (err error) {
					got, err = enqueueOne(tx, id)
					return err
				})
				if err != nil {
					once.Do(func() { firstErr = err })
					continue
				}
				mu.Lock()
				due[got] = it.due
				mu.Unlock()
			}
		}()
	}
	// The pacer releases each item at the time it is due, stamped with that
	// time, so a producer falling behind counts against the latency. (It
	// released a hundredth of a second's items every 10 ms until 2026-12:
	// half a tick, 5 ms, of each p50 was the pacer's.)
	total := e.o.latencyRate * e.o.latencySeconds
	began := time.Now()
	dueAt := func(i int) time.Time {
		return began.Add(time.Duration(float64(i) / float64(e.o.latencyRate) * float64(time.Second)))
	}
	timer := time.NewTimer(0)
	<-timer.C
	for sent := 0; sent < total; {
		if wait := time.Until(dueAt(sent)); wait > 0 {
			timer.Reset(wait)
			<-timer.C
		}
		for now := time.Now(); sent < total && !dueAt(sent).After(now); sent++ {
			items <- item{seq: sent, due: dueAt(sent)}
		}
	}
	close(items)
	wg.Wait()
	if firstErr != nil {
		return [3]float64{}, firstErr
	}
	if long != nil {
		if err := long.Commit(ctx); err != nil {
			return [3]float64{}, fmt.Errorf("commit the long transaction: %w", err)
		}
	}
	if err := waitUntil(ctx, 2*time.Minute, func() bool { return rec.count() >= total+extra }); err != nil {
		return [3]float64{}, fmt.Errorf("%d of %d recorded: %w", rec.count(), total, err)
	}
	if col == colSidefx {
		logBreakdown(ctx, pool, prefix)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	ls := make([]float64, 0, total)
	var worstDue time.Time
	worst := -1.0
	slow := 0 // items over a second
	for id, d := range due {
		if t, ok := rec.done[id]; ok {
			l := float64(t.Sub(d)) / float64(time.Millisecond)
			if l > worst {
				worst, worstDue = l, d
			}
			if l > 1000 {
				slow++
			}
			ls = append(ls, l)
		}
	}
	if len(ls) != total {
		return [3]float64{}, fmt.Errorf("%d latencies for %d items", len(ls), total)
	}
	// Where in the run the tail was: at the start (a contender's start-up),
	// or in the middle (a stall).
	logf("  %s: the slowest item was due %.1f s into the run; %d items over 1 s", col, worstDue.Sub(began).Seconds(), slow)
	slices.Sort(ls)
	pct := func(p float64) float64 { return ls[min(len(ls)-1, int(math.Ceil(p*float64(len(ls))))-1)] }
	return [3]float64{pct(0.5), pct(0.99), ls[len(ls)-1]}, nil
}

// logBreakdown logs where the run's effects spent their time, by the
// server's clock: from the producer's transaction's start to the claim's,
// and from the claim's to the outcome's (p50 and p99, in ms).
func logBreakdown(ctx context.Context, pool *pgxpool.Pool, prefix string) {
	var out string
	err := pool.QueryRow(ctx, `
		SELECT format('created→claimed p50 %s p99 %s; claimed→recorded p50 %s p99 %s (ms, by the server clock)',
		  round(percentile_cont(0.5) WITHIN GROUP (ORDER BY c)::numeric, 2), round(percentile_cont(0.99) WITHIN GROUP (ORDER BY c)::numeric, 2),
		  round(percentile_cont(0.5) WITHIN GROUP (ORDER BY r)::numeric, 2), round(percentile_cont(0.99) WITHIN GROUP (ORDER BY r)::numeric, 2))
		FROM (SELECT extract(epoch FROM first_fired_at - created_at) * 1000 AS c, extract(epoch FROM confirmed_at - first_fired_at) * 1000 AS r
		      FROM side_effects WHERE source_id LIKE $1 || '-%' AND state = 'confirmed') AS t`, prefix).Scan(&out)
	if err != nil {
		logf("  sidefx: breakdown: %v", err)
		return
	}
	logf("  sidefx: %s", out)
}

// ---- Workload 4: history ----

func (e *env) historyAll(ctx context.Context) error {
	h := e.o.history
	if h <= 0 {
		return nil
	}
	sfxPool, _, dropS, err := e.fresh(ctx, tmplSidefx)
	if err != nil {
		return err
	}
	defer dropS()
	rivPool, _, dropR, err := e.fresh(ctx, tmplRiver)
	if err != nil {
		return err
	}
	defer dropR()
	began := time.Now()
	// Half the history is tombstones (reaped: payload dropped), as a
	// deployment's history is once the reaper has run.
	if err := bulkLoad(ctx, sfxPool, "side_effects", `INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash,
			state, attempts, provider_ref, created_at, fired_at, first_fired_at, confirmed_at, updated_at, reaped_at)
		SELECT 'h-' || i, $2, sidefx_key(s.namespace, 'h-' || i, $2),
			CASE WHEN i % 2 = 1 THEN '{"amount": 4200, "currency": "eur"}'::jsonb END,
			sha256(convert_to('{"amount": 4200, "currency": "eur"}', 'UTF8')),
			'confirmed', 1, 'fake_ref', now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',
			now() - interval '1 day', now() - interval '1 day', CASE WHEN i % 2 = 0 THEN now() - interval '1 hour' END
		FROM generate_series(1, $1) i, sidefx_settings s`, h, kind); err != nil {
		return fmt.Errorf("preload side_effects: %w", err)
	}
	if err := prepare(ctx, sfxPool, "side_effects"); err != nil {
		return err
	}
	logf("  preloaded %d confirmed effects (half of them tombstones) in %s", h, time.Since(began).Round(time.Millisecond))
	began = time.Now()
	if err := bulkLoad(ctx, rivPool, "river_job", `INSERT INTO river_job (args, attempt, attempted_at, attempted_by, created_at,
			finalized_at, kind, max_attempts, priority, queue, state, scheduled_at)
		SELECT jsonb_build_object('source_id', 'h-' || i, 'amount', 4200, 'currency', 'eur'), 1,
			now() - interval '1 day', '{bench}', now() - interval '1 day', now() - interval '1 day',
			$2, 25, 1, 'default', 'completed', now() - interval '1 day'
		FROM generate_series(1, $1) i`, h, kind); err != nil {
		return fmt.Errorf("preload river_job: %w", err)
	}
	if err := prepare(ctx, rivPool, "river_job"); err != nil {
		return err
	}
	logf("  preloaded %d completed jobs in %s", h, time.Since(began).Round(time.Millisecond))
	workload := fmt.Sprintf("4. history (%d terminal rows)", h)
	for run := 1; run <= e.o.runs; run++ {
		rate, err := e.drainSidefx(ctx, sfxPool, sidefxTuned, e.o.drainN)
		if err != nil {
			return err
		}
		e.t.add(workload, "drain, best settings found", "effects/s", colSidefx, rate)
		if rate, err = e.drainRiver(ctx, rivPool, riverTuned, e.o.drainN); err != nil {
			return err
		}
		e.t.add(workload, "drain, best settings found", "effects/s", colRiver, rate)
		if rate, err = e.floor(ctx, sfxPool, floorTuned, e.o.drainN); err != nil {
			return err
		}
		e.t.add(workload, "drain, best settings found", "effects/s", colFloor, rate)
		// The drains' dead rows are vacuumed first, as before every timed
		// measurement, so neither contender's latency pays for them.
		if err := prepare(ctx, sfxPool, "side_effects"); err != nil {
			return err
		}
		if err := prepare(ctx, rivPool, "river_job"); err != nil {
			return err
		}
		if err := e.latencyRun(ctx, sfxPool, rivPool, workload); err != nil {
			return err
		}
	}
	return nil
}
