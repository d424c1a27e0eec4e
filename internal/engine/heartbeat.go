package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/effects"
)

// Beat is one heartbeat of a dispatcher: who it is, the kinds it serves, when
// it beats again, and what it knows of its providers.
type Beat struct {
	Worker   string
	Kinds    []string
	Interval time.Duration
	// Status says, for some of Kinds, what holds their effects back in
	// this dispatcher.
	Status []KindBeat
}

// KindBeat is what a dispatcher knows of one kind's provider.
type KindBeat struct {
	Kind     string
	Provider string
	// PausedFor is how much is left of a Retry-After pause (0: none); the
	// database records its end on its own clock.
	PausedFor time.Duration
	// InFlight calls of the provider, and its limit (its share of the
	// workers, or its configured concurrency).
	InFlight, Limit int
	// Failures is the provider's retryable or unknown answers in a row.
	Failures int
	// MaxAttempts is the kind's attempts per effect, for an effect
	// without a max_attempts of its own.
	MaxAttempts int
	// KeyWindow is how long the kind's provider remembers a key (0: none):
	// an operator's retry or refire never uses a shorter one (schema 37).
	KeyWindow time.Duration
	// Share, if set, is this dispatcher's part of the provider's limits
	// shared across the fleet (BeatShared); InFlight and Limit are then
	// against Share.Concurrency when the concurrency is shared.
	Share *Share
}

// Share is one dispatcher's part of a provider's limits shared by every
// live dispatcher of the database: the calls per second it may start, its
// burst, and the calls it may hold in flight. A limit the fleet does not
// share is 0 here.
type Share struct {
	Rate        float64
	Burst       int
	Concurrency int
}

// Peer is another live dispatcher as a shared heartbeat reads it: its
// worker id and, by provider, the share of the provider's limits its last
// heartbeat recorded (providers it shares no limit of are absent).
type Peer struct {
	Worker string
	Shares map[string]Share
}

// Heartbeat records that worker is alive and serves kinds, and will beat
// again within interval.
func (s *Engine) Heartbeat(ctx context.Context, worker string, kinds []string, interval time.Duration) error {
	return s.Beat(ctx, Beat{Worker: worker, Kinds: kinds, Interval: interval})
}

// Beat records b in the registry (sidefx_dispatchers), which
// Store.KindStatuses and the operators' commands read.
func (s *Engine) Beat(ctx context.Context, b Beat) error {
	if b.Interval <= 0 {
		return &effects.ValidationError{Index: -1, Field: "interval", Reason: "must be positive"}
	}
	st := make([]kindStatusRow, len(b.Status))
	for i, k := range b.Status {
		st[i] = kindStatusRow{Kind: k.Kind, Provider: k.Provider, PausedMS: k.PausedFor.Milliseconds(),
			InFlight: k.InFlight, Limit: k.Limit, Failures: k.Failures, MaxAttempts: k.MaxAttempts,
			WindowMS: k.KeyWindow.Milliseconds()}
		if k.Share != nil {
			st[i].Share = &shareRow{Rate: k.Share.Rate, Burst: k.Share.Burst, Concurrency: k.Share.Concurrency}
		}
	}
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("dispatcher heartbeat: %w", err)
	}
	_, err = s.db.Exec(ctx, `INSERT INTO `+s.registry+` AS d (worker_id, kinds, interval_ms, kind_status)
		SELECT $1, $2, $3, coalesce(pg_catalog.jsonb_object_agg(x->>'kind', (x - 'kind' - 'paused_ms') || pg_catalog.jsonb_build_object('paused_until',
			CASE WHEN (x->>'paused_ms')::bigint > 0 THEN now() + ((x->>'paused_ms')::bigint OPERATOR(pg_catalog.*) interval '1 millisecond') END)), '{}')
		FROM pg_catalog.jsonb_array_elements($4::jsonb) AS x
		ON CONFLICT (worker_id) DO UPDATE SET kinds = excluded.kinds, heartbeat_at = now(), interval_ms = excluded.interval_ms,
			kind_status = excluded.kind_status`,
		b.Worker, b.Kinds, b.Interval.Milliseconds(), string(raw))
	if err != nil {
		return fmt.Errorf("dispatcher heartbeat: %w", translate(err))
	}
	return nil
}

// sharesLock names the row of sidefx_locks (schema 36) that orders the
// shared heartbeats of a database: one at a time reads the others' shares
// and records its own, so no two take the same free part of a limit.
const sharesLock = "fleet-shares"

// ShareLiveAfter is how many of its heartbeat intervals a dispatcher
// counts in the split of the fleet's limits after its last heartbeat:
// fewer than the registry's effects.LiveAfter, so that a killed replica's
// share moves to the others within three of their heartbeats. A live
// replica beats every interval, its shared heartbeat waiting at most half
// of one for the lock: it is never out of the split while alive unless
// its heartbeat is late by more than an interval (then, until it beats
// again, the fleet may exceed the limit by its share).
const ShareLiveAfter = 2

// ErrSharesBusy is returned by BeatShared when the shares' lock could not
// be had within its wait: nothing was recorded.
var ErrSharesBusy = errors.New("the lock of the fleet's shares is held by another heartbeat")

