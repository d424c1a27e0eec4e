package schedule_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/internal/schedule"
)

// "@every D" ticks at multiples of D since the epoch, whenever it is asked:
// two replicas started apart compute the same ticks, and can claim each
// once.
func TestParse_EveryIsAlignedAcrossReplicas(t *testing.T) {
	s, err := schedule.Parse("@every 10m")
	if err != nil {
		t.Fatal(err)
	}
	a, b := time.Date(2026, 11, 25, 10, 3, 7, 0, time.UTC), time.Date(2026, 11, 25, 10, 8, 59, 0, time.UTC)
	if na, nb := s.Next(a), s.Next(b); !na.Equal(nb) || !na.Equal(time.Date(2026, 11, 25, 10, 10, 0, 0, time.UTC)) {
		t.Fatalf("next ticks %s and %s, want both 10:10", na, nb)
	}
	if c, err := schedule.Parse("*/5 * * * *"); err != nil || !c.Next(a).Equal(time.Date(2026, 11, 25, 10, 5, 0, 0, time.UTC)) {
		t.Fatalf("a cron spec: %v", err)
	}
	for _, bad := range []string{"every tuesday", "TZ=", "CRON_TZ=Nowhere/Land * * * * *", ""} {
		if _, err := schedule.Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Start calls the job at each tick until stopped, and stop waits for it.
func TestStart_RunsAtTicksUntilStopped(t *testing.T) {
	s, err := schedule.Parse("@every 50ms")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ticks []time.Time
	got := make(chan struct{}, 16)
	stop := schedule.Start(context.Background(), s, func(_ context.Context, tick time.Time) {
		mu.Lock()
		ticks = append(ticks, tick)
		mu.Unlock()
		got <- struct{}{}
	})
	deadline := time.After(10 * time.Second)
	for range 3 {
		select {
		case <-got:
		case <-deadline:
			t.Fatal("three ticks did not come within 10 s")
		}
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	for i, tick := range ticks {
		if tick.UnixNano()%int64(50*time.Millisecond) != 0 || (i > 0 && !tick.After(ticks[i-1])) {
			t.Errorf("tick %d: %s is not a later multiple of 50ms", i, tick)
		}
	}
}
