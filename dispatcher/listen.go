package dispatcher

// This file holds the dispatcher's listening: the notifications that wake
// the claim loop and deliver pauses.

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/effects"
)

// serves reports whether kind is one of this dispatcher's.
func (d *Dispatcher) serves(kind string) bool {
	_, ok := d.byKind[kind]
	return ok
}

// listen wakes the claim loop on notifications of enqueued kinds it serves,
// reconnecting with backoff when its connection breaks.
func (d *Dispatcher) listen(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		err := d.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		failures++
		d.failed(opListen, err, slog.LevelWarn, "notification listener lost its connection; polling until it is back", "retry_in", errBackoff(failures))
		sleep(ctx, errBackoff(failures))
	}
}

func (d *Dispatcher) listenOnce(ctx context.Context) error {
	pool := d.pool
	if d.cfg.ListenPool != nil {
		pool = d.cfg.ListenPool
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack() // the connection is the listener's until it breaks
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn.Close(cctx) //nolint:errcheck // closing a connection we are done with
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{d.store.Channel()}.Sanitize()); err != nil {
		return err
	}
	d.succeeded(opListen)
	// Notifications sent while not listening were missed: effects that came
	// due, and pauses or resumes (read again, or a resume sent between
	// Run's first reading and this LISTEN would wait for a heartbeat).
	signal(d.wake)
	signal(d.pausesNow)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Payload == effects.PausesPayload {
			signal(d.pausesNow)
			continue
		}
		if d.serves(n.Payload) {
			signal(d.wake)
		}
	}
}
