// Package drift checks that domain objects have exactly the effects they
// should: the last line of defence, catching what got lost or added before
// a customer does.
//
// A Rule says what should exist: SQL returning the source ids that must each
// have one effect of a kind.
//
//	rule := drift.Rule{
//		Name:  "paid_orders_have_receipts",
//		Kind:  "email.receipt",
//		SQL:   `SELECT id FROM orders WHERE paid_at < :due_before AND paid_at >= :window_start`,
//		Grace: 10 * time.Minute,
//		Window: 7 * 24 * time.Hour,
//	}
//	report := drift.Run(ctx, pool, "public", []drift.Rule{rule}, time.Hour)
//
// Each run reports, per rule:
//
//   - missing: an expected source, due (older than Grace, through
//     :due_before), with no effect of the kind in any state;
//   - extra: an effect of the kind (not cancelled), created inside the
//     window, whose source the SQL does not return;
//
// and, across the table, stuck effects: pending longer than a threshold,
// fired past their lease, uncertain, failed.
//
// The comparison runs in SQL, in one statement per rule (one snapshot):
// anti-joins on side_effects' (source_id, kind) index, bounded by the
// window. A rule whose SQL fails is reported in its finding and does not stop
// the others. Validate prepares each rule's SQL without running it and
// checks it returns one text-compatible column.
package drift
