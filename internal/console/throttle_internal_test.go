package console

import (
	"fmt"
	"testing"
	"time"
)

// The throttle remembers at most throttleKeep blocks: each new one past it
// forgets the block that failed least recently, and the map and the list
// stay at the cap. A block that failed again is kept as recent.
func TestThrottle_MemoryStaysAtItsCap(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	th := newThrottle(func() time.Time { return now })
	v6 := func(i int) string { return fmt.Sprintf("2001:db8:%x:%x::%x", i>>16, i&0xffff, i) }
	th.failed(v6(0))
	for i := 1; i < 3*throttleKeep; i++ {
		th.failed(v6(i))
		if i%1000 == 0 {
			th.failed(v6(0)) // kept recent
		}
		if len(th.by) > throttleKeep || th.lru.Len() != len(th.by) {
			t.Fatalf("after %d blocks: %d in the map, %d in the list; cap %d", i+1, len(th.by), th.lru.Len(), throttleKeep)
		}
	}
	if len(th.by) != throttleKeep {
		t.Fatalf("%d blocks remembered, want the cap %d", len(th.by), throttleKeep)
	}
	if _, ok := th.by[addrBlock(v6(0))]; !ok {
		t.Error("a block failing again was forgotten")
	}
	if _, ok := th.by[addrBlock(v6(1))]; ok {
		t.Error("the block that failed least recently is still remembered")
	}
	if _, ok := th.by[addrBlock(v6(3*throttleKeep-1))]; !ok {
		t.Error("the last block is not remembered")
	}
}

func TestAddrBlock(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"2001:db8:7:9:1:2:3:4":  "2001:db8:7:9::/64",
		"2001:db8:7:9::1":       "2001:db8:7:9::/64",
		"fe80::1%eth0":          "fe80::/64",
		"198.51.100.7":          "198.51.100.7",
		"::ffff:198.51.100.7":   "198.51.100.7",
		"not an address":        "not an address",
		"2001:db8:7:a:ffff::ff": "2001:db8:7:a::/64",
	} {
		if got := addrBlock(in); got != want {
			t.Errorf("addrBlock(%q) = %q, want %q", in, got, want)
		}
	}
}
