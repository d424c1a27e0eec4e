package config

import "github.com/sidefx/sidefx/providers/ptype"

// Duration is a time.Duration written in the file as Go writes durations:
// "60s", "1m30s", "720h". A bare number is refused, since it has no unit.
// Zero (unset, or "0s") means the field's default. It is ptype.Duration,
// which the provider types' settings use too.
type Duration = ptype.Duration
