package engine

import (
	"context"
	"time"
)

// InboxDelivery is what the schema's sidefx_inbox_once function says of
// one delivery.
type InboxDelivery struct {
	First      bool
	ReceivedAt time.Time
	Deliveries int
	Result     []byte // the result recorded by the first delivery's handler, if any
}

// InboxOnce records the delivery of message id to consumer in db (the
// consumer's transaction), through the schema q's sidefx_inbox_once
// (q quoted, as Quote returns it): a first delivery inserts the record,
// kept for retention; a redelivery finds it. hash is the SHA-256 of the
// payload. Errors are the driver's, for the caller to read (PgErrorOf).
func InboxOnce(ctx context.Context, db DB, q, consumer, id string, hash []byte, retention time.Duration) (InboxDelivery, error) {
	var d InboxDelivery
	var deliveries int32
	err := db.QueryRow(ctx, `SELECT first, received_at, deliveries, result FROM `+q+`.sidefx_inbox_once($1, $2, $3, ($4 OPERATOR(pg_catalog.*) interval '1 millisecond'))`,
		consumer, id, hash, retention.Milliseconds()).Scan(&d.First, &d.ReceivedAt, &deliveries, &d.Result)
	d.Deliveries = int(deliveries)
	return d, err
}

// InboxRecord stores result (JSON) as what handling message id of consumer
// produced, through the schema q's sidefx_inbox_record, in db (the
// transaction InboxOnce ran in). It reports whether the record was found.
func InboxRecord(ctx context.Context, db DB, q, consumer, id string, result []byte) (bool, error) {
	var found bool
	err := db.QueryRow(ctx, `SELECT `+q+`.sidefx_inbox_record($1, $2, $3::text::jsonb)`, consumer, id, string(result)).Scan(&found)
	return found, err
}