// BeatShared records a heartbeat like Beat, one at a time across the
// database: under the row lock of sidefx_locks "fleet-shares" (waited for
// at most lockWait; ErrSharesBusy past it), it reads the live dispatchers
// other than worker (a heartbeat within ShareLiveAfter of their
// intervals), with the shares their last
// heartbeat recorded, and records the Beat that decide returns for them.
// decide runs inside the transaction, before its commit; a share it lowers
// may be applied there, one it raises only once BeatShared returned nil
// (the others read it from the commit on).
func (s *Engine) BeatShared(ctx context.Context, db Beginner, worker string, lockWait time.Duration, decide func([]Peer) Beat) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("shared heartbeat: begin: %w", translate(err))
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	// A holder paused in the transaction would hold every shared heartbeat
	// off: the server ends it once idle past the wait.
	wait := max(lockWait.Milliseconds(), 1)
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('lock_timeout', $1, true), pg_catalog.set_config('idle_in_transaction_session_timeout', $2, true)`,
		fmt.Sprintf("%dms", wait), fmt.Sprintf("%dms", max(wait, 1000))); err != nil {
		return fmt.Errorf("shared heartbeat: settings: %w", translate(err))
	}
	locks := locksOf(s.schema)
	if _, err := tx.Exec(ctx, `INSERT INTO `+locks+` (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, sharesLock); err != nil {
		return s.sharesErr(err)
	}
	if _, err := tx.Exec(ctx, `SELECT FROM `+locks+` WHERE name = $1 FOR UPDATE`, sharesLock); err != nil {
		return s.sharesErr(err)
	}
	rows, err := tx.Query(ctx, `SELECT worker_id, kind_status FROM `+s.registry+`
		WHERE worker_id <> $1 AND heartbeat_at > now() - ($2 * interval_ms OPERATOR(pg_catalog.*) interval '1 millisecond')
			AND heartbeat_at <= now() + interval '1 minute' 
		ORDER BY worker_id`, worker, ShareLiveAfter)
	if err != nil {
		return s.sharesErr(err)
	}
	peers, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Peer, error) {
		var p Peer
		var raw []byte
		if err := r.Scan(&p.Worker, &raw); err != nil {
			return p, err
		}
		p.Shares = parseShares(raw)
		return p, nil
	})
	if err != nil {
		return s.sharesErr(err)
	}
	b := decide(peers)
	if b.Worker != worker {
		return fmt.Errorf("shared heartbeat: decide returned the beat of %q, not of %q", b.Worker, worker)
	}
	if err := s.WithDB(tx).Beat(ctx, b); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("shared heartbeat: commit: %w", translate(err))
	}
	return nil
}

// sharesErr is the error of a shared heartbeat's statement: ErrSharesBusy
// for a lock not had within its wait (55P03, lock_not_available).
func (s *Engine) sharesErr(err error) error {
	if pe, ok := PgErrorOf(err); ok && pe.Code == "55P03" {
		return ErrSharesBusy
	}
	return fmt.Errorf("shared heartbeat: %w", translate(err))
}

// parseShares reads the shares a kind_status records, by provider. A
// share that is not a finite, non-negative one (a row written by hand) is
// read as the whole of nothing: 0, which takes nothing from the others'.
// Two kinds of one provider record the same share; the larger is kept.
func parseShares(raw []byte) map[string]Share {
	var st map[string]kindStatusRow
	if json.Unmarshal(raw, &st) != nil {
		return nil
	}
	out := map[string]Share{}
	for _, k := range st {
		if k.Share == nil || k.Provider == "" {
			continue
		}
		sh := Share{Burst: max(k.Share.Burst, 0), Concurrency: max(k.Share.Concurrency, 0)}
		if r := k.Share.Rate; r > 0 && !math.IsInf(r, 0) {
			sh.Rate = r
		}
		o := out[k.Provider]
		out[k.Provider] = Share{Rate: max(o.Rate, sh.Rate), Burst: max(o.Burst, sh.Burst), Concurrency: max(o.Concurrency, sh.Concurrency)}
	}
	return out
}

// RegisterKinds records in sidefx_kinds (schema 21) that a dispatcher
// serves each kind of b, with its provider: producers then refuse kinds no
// dispatcher has served lately (engine.Store.InsertKnown). A kind already
// recorded is written again only when its provider changed or it was last
// seen an hour ago or more, so heartbeats write almost nothing.
func (s *Engine) RegisterKinds(ctx context.Context, b Beat) error {
	providers := map[string]string{}
	for _, k := range b.Status {
		providers[k.Kind] = k.Provider
	}
	ps := make([]*string, len(b.Kinds))
	for i, k := range b.Kinds {
		if p, ok := providers[k]; ok {
			ps[i] = &p
		}
	}
	_, err := s.db.Exec(ctx, `INSERT INTO `+s.kinds+` AS k (kind, provider)
		SELECT i.kind, i.provider FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS i(kind, provider)
		WHERE NOT EXISTS (SELECT FROM `+s.kinds+` AS c WHERE c.kind = i.kind AND c.seen_at >= now() - interval '1 hour'
			AND (i.provider IS NULL OR c.provider = i.provider))
		ON CONFLICT (kind) DO UPDATE SET seen_at = now(), provider = coalesce(excluded.provider, k.provider)
		WHERE k.seen_at < now() - interval '1 hour' OR k.provider IS DISTINCT FROM coalesce(excluded.provider, k.provider)`,
		b.Kinds, ps)
	if err != nil {
		return fmt.Errorf("register kinds: %w", translate(err))
	}
	return nil
}

// Retire removes worker from the registry (at a clean stop), and the rows of
// dispatchers dead for longer than a day.
func (s *Engine) Retire(ctx context.Context, worker string) error {
	_, err := s.db.Exec(ctx, `DELETE FROM `+s.registry+` WHERE worker_id = $1 OR heartbeat_at < now() - interval '1 day'`, worker)
	if err != nil {
		return fmt.Errorf("retire dispatcher: %w", translate(err))
	}
	return nil
}
