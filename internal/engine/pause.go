package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/effects"
)

func (s *Store) pauses() string { return Quote(s.schema) + ".sidefx_pauses" }

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
	// database/sql's too): sidefx_set_pause makes the change, its log entry
	// and the notification (sent when the statement's transaction commits)
	// together or not at all.
	action := "pause"
	if !pause {
		action = "resume"
	}
	var changed bool
	err := s.db.QueryRow(ctx, `SELECT `+Quote(s.schema)+`.sidefx_set_pause($1, $2, $3, $4, $5)`,
		string(scope), name, pause, a.Actor, a.Note).Scan(&changed)
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

// Pauses lists what is paused, oldest first: at most MaxPauses, the most
// sidefx_set_pause holds.
func (s *Store) Pauses(ctx context.Context) ([]effects.Pause, error) {
	rows, err := s.db.Query(ctx, `SELECT scope, name, paused_at, actor, note FROM `+s.pauses()+` ORDER BY paused_at, scope, name LIMIT $1`, MaxPauses)
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
