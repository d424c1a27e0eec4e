package dispatcher

import (
	"testing"
	"time"

	"github.com/sidefx/sidefx/internal/engine"
)

// The memory of recorded outcomes is bounded in bytes and age, keeps the
// newest, and says whether it still holds all since a time.
func TestMemory_KeepsTheNewestWithinItsBounds(t *testing.T) {
	var m memory
	t0 := time.Now()
	for b := range 300 {
		outs, kinds := make([]engine.Outcome, 1000), make([]string, 1000)
		for i := range outs {
			outs[i] = engine.Outcome{ID: int64(b*1000 + i), Attempt: 1}
		}
		m.add(t0.Add(time.Duration(b)*time.Millisecond), outs, kinds)
	}
	got, covers := m.recent(t0.Add(time.Second), t0)
	if want := memoryBytes / 128; len(got) != want {
		t.Errorf("remembered %d, want %d (the bytes' bound)", len(got), want)
	}
	if last := got[len(got)-1].out.ID; last != 299_999 {
		t.Errorf("the newest remembered is %d, want 299999", last)
	}
	if first := got[0].out.ID; first != int64(300_000-len(got)) {
		t.Errorf("the oldest remembered is %d, want %d", first, 300_000-len(got))
	}
	if covers {
		t.Error("the memory says it holds all since the start, and it dropped some for room")
	}
	if _, covers := m.recent(t0.Add(time.Second), t0.Add(299*time.Millisecond)); !covers {
		t.Error("the memory says it lacks some of the last batch's")
	}
	if got, _ := m.recent(t0.Add(2*memoryFor), t0); len(got) != 0 || m.bytes != 0 {
		t.Errorf("past its age: %d remembered, %d bytes counted", len(got), m.bytes)
	}
}
