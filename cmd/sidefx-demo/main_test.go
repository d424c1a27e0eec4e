package main

import "testing"

// Its flags are checked before anything starts: help exits 0, nonsense 2.
func TestRun_Flags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"-h"}, 0},
		{[]string{"--orders", "0"}, 2},
		{[]string{"--no-such-flag"}, 2},
		{[]string{"extra"}, 2},
		{[]string{"--timeout-rate", "2"}, 2},
		{[]string{"--sidefx", "/no/such/sidefx"}, 2},
	} {
		if got := run(c.args); got != c.want {
			t.Errorf("sidefx-demo %q: exit %d, want %d", c.args, got, c.want)
		}
	}
}
