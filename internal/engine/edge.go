package engine

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// EdgeKeys are the statements of the HTTP edge on the schema's
// sidefx_edge_keys: one record per (scope, key), written with a random
// claim by the request that holds it; its answer is stored only where the
// record still holds that claim (schema 30). Errors are the driver's, for
// the edge to read (PgErrorOf, pgx.ErrNoRows, sql.ErrNoRows).
type EdgeKeys struct{ table string }

// NewEdgeKeys returns the edge's statements on schema q (quoted, as Quote
// returns it).
func NewEdgeKeys(q string) EdgeKeys { return EdgeKeys{table: q + ".sidefx_edge_keys"} }

// Take tries the key's advisory lock in tx (a request in flight holds it:
// never wait) and, if it got it, inserts the key's record with claim,
// expiring after retention, unless one that has not expired exists (an
// expired one is taken over). One statement.
func (k EdgeKeys) Take(ctx context.Context, tx DB, scope, key string, fingerprint []byte, retention time.Duration, claim []byte) (locked, inserted bool, err error) {
	err = tx.QueryRow(ctx, `WITH l AS (SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended($1 OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) $2, 0)) AS got),
		ins AS (
			INSERT INTO `+k.table+` AS k (scope, key, fingerprint, expires_at, claim)
			SELECT $1, $2, $3, now() + ($4 OPERATOR(pg_catalog.*) interval '1 millisecond'), $5 FROM l WHERE l.got
			ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, created_at = now(),
				expires_at = EXCLUDED.expires_at, status = NULL, headers = NULL, body = NULL, completed_at = NULL,
				effect_id = NULL, effect_updated_at = NULL, claim = EXCLUDED.claim
				WHERE k.expires_at < now()
			RETURNING 1)
		SELECT l.got, EXISTS (SELECT FROM ins) FROM l`, scope, key, fingerprint, retention.Milliseconds(), claim).Scan(&locked, &inserted)
	return locked, inserted, err
}

// Answer stores the handler's answer (status, headers as JSON, body) in
// the key's record claim wrote, if it holds no answer yet, and returns how
// many records it changed (1, or 0 when the record is not that one).
func (k EdgeKeys) Answer(ctx context.Context, db DB, scope, key string, status int, headers string, body, claim []byte) (int64, error) {
	tag, err := db.Exec(ctx, `UPDATE `+k.table+` SET status = $3, headers = $4::text::jsonb, body = $5, completed_at = now()
		WHERE scope = $1 AND key = $2 AND claim = $6 AND status IS NULL`, scope, key, status, headers, body, claim)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// EdgeRecord is a key's record as a later request reads it.
type EdgeRecord struct {
	Fingerprint []byte
	Status      int    // 0: the final answer is not known yet
	Headers     []byte // JSON
	Body        []byte
	// The effect the stored answer was made from, as it was then
	// (EffectID 0: the handler's own answer).
	EffectID        int64
	EffectUpdatedAt time.Time
}

// Read returns the key's record.
func (k EdgeKeys) Read(ctx context.Context, db DB, scope, key string) (EdgeRecord, error) {
	var r EdgeRecord
	var status int32
	var effectID pgtype.Int8
	var effectAt pgtype.Timestamptz
	err := db.QueryRow(ctx, `SELECT fingerprint, coalesce(status, 0), coalesce(headers::text, '{}'), coalesce(body, ''), effect_id, effect_updated_at
		FROM `+k.table+` WHERE scope = $1 AND key = $2`, scope, key).
		Scan(&r.Fingerprint, &status, &r.Headers, &r.Body, &effectID, &effectAt)
	r.Status, r.EffectID, r.EffectUpdatedAt = int(status), effectID.Int64, effectAt.Time
	return r, err
}

// AnswerFrom stores the final answer of a request whose work committed,
// made from effect effectID as it was at updatedAt: unless an answer is
// stored already that was made from that effect as it is, or later, or
// the record is no longer the one claim wrote (the key expired and another
// request took it over). A nil claim: a retry's, whose transaction holds
// the record.
func (k EdgeKeys) AnswerFrom(ctx context.Context, db DB, scope, key string, status int, headers string, body []byte, effectID int64, updatedAt time.Time, claim []byte) error {
	_, err := db.Exec(ctx, `UPDATE `+k.table+` SET status = $3, headers = $4::text::jsonb, body = $5, completed_at = now(),
			effect_id = $6, effect_updated_at = $7
		WHERE scope = $1 AND key = $2 AND ($8::bytea IS NULL OR claim = $8)
			AND (status IS NULL OR effect_id IS DISTINCT FROM $6 OR effect_updated_at < $7)`,
		scope, key, status, headers, body, effectID, updatedAt, claim)
	return err
}
