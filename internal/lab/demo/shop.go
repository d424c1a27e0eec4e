package demo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/outbox"
)

// shopDDL is the demo shop's one table.
const shopDDL = `CREATE TABLE orders (id text PRIMARY KEY, customer text, amount int, paid_at timestamptz)`

// payOrder is the business transaction's row, inserted by the API's
// handler in the edge's transaction.
const payOrder = `INSERT INTO orders (id, customer, amount, paid_at) VALUES ($1, $2, $3, now()) ON CONFLICT (id) DO NOTHING`

// enqueueWorkers is how many requests, and deliveries, are handled at
// once.
const enqueueWorkers = 8

type order struct {
	id       string
	customer string
	amount   int // cents
}

func newOrder(i int) order {
	return order{id: OrderID(i), customer: fmt.Sprintf("customer-%d@example.com", i%997+1), amount: 500 + (i*7919)%19500}
}

// effects returns the order's three effects. Their payloads depend on the
// order alone: a replayed event enqueues the very same effects.
func (o order) effects() []outbox.Effect {
	euros := fmt.Sprintf("€%d.%02d", o.amount/100, o.amount%100)
	return []outbox.Effect{
		{SourceID: o.id, Kind: KindCharge, Payload: map[string]any{
			"amount": o.amount, "currency": "eur", "payment_method_types": []string{"card"},
			"payment_method": "pm_card_visa", "confirm": true,
			"description": "Order " + o.id, "metadata": map[string]string{"order_id": o.id},
		}},
		{SourceID: o.id, Kind: KindReceipt, Payload: map[string]any{
			"personalizations": []map[string]any{{"to": []map[string]string{{"email": o.customer}}}},
			"from":             map[string]string{"email": "shop@example.com", "name": "The Demo Shop"},
			"subject":          "Your receipt for " + o.id,
			"content":          []map[string]string{{"type": "text/plain", "value": "Thank you! We charged " + euros + " for " + o.id + "."}},
		}},
		{SourceID: o.id, Kind: KindWebhook, Payload: map[string]any{
			"type": "order.paid", "order_id": o.id, "amount": o.amount, "currency": "eur",
		}},
	}
}

func (d *demo) createShop(ctx context.Context) error {
	if _, err := d.pool.Exec(ctx, shopDDL); err != nil {
		return fmt.Errorf("demo: creating the shop's table: %w", err)
	}
	d.n.say("The shop: %s", shopDDL)
	return nil
}

// receiptRule is the drift rule the demo runs: every paid order has one
// receipt.
var receiptRule = drift.Rule{
	Name: "paid_orders_have_receipts",
	Kind: KindReceipt,
	SQL:  `SELECT id FROM orders WHERE paid_at IS NOT NULL AND paid_at < :due_before`,
}

// drift runs the receipt rule, deletes one receipt row, and runs it again.
func (d *demo) drift(ctx context.Context) error {
	d.n.text("")
	d.n.say("Drift: does every paid order have its receipt? Rule %s (grace 0):", receiptRule.Name)
	d.n.detail("%s", receiptRule.SQL)
	f, stuck, err := d.runRule(ctx)
	if err != nil {
		return err
	}
	d.sum.DriftClean = f
	d.n.detail("→ %s", describeFinding(f))
	d.n.detail("  Stuck, across the table: %d uncertain and %d failed (for an operator), %d pending for over an hour, %d fired past their lease.",
		stuck.Uncertain, stuck.Failed, stuck.PendingTooLong, stuck.FiredPastLease)
	if f.Missing != 0 || f.Extra != 0 {
		d.problem("drift found %d missing and %d extra receipts before anything was deleted", f.Missing, f.Extra)
	}

	victim, err := d.pickVictim(ctx)
	if err != nil {
		return err
	}
	d.sum.DeletedReceipt = victim
	// Deliberately outside engine.Store, which has no such statement: this
	// is the row lost to a bad migration, a restore or a stray DELETE.
	del := "DELETE FROM side_effects WHERE kind = 'email.receipt' AND source_id = '" + victim + "'"
	tag, err := d.pool.Exec(ctx, "DELETE FROM "+engine.Quote(d.schema)+".side_effects WHERE kind = $1 AND source_id = $2", KindReceipt, victim)
	if err != nil {
		return fmt.Errorf("demo: deleting a receipt: %w", err)
	}
	d.n.say("Someone loses a row: %s (%d row).", del, tag.RowsAffected())
	f, _, err = d.runRule(ctx)
	if err != nil {
		return err
	}
	d.sum.DriftAfterDelete = f
	d.n.say("The same rule again → %s", describeFinding(f))
	if f.Missing != 1 || len(f.MissingIDs) != 1 || f.MissingIDs[0] != victim || f.Extra != 0 {
		d.problem("after deleting the receipt of %s, drift found missing %d %v, extra %d", victim, f.Missing, f.MissingIDs, f.Extra)
	}
	return nil
}

func (d *demo) runRule(ctx context.Context) (drift.Finding, drift.Stuck, error) {
	rep := drift.Run(ctx, d.pool, d.schema, []drift.Rule{receiptRule}, time.Hour)
	if len(rep.Findings) != 1 {
		return drift.Finding{}, drift.Stuck{}, fmt.Errorf("demo: drift returned %d findings for one rule", len(rep.Findings))
	}
	f := rep.Findings[0]
	return f, rep.Stuck, errors.Join(f.Err, rep.StuckErr)
}

func describeFinding(f drift.Finding) string {
	if f.Missing == 0 && f.Extra == 0 {
		return fmt.Sprintf("no findings: every paid order has exactly one receipt effect (%s).", f.Duration.Round(time.Millisecond))
	}
	s := fmt.Sprintf("%d missing", f.Missing)
	if len(f.MissingIDs) > 0 {
		s += fmt.Sprintf(" %v", f.MissingIDs)
	}
	if f.Extra > 0 {
		s += fmt.Sprintf(", %d extra %v", f.Extra, f.ExtraIDs)
	}
	return s + ": a paid order with no receipt, found before the customer asks."
}

// pickVictim picks, by the seed, an order whose receipt was confirmed.
func (d *demo) pickVictim(ctx context.Context) (string, error) {
	start := int(d.plan.unit("drift victim") * float64(d.opts.Orders))
	for j := range d.opts.Orders {
		id := OrderID((start + j) % d.opts.Orders)
		e, err := d.store.GetBySource(ctx, id, KindReceipt)
		if err != nil {
			return "", err
		}
		if e.State == effects.Confirmed {
			return id, nil
		}
	}
	return OrderID(start), nil
}
