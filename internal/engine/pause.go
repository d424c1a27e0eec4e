package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/effects"
)

func (s *Store) pauses() string   { return Quote(s.schema) + ".sidefx_pauses" }
func (s *Store) pauseLog() string { return Quote(s.schema) + ".sidefx_pause_log" }

// SetPause pauses (pause true) or resumes the kind or provider name,
// logging the action with a's actor and note and notifying the
// dispatchers, in one transaction. Pausing what is paused already changes
// nothing and reports false; resuming what is not is ErrNotPaused.
func (s *Store) SetPause(ctx context.Context, scope effects.PauseScope, name string, pause bool, a effects.By) (bool, error) {
	switch {
	case !scope.Valid():
		return false, effects.Invalid("scope", fmt.Sprintf("%q: want kind or provider", scope))
	case strings.TrimSpace(name) == "":
		return false, effects.Invalid("name", "is empty: name the kind or the provider")
	}
	if err := a.Validate(); err != nil {
		return false, err
	}
	// One statement, on any handle (a pool, a connection, a transaction,
	// database/sql's too): the change, its log entry and the notification
	// (sent when the statement's transaction commits) happen together or
	// not at all.
	action, change := "pause", `INSERT INTO `+s.pauses()+` (scope, name, actor, note) VALUES ($1, $2, $3, $4)
			ON CONFLICT DO NOTHING RETURNING scope`
	if !pause {
		action, change = "resume", `DELETE FROM `+s.pauses()+` WHERE scope = $1 AND name = $2 RETURNING scope`
	}
	var changed bool
	var notified int64
	err := s.db.QueryRow(ctx, `WITH changed AS (`+change+`),
		logged AS (
			INSERT INTO `+s.pauseLog()+` (scope, name, action, actor, note) SELECT $1, $2, $5, $3, $4 FROM changed
		),
		notified AS (SELECT pg_catalog.pg_notify($6, $7) FROM changed)
		SELECT EXISTS (SELECT FROM changed), (SELECT count(*) FROM notified)`,
		string(scope), name, a.Actor, a.Note, action, s.Channel(), effects.PausesPayload).Scan(&changed, &notified)
	if err != nil {
		return false, fmt.Errorf("%s %s %s: %w", action, scope, name, translate(err))
	}
	if !changed {
		if !pause {
			return false, fmt.Errorf("resume %s %s: %w", scope, name, effects.ErrNotPaused)
		}
		return false, nil
	}
	return true, nil
}

// Pauses lists what is paused, oldest first.
func (s *Store) Pauses(ctx context.Context) ([]effects.Pause, error) {
	rows, err := s.db.Query(ctx, `SELECT scope, name, paused_at, actor, note FROM `+s.pauses()+` ORDER BY paused_at, scope, name`)
	if err != nil {
		return nil, fmt.Errorf("list pauses: %w", translate(err))
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effects.Pause, error) {
		var p effects.Pause
		var scope string
		err := r.Scan(&scope, &p.Name, &p.PausedAt, &p.Actor, &p.Note)
		p.Scope = effects.PauseScope(scope)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("list pauses: %w", translate(err))
	}
	return ps, nil
}
