package inboxmetrics_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sidefx/sidefx/inbox"
	"github.com/sidefx/sidefx/inbox/inboxmetrics"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Deliveries, redeliveries and mismatches of real Once calls are counted
// per consumer.
func TestObserver_CountsOnceCalls(t *testing.T) {
	pool := pgtest.DB(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	obs, err := inboxmetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(&inbox.Config{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	deliver := func(consumer, payload string) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := in.Once(ctx, tx, inbox.Message{Consumer: consumer, ID: "evt_1", Payload: []byte(payload)}); err == nil {
			tx.Commit(ctx)
		}
	}
	deliver("billing", "a")
	deliver("billing", "a")
	deliver("billing", "a")
	deliver("billing", "b") // a mismatch
	deliver("shipping", "a")
	for _, c := range []struct {
		name, consumer string
		want           float64
	}{
		{"sidefx_inbox_deliveries_total", "billing", 3}, {"sidefx_inbox_duplicates_total", "billing", 2},
		{"sidefx_inbox_mismatches_total", "billing", 1}, {"sidefx_inbox_deliveries_total", "shipping", 1},
		{"sidefx_inbox_duplicates_total", "shipping", 0},
	} {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := 0.0
		for _, mf := range mfs {
			if mf.GetName() != c.name {
				continue
			}
			for _, m := range mf.Metric {
				if m.Label[0].GetValue() == c.consumer {
					got = m.Counter.GetValue()
				}
			}
		}
		if got != c.want {
			t.Errorf("%s{consumer=%q} = %v, want %v", c.name, c.consumer, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(reg); n != 4 {
		t.Errorf("%d series, want 4", n)
	}
}
