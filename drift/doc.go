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
// the others. A NULL the SQL returns is no source id: it is left out, the
// other ids are compared, and the rule's finding names the NULLs as its
// Problem, which counts in Report.Errors like a failed rule.
//
// Each rule runs in a read-only transaction of its own (a savepoint when the
// DB given is a transaction), and the database cancels any of its statements
// that runs past Rule.StatementTimeout (Config.StatementTimeout for a
// Checker's rules that set none, DefaultStatementTimeout, 30s, without
// either). Rule SQL that calls something that writes fails; nothing is kept.
//
// Validate checks each rule before it runs: its fields, its placeholders
// (any other than :due_before and :window_start is named, with where it
// is, before any SQL runs), then its SQL, which the database runs for no
// rows and which must return one text-compatible column. The database's
// error positions are given as a line and column of the rule's own SQL, not
// of the statement sidefx wraps around it.
//
// A Checker refuses the rules Validate rejects and runs the others. A
// refused rule is a failed Finding (Refused) in every run, so it counts in
// Report.Errors, in the stored runs, in the Observer's report and in the
// alerts posted, until it is fixed and the checker started again.
package drift
