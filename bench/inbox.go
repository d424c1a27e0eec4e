package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/inbox"
)

// ---- Workload 6: the consumers' inbox, next to enqueue ----

const (
	inboxWorkload = "6. inbox"
	inboxConsumer = "bench"
)

var (
	inboxPayload = []byte(`{"source_id":"m","amount":4200,"currency":"eur"}`)
	inboxResult  = json.RawMessage(`{"order":"accepted"}`)
)

// inboxFirst handles a message's first delivery: Once, the message's work
// (one order row, as the enqueue workload's business row), Record.
func inboxFirst(ctx context.Context, tx pgx.Tx, p, seq, _ int) error {
	r, err := inbox.Once(ctx, tx, inbox.Message{Consumer: inboxConsumer, ID: sourceID(p, seq, 0), Payload: inboxPayload})
	if err != nil {
		return err
	}
	if !r.First {
		return fmt.Errorf("message %s: a redelivery, want the first delivery", r.ID)
	}
	if err := insertOrders(ctx, tx, 1); err != nil {
		return err
	}
	return r.Record(ctx, tx, inboxResult)
}

// inboxDuplicate is a redelivery of a message recorded before: Once only,
// no work. recorded[p] is how many messages producer p recorded first.
func inboxDuplicate(recorded []int) enqueuer {
	return func(ctx context.Context, tx pgx.Tx, p, seq, _ int) error {
		if recorded[p] == 0 {
			return fmt.Errorf("producer %d recorded no message to redeliver", p)
		}
		r, err := inbox.Once(ctx, tx, inbox.Message{Consumer: inboxConsumer, ID: sourceID(p, seq%recorded[p], 0), Payload: inboxPayload})
		if err != nil {
			return err
		}
		if r.First {
			return fmt.Errorf("message %s: a first delivery, want a redelivery", r.ID)
		}
		return nil
	}
}

// inboxVariants names the rows of one producer count.
func inboxVariants(producers int) (enq, first, dup string) {
	return fmt.Sprintf("%d producer(s): order row + outbox.Enqueue of 1 effect per tx (workload 1's shape)", producers),
		fmt.Sprintf("%d producer(s): inbox.Once + order row + Receipt.Record per tx (first delivery)", producers),
		fmt.Sprintf("%d producer(s): inbox.Once on a recorded id per tx (duplicate delivery, no work)", producers)
}

func (e *env) inboxAll(ctx context.Context) error {
	dur := time.Duration(e.o.enqueueSeconds * float64(time.Second))
	shapes := []int{1, 8}
	// Workload 1's cells of one effect per transaction and their
	// baseline, when it ran in this pass: the same shape, not measured
	// again.
	enqueue, baseline := map[int][]float64{}, map[int][]float64{}
	copied := true
	for _, producers := range shapes {
		w1 := e.t.find("1. enqueue", enqueueVariant(producers), "tx/s")
		if w1 == nil || len(w1.cells[colSidefx]) == 0 || len(w1.cells[colFloor]) == 0 {
			copied = false
			break
		}
		enqueue[producers], baseline[producers] = w1.cells[colSidefx], w1.cells[colFloor]
	}
	for _, producers := range shapes {
		enq, first, dup := inboxVariants(producers)
		for _, v := range []string{enq, first, dup} {
			e.t.row(inboxWorkload, v, "msg/s").perTx = float64(producers)
		}
	}
	for run := 1; run <= e.o.runs; run++ {
		for _, producers := range shapes {
			enq, first, dup := inboxVariants(producers)
			if !copied {
				rate, err := e.inboxRate(ctx, tmplPlain, baselineEnqueuer, producers, dur)
				if err != nil {
					return fmt.Errorf("inbox, baseline: %w", err)
				}
				logf("  %s | %d producer(s), order row alone | %s: %.4g msg/s", inboxWorkload, producers, colFloor, rate)
				baseline[producers] = append(baseline[producers], rate)
				if rate, err = e.inboxRate(ctx, tmplSidefx, sidefxEnqueuer, producers, dur); err != nil {
					return fmt.Errorf("inbox, enqueue: %w", err)
				}
				e.t.add(inboxWorkload, enq, "msg/s", colSidefx, rate)
			}
			// The duplicates redeliver the messages the first deliveries
			// recorded, in the same database.
			pool, _, drop, err := e.fresh(ctx, tmplSidefx)
			if err != nil {
				return err
			}
			recorded := make([]int, producers)
			firsts := func(ctx context.Context, tx pgx.Tx, p, seq, batch int) error {
				if err := inboxFirst(ctx, tx, p, seq, batch); err != nil {
					return err
				}
				recorded[p] = seq + 1 // producer p's own slot, read after the producers end
				return nil
			}
			rate, err := enqueueRate(ctx, pool, firsts, producers, 1, dur)
			if err == nil {
				e.t.add(inboxWorkload, first, "msg/s", colSidefx, rate)
				if rate, err = enqueueRate(ctx, pool, inboxDuplicate(recorded), producers, 1, dur); err == nil {
					e.t.add(inboxWorkload, dup, "msg/s", colSidefx, rate)
				}
			}
			drop()
			if err != nil {
				return fmt.Errorf("inbox, %d producer(s): %w", producers, err)
			}
		}
	}
	for _, producers := range shapes {
		enq, first, dup := inboxVariants(producers)
		if copied {
			r := e.t.row(inboxWorkload, enq, "msg/s")
			r.cells[colSidefx] = append(r.cells[colSidefx], enqueue[producers]...)
		}
		for _, v := range []string{enq, first, dup} {
			r := e.t.row(inboxWorkload, v, "msg/s")
			r.cells[colFloor] = append(r.cells[colFloor], baseline[producers]...)
		}
	}
	src := "measured in this workload"
	if copied {
		src = "copied from workload 1, which ran in this pass"
	}
	e.t.note(fmt.Sprintf("6. inbox: producers run transactions back to back for %.0f s per cell, one message (or effect) per transaction, so msg/s is tx/s. "+
		"First delivery: inbox.Once of a new id, the message's work (one order row), Receipt.Record of a small result, commit. "+
		"Duplicate delivery: inbox.Once of an id the first deliveries recorded (a redelivery: its count of deliveries goes up), commit, no work. "+
		"The enqueue rows, for comparison: workload 1's transaction of one order row and one outbox.Enqueue (%s). "+
		"Baseline column: the order row alone in its transaction (%s); the last column is what each adds per transaction over it.",
		e.o.enqueueSeconds, src, src))
	return nil
}

// inboxRate is enqueueRate of fn with one item per transaction in a fresh
// database cloned from tmpl.
func (e *env) inboxRate(ctx context.Context, tmpl string, fn enqueuer, producers int, dur time.Duration) (float64, error) {
	pool, _, drop, err := e.fresh(ctx, tmpl)
	if err != nil {
		return 0, err
	}
	defer drop()
	return enqueueRate(ctx, pool, fn, producers, 1, dur)
}
