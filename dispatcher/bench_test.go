package dispatcher_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// BenchmarkDrain reports effects/s from pending to confirmed through the
// no-latency fake, for claim and record batch sizes 1, 50 and 500 with 1 and
// 4 dispatchers. Each iteration enqueues 5,000 effects (not timed), then
// times their drain. The test server runs with fsync=off.
func BenchmarkDrain(b *testing.B) {
	const perIteration = 5000
	for _, batch := range []int{1, 50, 500} {
		for _, replicas := range []int{1, 4} {
			b.Run(fmt.Sprintf("batch=%d/dispatchers=%d", batch, replicas), func(b *testing.B) {
				pool := pgtest.DB(b)
				fake := providertest.New(providertest.Config{Name: "fake", Idempotent: true, MaxRecords: 1})
				var drained time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					enqueue(b, pool, "charge.create", fmt.Sprintf("i%d", i), perIteration)
					b.StartTimer()
					began := time.Now()
					var rs []*running
					for range replicas {
						rs = append(rs, start(b, pool, &dispatcher.Config{
							Kinds:     kinds("charge.create", dispatcher.Kind{Provider: fake}),
							Workers:   max(32, batch),
							BatchSize: batch,
						}))
					}
					waitStates(b, pool, 5*time.Minute, map[effects.State]int{effects.Confirmed: perIteration * (i + 1)})
					drained += time.Since(began)
					b.StopTimer()
					for _, r := range rs {
						r.stop(b)
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(perIteration*b.N)/drained.Seconds(), "effects/s")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkHealthyNextToHung reports a healthy provider's drain rate
// (effects/s from pending to confirmed) in three settings, with 32
// workers: "alone", a dispatcher serving it and a mail provider with
// nothing to send; "next-to-hung", the same with the mail provider never
// answering and more mail due than its share, so its hung calls hold its
// whole share throughout; and "only-provider", a dispatcher serving the
// healthy provider alone (every worker its own), for reference. The
// healthy fake answers after latency (0: at once). Each iteration
// enqueues 3,000 webhooks (not timed), then times their drain.
func BenchmarkHealthyNextToHung(b *testing.B) {
	const perIteration = 3000
	for _, latency := range []time.Duration{0, 2 * time.Millisecond} {
		for _, setting := range []string{"alone", "next-to-hung", "only-provider"} {
			b.Run(fmt.Sprintf("latency=%s/%s", latency, setting), func(b *testing.B) {
				pool := pgtest.DB(b)
				hook := providertest.New(providertest.Config{Name: "hook", Idempotent: true, Latency: latency, MaxRecords: 1})
				mail := providertest.New(providertest.Config{Name: "mail", MaxRecords: 1,
					Faults: func(providers.Call, int) providertest.Fault { return providertest.Hang }})
				ks := map[string]dispatcher.Kind{"webhook.order_paid": {Provider: hook, Timeout: 50 * time.Second}}
				if setting != "only-provider" {
					ks["email.receipt"] = dispatcher.Kind{Provider: mail, Timeout: 50 * time.Second}
				}
				var drained time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					enqueue(b, pool, "webhook.order_paid", fmt.Sprintf("i%d", i), perIteration)
					if setting == "next-to-hung" {
						enqueue(b, pool, "email.receipt", fmt.Sprintf("i%d", i), 64)
					}
					b.StartTimer()
					began := time.Now()
					r := start(b, pool, &dispatcher.Config{Kinds: ks, Workers: 32, ShutdownTimeout: 10 * time.Millisecond})
					waitFor(b, 5*time.Minute, func() (bool, string) {
						n := confirmedOf(b, pool, "webhook.order_paid")
						return n == perIteration*(i+1), fmt.Sprintf("%d webhooks confirmed", n)
					})
					drained += time.Since(began)
					b.StopTimer()
					if setting == "next-to-hung" {
						if st := mail.Stats(); st.InFlight != 16 {
							b.Fatalf("mail in flight %d at the end of the drain, want its share of 16", st.InFlight)
						}
					}
					r.stop(b)
					b.StartTimer()
				}
				b.ReportMetric(float64(perIteration*b.N)/drained.Seconds(), "effects/s")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
