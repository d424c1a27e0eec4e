package dispatcher

// This file holds what the dispatcher does about the server it talks to:
// each connection's server is read once, before its first claim; a server
// other than the last one claims were made on (a failover, a promotion)
// stops the claims until the dispatcher has recorded every answer it
// holds, recorded again what it recorded lately (the new primary may lack
// it), and said which timeline it is on (engine.TimelineSeen), which holds
// the kinds without keys after a promotion unless this dispatcher alone
// can have claimed them.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// serverKey names a connection's server in its custom data.
const serverKey = "sidefx.server"

// errDemoted: a connection reaches a server on an older timeline than
// claims were made on.
var errDemoted = errors.New("a demoted primary? No effect is claimed on a server on an older timeline")

// errResync: the claim was not made; the dispatcher is moving to another
// server.
var errResync = errors.New("the database server changed: claims wait until the answers held are recorded")

// Memory of recorded outcomes, replayed after a failover: the new primary
// may lack what the old one committed last (asynchronous replication).
const (
	memoryFor     = time.Minute
	memoryEntries = 200_000
	memoryBytes   = 16 << 20
	// memoryDetail is the largest answer kept; a larger one is replayed
	// without it (its reference and state are kept).
	memoryDetail = 4 << 10
)

// memory holds the outcomes recorded in the last memoryFor.
type memory struct {
	mu      sync.Mutex
	entries []remembered // from head on: those before it are dropped
	head    int
	bytes   int
	// forgot is when the newest outcome dropped for room was recorded:
	// what was recorded after it is all here.
	forgot time.Time
}

type remembered struct {
	at   time.Time
	out  engine.Outcome
	kind string
}

func (m *memory) add(now time.Time, outs []engine.Outcome, kinds []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, o := range outs {
		if len(o.Detail) > memoryDetail {
			o.Detail = nil
		}
		r := remembered{now, o, kinds[i]}
		m.entries = append(m.entries, r)
		m.bytes += r.cost()
	}
	m.trim(now)
}

// cost is what r counts against memoryBytes.
func (r *remembered) cost() int {
	return len(r.out.Detail) + len(r.out.ProviderRef) + len(r.out.Error) + 128
}

// trim drops what is older than memoryFor, and the oldest beyond the
// bounds. The entries kept move to the front only once the dropped are
// half of them: a trim costs what it drops, not what it keeps.
func (m *memory) trim(now time.Time) {
	for m.head < len(m.entries) && (now.Sub(m.entries[m.head].at) > memoryFor ||
		len(m.entries)-m.head > memoryEntries || m.bytes > memoryBytes) {
		e := &m.entries[m.head]
		m.bytes -= e.cost()
		if now.Sub(e.at) <= memoryFor && e.at.After(m.forgot) {
			m.forgot = e.at // dropped for room, not for age
		}
		*e = remembered{} // its answer's bytes go now
		m.head++
	}
	if m.head > 0 && m.head >= len(m.entries)/2 {
		n := copy(m.entries, m.entries[m.head:])
		clear(m.entries[n:])
		m.entries, m.head = m.entries[:n], 0
	}
}

// recent returns the outcomes remembered, and whether the memory holds
// every outcome recorded after since.
func (m *memory) recent(now, since time.Time) ([]remembered, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.trim(now)
	outs := slices.Clone(m.entries[m.head:])
	covers := !since.IsZero() && m.forgot.Before(since) && now.Sub(since) < memoryFor
	return outs, covers
}

// server is the server claims are made on, and whether a change of it is
// being handled.
type server struct {
	mu sync.Mutex
	// of reads a connection's server: engine.ServerOf, but in tests.
	of     func(context.Context, engine.DB) (engine.Server, error)
	known  engine.Server // zero until the first check
	next   engine.Server // the server moved to, while resync
	resync bool
	kick   chan struct{}
}

