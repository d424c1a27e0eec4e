package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

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
