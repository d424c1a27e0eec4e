package daemon

import (
	"context"
	"encoding/json"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/reconcile"
)

// The JSON of sidefx list, inspect and status: effects as
// effects.EffectJSON writes them, and the rest in the same manner
// (snake_case, effects.JSONTime, null for unset). "JSON output" in
// docs/operations.md describes it; testdata/*.golden pins it.

// limits resolves the attempt limit of effects as the dispatcher applies
// it: what the live dispatchers report of each kind, and the
// configuration (--config), if given.
type limits struct {
	kinds map[string]effects.KindStatus
	cfg   *config.Config
}

// limits reads what the live dispatchers say of each kind, and loads
// --config.
func (c *common) limits(ctx context.Context, io *IO, store *engine.Store) (*limits, error) {
	kinds, err := store.KindStatuses(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := c.loadConfig(io)
	if err != nil {
		return nil, err
	}
	return &limits{kinds: kinds, cfg: cfg}, nil
}

// of is how many attempts e may make, and where that comes from: its own
// max_attempts; else its kind's, as the live dispatchers serving it report
// it, or as the configuration sets it; else the dispatcher's default.
func (l *limits) of(e *effects.Effect) effects.AttemptLimit {
	ks := l.kinds[e.Kind]
	switch {
	case e.MaxAttempts > 0:
		return effects.AttemptLimit{Max: e.MaxAttempts, UpTo: e.MaxAttempts, Source: effects.LimitEffect}
	case ks.MaxAttempts > 0:
		return effects.AttemptLimit{Max: ks.MaxAttempts, UpTo: max(ks.MaxAttemptsUpTo, ks.MaxAttempts), Source: effects.LimitKind}
	}
	if l.cfg != nil {
		if k, ok := l.cfg.Kinds[e.Kind]; ok && k.MaxAttempts > 0 {
			return effects.AttemptLimit{Max: k.MaxAttempts, UpTo: k.MaxAttempts, Source: effects.LimitConfig}
		}
	}
	return effects.AttemptLimit{Max: dispatcher.DefaultMaxAttempts, UpTo: dispatcher.DefaultMaxAttempts, Source: effects.LimitDefault}
}

// effect is e as sidefx's JSON writes it.
func (l *limits) effect(e *effects.Effect) effects.EffectJSON {
	return effects.NewEffectJSON(e, l.of(e))
}

// inspectJSON is one effect of sidefx inspect --json: the effect, why it
// waits (pending only), its history and what its provider said of it.
type inspectJSON struct {
	effects.EffectJSON
	WhyPending       *string             `json:"why_pending"`
	History          []effects.EventJSON `json:"history"`
	ProviderEvidence []evidenceJSON      `json:"provider_evidence"`
}

// evidenceJSON is one piece of a provider's evidence about an effect.
type evidenceJSON struct {
	RecordedAt *string `json:"recorded_at"`
	Provider   string  `json:"provider"`
	// Source is how it came: "lookup" or "event".
	Source    string          `json:"source"`
	EventID   *string         `json:"event_id"`
	Key       string          `json:"idempotency_key"`
	Verdict   string          `json:"verdict"`
	Ref       *string         `json:"ref"`
	Succeeded bool            `json:"succeeded"`
	Status    *string         `json:"status"`
	At        *string         `json:"at"`
	Detail    json.RawMessage `json:"detail"`
}

func newEvidenceJSON(s reconcile.Stored) evidenceJSON {
	j := evidenceJSON{
		RecordedAt: effects.JSONTime(s.RecordedAt), Provider: s.Provider, Source: s.Source,
		EventID: effects.JSONText(s.EventID), Key: s.Key, Verdict: s.Evidence.Verdict.String(), Ref: effects.JSONText(s.Evidence.Ref),
		Succeeded: s.Evidence.Succeeded, Status: effects.JSONText(s.Evidence.Status), At: effects.JSONTime(s.Evidence.At),
	}
	if len(s.Evidence.Detail) > 0 {
		j.Detail = s.Evidence.Detail
	}
	return j
}

// pauseJSON is a pause as sidefx status --json writes it.
type pauseJSON struct {
	Scope    effects.PauseScope `json:"scope"`
	Name     string             `json:"name"`
	PausedAt *string            `json:"paused_at"`
	Actor    string             `json:"actor"`
	Note     *string            `json:"note"`
}

// pausedJSON is the pauses as sidefx status --json writes them ([] for
// none).
func pausedJSON(ps []effects.Pause) []pauseJSON {
	out := []pauseJSON{}
	for _, p := range ps {
		out = append(out, pauseJSON{Scope: p.Scope, Name: p.Name, PausedAt: effects.JSONTime(p.PausedAt), Actor: p.Actor, Note: effects.JSONText(p.Note)})
	}
	return out
}