// claimOn makes claim p on one connection of the pool, after checking, the
// first time the connection is used, which server it talks to.
func (d *Dispatcher) claimOn(ctx context.Context, p engine.ClaimParams) ([]*effects.Effect, error) {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	if same, err := d.checkServer(ctx, conn); err != nil {
		return nil, err
	} else if !same {
		return nil, errResync
	}
	return d.engine.WithDB(conn).Claim(ctx, p)
}

// checkServer reports whether conn talks to the server claims are made
// on; if not, it starts the move to conn's server.
func (d *Dispatcher) checkServer(ctx context.Context, conn *pgxpool.Conn) (bool, error) {
	data := conn.Conn().PgConn().CustomData()
	srv, ok := data[serverKey].(engine.Server)
	if !ok {
		var err error
		srv, err = d.serverOf(ctx, conn)
		if err != nil {
			return false, err
		}
		data[serverKey] = srv
	}
	d.srv.mu.Lock()
	if known := d.srv.known; known.System == srv.System && srv.Timeline < known.Timeline {
		d.srv.mu.Unlock()
		// A demoted primary, writable again (its data never saw the
		// newer timeline): claiming there would make a second history.
		return false, fmt.Errorf("%w: system %s is on timeline %d here, and claims were made on timeline %d", errDemoted, srv.System, srv.Timeline, known.Timeline)
	}
	same := !d.srv.resync && d.srv.known.Same(srv)
	if !same && !d.srv.resync {
		d.srv.resync, d.srv.next = true, srv
		signal(d.srv.kick)
	}
	changed := same && d.srv.known.Sync != srv.Sync
	was := d.srv.known.Sync
	if changed {
		d.srv.known.Sync = srv.Sync
	}
	d.srv.mu.Unlock()
	if changed {
		// Commits on this timeline wait, or no longer wait, for a
		// synchronous standby: a promotion from it holds the kinds
		// without keys only when they did not.
		if _, err := d.engine.WithDB(conn).TimelineSeen(ctx, srv, nil, d.cfg.WorkerID); err != nil {
			d.srv.mu.Lock()
			d.srv.known.Sync = was // said again at the next check
			d.srv.mu.Unlock()
			return false, err
		}
	}
	return same, nil
}

// pollServer checks a connection of the pool: a dispatcher with nothing
// to claim learns of a failover too, and records again what the new
// primary lacks.
func (d *Dispatcher) pollServer(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
	defer cancel()
	conn, err := d.pool.Acquire(cctx)
	if err != nil {
		return // the claims and the heartbeat say so
	}
	defer conn.Release()
	// Whether commits wait for a synchronous standby is read again (an HA
	// manager turns it off while the standby is away, and on again): the
	// server of the connection stays.
	if srv, ok := conn.Conn().PgConn().CustomData()[serverKey].(engine.Server); ok {
		var sync bool
		if err := conn.QueryRow(cctx, engine.SyncSQL).Scan(&sync); err != nil {
			return
		}
		srv.Sync = sync
		conn.Conn().PgConn().CustomData()[serverKey] = srv
	}
	_, _ = d.checkServer(cctx, conn)
}

func (d *Dispatcher) serverOf(ctx context.Context, db engine.DB) (engine.Server, error) {
	if d.srv.of != nil {
		return d.srv.of(ctx, db)
	}
	return engine.ServerOf(ctx, db)
}

// resyncing reports whether claims wait for a change of server.
func (d *Dispatcher) resyncing() bool {
	d.srv.mu.Lock()
	defer d.srv.mu.Unlock()
	return d.srv.resync
}

// follow handles each change of server until ctx ends.
func (d *Dispatcher) follow(ctx context.Context) {
	tick := time.NewTicker(min(d.cfg.HeartbeatInterval, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if !d.resyncing() {
				d.pollServer(ctx)
			}
			continue
		case <-d.srv.kick:
		}
		for n := 1; ctx.Err() == nil; n++ {
			err := d.moveServer(ctx, n == 1)
			if err == nil {
				break
			}
			d.failed(opClaim, err, slog.LevelError, "could not move to the database server; claims wait", "retry_in", errBackoff(n))
			if !sleep(ctx, errBackoff(n)) {
				return
			}
		}
	}
}

