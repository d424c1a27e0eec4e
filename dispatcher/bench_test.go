package dispatcher_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/pgtest"
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
