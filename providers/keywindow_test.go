package providers_test

import (
	"context"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers"
)

// windowed is a provider with a key window.
type windowed struct {
	idempotent bool
	window     time.Duration
}

func (w windowed) Name() string     { return "windowed" }
func (w windowed) Idempotent() bool { return w.idempotent }
func (w windowed) Call(context.Context, providers.Call) providers.Result {
	return providers.Unsure(nil)
}
func (w windowed) KeyWindow() time.Duration { return w.window }

// keyless declares no window.
type keyless struct{ windowed }

func TestKeyWindow(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		p    providers.Provider
		want time.Duration
	}{
		{"idempotent with a window", windowed{true, 24 * time.Hour}, 24 * time.Hour},
		{"not idempotent: no key to remember", windowed{false, 24 * time.Hour}, 0},
		{"a zero window", windowed{true, 0}, 0},
		{"a negative window", windowed{true, -time.Hour}, 0},
		{"no KeyWindow method", struct{ providers.Provider }{keyless{windowed{true, time.Hour}}}, 0},
		{"nil", nil, 0},
	}
	for _, c := range cases {
		if got := providers.KeyWindow(c.p); got != c.want {
			t.Errorf("%s: KeyWindow = %s, want %s", c.name, got, c.want)
		}
	}
}