// moveServer moves the claims to d.srv.next: it waits until every answer
// this dispatcher holds is recorded (the completer makes again a claim the
// server lacks), records again the outcomes it recorded lately if the
// server is another one than claims were made on, and says the timeline it
// is on.
func (d *Dispatcher) moveServer(ctx context.Context, log bool) error {
	d.srv.mu.Lock()
	from, to := d.srv.known, d.srv.next
	d.srv.mu.Unlock()
	first := from == (engine.Server{})
	if !first && log {
		d.log.Warn("the database server changed: claims wait until every answer held is recorded",
			"system", to.System, "timeline_from", from.Timeline, "timeline_to", to.Timeline)
	}
	if !first {
		// Every effect claimed from the old server has its answer recorded
		// (or abandoned at shutdown) before anything is claimed here.
		for {
			d.mu.Lock()
			n := len(d.held)
			d.mu.Unlock()
			if n == 0 {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-d.freed:
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	var since time.Time
	others := true
	if !first {
		// Who else may have claimed on the old server, and since when the
		// new one may lack commits: the registry it holds says.
		sctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
		ds, err := d.store.Dispatchers(sctx)
		cancel()
		if err != nil {
			return err
		}
		others = false
		for _, x := range ds {
			if x.WorkerID == d.cfg.WorkerID {
				since = x.HeartbeatAt
			}
		}
		// Another dispatcher that was alive in the window the new server
		// may lack (a heartbeat within a lease and three intervals of this
		// one's last): it may have claimed there, and its memory is not
		// this one's. Judged from the last heartbeats the server has, not
		// from now: a failover that took longer than three intervals
		// makes every other dispatcher look dead.
		for _, x := range ds {
			if x.WorkerID != d.cfg.WorkerID && (since.IsZero() ||
				x.HeartbeatAt.After(since.Add(-time.Duration(effects.LiveAfter)*d.cfg.HeartbeatInterval-d.cfg.Lease))) {
				others = true
			}
		}
		mem, covers := d.memory.recent(time.Now(), since)
		if !covers {
			others = true // what this dispatcher forgot may be lost
		}
		var outs []engine.Outcome
		for _, r := range mem {
			// With others, a retry of a kind without keys recorded again
			// would make the effect pending, due later, out of the hold:
			// another dispatcher may have claimed and sent its next
			// attempt in the lost window. Left fired, it is rescued
			// uncertain.
			if others && r.out.State == effects.Pending && !d.repeatable[r.kind] {
				continue
			}
			outs = append(outs, r.out)
		}
		if len(outs) > 0 {
			rctx, cancel := context.WithTimeout(ctx, 4*d.dbTimeout())
			again, err := d.engine.Unrecorded(rctx, outs)
			if err == nil && len(again) > 0 {
				_, err = d.engine.Complete(rctx, again)
			}
			cancel()
			if err != nil {
				return err
			}
			if len(again) > 0 {
				d.log.Warn("recorded again what the new server lacked", "outcomes", len(again))
			}
		}
	}
	var holdable []string
	if others {
		for _, p := range d.policies {
			if !d.repeatable[p.Kind] {
				holdable = append(holdable, p.Kind)
			}
		}
	}
	tctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
	seen, err := d.engine.TimelineSeen(tctx, to, holdable, d.cfg.WorkerID)
	cancel()
	if err != nil {
		return err
	}
	if seen.Promoted {
		d.log.Warn("a promotion since the last timeline seen: what the old primary committed last may be lost",
			"timeline", to.Timeline, "since", seen.Since, "held", seen.Held, "held_kinds", holdable)
	}
	d.srv.mu.Lock()
	d.srv.known, d.srv.resync = to, false
	d.srv.mu.Unlock()
	signal(d.wake)
	return nil
}
