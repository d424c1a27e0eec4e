// Package schedule runs the daemon's periodic jobs (drift, reconciliation)
// on a cron schedule that every replica computes alike, so that a job's
// run can claim its tick once across replicas (engine.Job records the
// runs and holds the lock).
package schedule

import (
	"context"
	"errors"
	"time"

	"github.com/robfig/cron/v3"
)

// Parse reads a 5-field cron spec ("*/5 * * * *") or a descriptor
// ("@hourly", "@every 5m"). An "@every D" schedule is aligned to multiples
// of D since the Unix epoch: every replica computes the same ticks, whenever
// it started. A spec cron cannot read is an error, never a panic (cron
// panics on some malformed time zone prefixes).
func Parse(spec string) (s cron.Schedule, err error) {
	defer func() {
		if recover() != nil {
			s, err = nil, errors.New("malformed time zone prefix")
		}
	}()
	s, err = cron.ParseStandard(spec)
	if err != nil {
		return nil, err
	}
	if every, ok := s.(cron.ConstantDelaySchedule); ok {
		return alignedEvery(every.Delay), nil
	}
	return s, nil
}

type alignedEvery time.Duration

func (a alignedEvery) Next(t time.Time) time.Time {
	d := time.Duration(a)
	return t.Truncate(d).Add(d)
}

// Start calls run with each tick of s, from the next one, until ctx ends;
// the returned function stops it and waits for a run in progress. A run
// that outlasts ticks makes them pass: the next run is at the next tick
// after it ends.
func Start(ctx context.Context, s cron.Schedule, run func(ctx context.Context, tick time.Time)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		next := s.Next(time.Now())
		for {
			t := time.NewTimer(time.Until(next))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			tick := next
			next = s.Next(time.Now())
			run(ctx, tick)
		}
	}()
	return func() { cancel(); <-done }
}
