package drift

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/schedule"
)

// Observer is told of every run this checker makes, for metrics.
type Observer interface {
	// Reported is called after each run with its report.
	Reported(Report)
}

// Config configures a Checker. Zero fields take the defaults stated.
type Config struct {
	// Schema holds side_effects and the drift tables. Default "public".
	Schema string
	// Rules are the checks. Rules that fail validation are refused, each
	// reported by NewChecker and as a failed Finding (Refused) in every
	// run; the others run.
	Rules []Rule
	// StatementTimeout bounds each statement of a rule's run, for the rules
	// that set none. Default DefaultStatementTimeout (30s).
	StatementTimeout time.Duration
	// Schedule is when to run: a 5-field cron spec or a descriptor such as
	// "@every 5m", as cron.ParseStandard reads it. @every schedules are
	// aligned to the clock (every 5m runs at :00, :05, …) so replicas agree
	// on the ticks. Default "@every 5m".
	Schedule string
	// PendingAfter is how long a pending effect must have been due (from
	// next_attempt_at: an effect scheduled for later, or backing off, is not
	// late) to count as stuck.
	// Default 1h.
	PendingAfter time.Duration
	// Retention is how long stored runs are kept. Default 720h.
	Retention time.Duration
	// AlertURL, if set, is an Alertmanager /api/v2/alerts endpoint that
	// receives firing and resolved alerts.
	AlertURL string
	// Runner names this process in stored runs. Default host-pid.
	Runner string
	// Logger receives findings (error level when non-zero). Default
	// slog.Default().
	Logger *slog.Logger
	// Observer is told of every run. Default none.
	Observer Observer
}

// Checker runs the drift rules on a schedule, once per tick across every
// replica that runs one, and stores, logs, exports and alerts on the
// findings.
type Checker struct {
	pool     *pgxpool.Pool
	cfg      Config // Rules: every rule, refused or not
	refused  map[string]error
	schema   string
	schedule cron.Schedule
	log      *slog.Logger
	alerts   *alerter
	mu       sync.Mutex // one run at a time in this process
}

// NewChecker validates cfg and the rules against the database. It returns
// the checker with the valid rules, and the refused rules' errors (each
// naming its rule); a refused rule never stops the others.
func NewChecker(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Checker, map[string]error, error) {
	if pool == nil || cfg == nil {
		return nil, nil, errors.New("new drift checker: pool and config are required")
	}
	c := *cfg
	schema, err := engine.CheckSchema(c.Schema)
	if err != nil {
		return nil, nil, fmt.Errorf("new drift checker: %w", err)
	}
	if c.Schedule == "" {
		c.Schedule = "@every 5m"
	}
	sched, err := ParseSchedule(c.Schedule)
	if err != nil {
		return nil, nil, fmt.Errorf("new drift checker: %w", err)
	}
	if c.PendingAfter == 0 {
		c.PendingAfter = time.Hour
	}
	if c.Retention == 0 {
		c.Retention = 30 * 24 * time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Runner == "" {
		c.Runner = defaultRunner()
	}
	if c.StatementTimeout < 0 {
		return nil, nil, fmt.Errorf("new drift checker: statement timeout %s is negative", c.StatementTimeout)
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = DefaultStatementTimeout
	}
	c.Rules = slices.Clone(c.Rules)
	for i := range c.Rules {
		if c.Rules[i].StatementTimeout == 0 {
			c.Rules[i].StatementTimeout = c.StatementTimeout
		}
	}
	refused := Validate(ctx, pool, c.Rules)
	ch := &Checker{pool: pool, cfg: c, refused: refused, schema: schema, schedule: sched, log: c.Logger.With("component", "drift")}
	for name, err := range refused {
		ch.log.Error("drift rule refused; the other rules run", "rule", name, "err", err)
	}
	if c.AlertURL != "" {
		ch.alerts = newAlerter(c.AlertURL, ch.log)
	}
	return ch, refused, nil
}

// Rules returns the rules the checker runs: those it did not refuse.
func (c *Checker) Rules() []Rule {
	var good []Rule
	for _, r := range c.cfg.Rules {
		if c.refused[r.Name] == nil {
			good = append(good, r)
		}
	}
	return good
}

// ParseSchedule reads a 5-field cron spec or a descriptor. An "@every D"
// schedule is aligned to multiples of D since the Unix epoch, so that every
// replica computes the same ticks (schedule.Parse).
func ParseSchedule(spec string) (cron.Schedule, error) {
	s, err := schedule.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("drift schedule %q: %w", spec, err)
	}
	return s, nil
}

// Start runs the schedule until ctx ends; the returned function stops it
// and waits for a run in progress.
func (c *Checker) Start(ctx context.Context) (stop func()) {
	return schedule.Start(ctx, c.schedule, func(ctx context.Context, tick time.Time) {
		if _, ran, err := c.run(ctx, tick); err != nil && ctx.Err() == nil {
			c.log.Error("drift run failed", "tick", tick, "err", err)
		} else if !ran {
			c.log.Debug("drift tick taken by another replica", "tick", tick)
			if who, held := c.job().HeldOff(ctx); who != "" {
				c.log.Warn("drift could not run: another session holds its lock", "holder", who, "held_for", held.Round(time.Second))
			}
		}
	})
}

// RunNow runs the rules once, now, whatever the schedule, and stores the
// run like a scheduled one.
func (c *Checker) RunNow(ctx context.Context) (Report, error) {
	rep, _, err := c.run(ctx, time.Time{})
	return rep, err
}

// run claims tick (zero: a run by hand, always run), runs the rules, stores
// and reports the findings. ran is false when another replica has the tick.
func (c *Checker) run(ctx context.Context, tick time.Time) (rep Report, ran bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if tick.IsZero() {
		// A run by hand only reads, beside a scheduled one if one is going
		// on: it takes no lease, which an operator's role may not take, and
		// records its run and findings when done, in one statement.
		started := time.Now()
		rep = run(ctx, c.pool, c.schema, c.cfg.Rules, c.refused, c.cfg.PendingAfter)
		id, err := saveByHand(ctx, c.pool, c.schema, c.cfg.Runner, started, rep)
		if err != nil {
			return rep, true, err
		}
		rep.RunID = id
	} else {
		id, end, ok, err := c.job().Begin(ctx, tick)
		if err != nil || !ok {
			return rep, false, err
		}
		defer end()
		rep = run(ctx, c.pool, c.schema, c.cfg.Rules, c.refused, c.cfg.PendingAfter)
		rep.RunID = id
		if err := save(ctx, c.pool, c.schema, id, rep); err != nil {
			return rep, true, err
		}
	}
	c.logReport(rep)
	if c.cfg.Observer != nil {
		c.cfg.Observer.Reported(rep)
	}
	if c.alerts != nil {
		c.alerts.notify(ctx, rep)
	}
	if _, err := c.job().Prune(ctx, time.Now().Add(-c.cfg.Retention)); err != nil {
		if pe, ok := engine.PgErrorOf(err); ok && pe.Code == "42501" {
			// An operator's run by hand: the daemon's runs prune.
			c.log.Debug("this role may not delete old drift runs; the daemon's scheduled runs prune them", "err", err)
		} else {
			c.log.Warn("pruning old drift runs failed", "err", err)
		}
	}
	return rep, true, nil
}

func (c *Checker) logReport(rep Report) {
	for _, f := range rep.Findings {
		switch {
		case f.Refused:
			c.log.Error("drift rule refused at start, not run", "rule", f.Rule, "err", f.Err)
		case f.Err != nil:
			c.log.Error("drift rule failed", "rule", f.Rule, "err", f.Err)
		default:
			if f.Problem != "" {
				c.log.Error("drift rule has a problem; its findings stand", "rule", f.Rule, "kind", f.Kind, "problem", f.Problem)
			}
			if f.Missing > 0 || f.Extra > 0 {
				c.log.Error("drift found effects missing or extra", "rule", f.Rule, "kind", f.Kind,
					"missing", f.Missing, "missing_sample", strings.Join(f.MissingIDs, ","),
					"extra", f.Extra, "extra_sample", strings.Join(f.ExtraIDs, ","))
			} else if f.Problem == "" {
				c.log.Info("drift rule clean", "rule", f.Rule, "kind", f.Kind, "took", f.Duration)
			}
		}
	}
	if rep.StuckErr != nil {
		c.log.Error("drift stuck check failed", "err", rep.StuckErr)
		return
	}
	reasons := rep.Stuck.Reasons()
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if reasons[k] > 0 {
			c.log.Error("effects stuck", "reason", k, "count", reasons[k])
		}
	}
}

// job is the drift job's runs and lock, for package schedule.
func (c *Checker) job() engine.Job {
	return engine.Job{Name: "drift", Pool: c.pool, Schema: c.schema, Runs: runsTable(c.schema), Runner: c.cfg.Runner}
}
