// Package invariant checks, after a scenario, the promises sidefx makes:
// nothing lost, nothing done twice that must be done once, nothing reported
// done that was not. Every reliability scenario ends with Check.
package invariant

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/providers/providertest"
)

// Kind says how to judge the effects of one kind: by the fake provider that
// performed them.
type Kind struct {
	Fake *providertest.Fake
	// AtLeastOnce: the kind accepts duplicates (a non-idempotent provider
	// retried after unknown outcomes); it must still be performed.
	AtLeastOnce bool
}

// Expect describes the scenario.
type Expect struct {
	// Keys are the idempotency keys of every effect enqueued, by kind.
	Keys map[string][]string
	// Kinds judge each kind's effects.
	Kinds map[string]Kind
	// Settled: every effect must be confirmed, failed, uncertain or
	// cancelled (the scenario ran to the end). Otherwise pending effects are
	// allowed, and fired ones only with a live lease.
	Settled bool
}

// Violation is one broken promise.
type Violation struct {
	Key, Kind string
	What      string
}

func (v Violation) String() string { return fmt.Sprintf("%s %s: %s", v.Kind, v.Key, v.What) }

// Check reads every effect and compares it with what the fakes performed.
func Check(ctx context.Context, store *effects.Store, exp Expect) ([]Violation, error) {
	var rows []*effects.Effect
	for after := int64(0); ; {
		page, err := store.List(ctx, effects.Filter{AfterID: after, Limit: 10000})
		if err != nil {
			return nil, fmt.Errorf("invariant check: %w", err)
		}
		rows = append(rows, page...)
		if len(page) < 10000 {
			break
		}
		after = page[len(page)-1].ID
	}
	byKey := make(map[string]*effects.Effect, len(rows))
	for _, e := range rows {
		byKey[e.Key] = e
	}
	var out []Violation
	bad := func(kind, key, format string, args ...any) {
		out = append(out, Violation{Key: key, Kind: kind, What: fmt.Sprintf(format, args...)})
	}
	for kind, keys := range exp.Keys {
		k, judged := exp.Kinds[kind]
		for _, key := range keys {
			e := byKey[key]
			if e == nil {
				bad(kind, key, "enqueued, but no row: lost")
				continue
			}
			switch {
			case e.State == effects.Fired && exp.Settled:
				bad(kind, key, "left fired (attempt %d) after the scenario ended", e.Attempts)
			case e.State == effects.Pending && exp.Settled:
				bad(kind, key, "left pending after the scenario ended")
			}
			if !judged {
				continue
			}
			performed := k.Fake.Performed(key)
			calls := k.Fake.Calls(key)
			idempotent := k.Fake.Idempotent()
			switch {
			case idempotent && performed > 1:
				bad(kind, key, "performed %d times at an idempotent provider", performed)
			case !idempotent && !k.AtLeastOnce && performed > 1:
				bad(kind, key, "performed %d times at a provider without keys: at most once was promised", performed)
			}
			switch e.State {
			case effects.Confirmed:
				if performed == 0 {
					bad(kind, key, "confirmed, but the provider never performed it")
				}
				// Calls are kept unless the fake caps its records.
				if e.ProviderRef != "" && len(calls) > 0 && !refSeen(calls, e.ProviderRef) {
					bad(kind, key, "confirmed with reference %q, which no call to the provider returned", e.ProviderRef)
				}
			case effects.Failed:
				if performed > 0 && !idempotent {
					bad(kind, key, "failed, but the provider performed it %d times", performed)
				}
			case effects.Uncertain:
				if len(calls) == 0 && e.Attempts == 0 {
					bad(kind, key, "uncertain without ever being attempted")
				}
				if !idempotent && !k.AtLeastOnce && len(unknownCalls(calls)) > 1 {
					bad(kind, key, "uncertain after %d unknown outcomes: an unknown outcome was retried", len(unknownCalls(calls)))
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

func refSeen(calls []providertest.CallRecord, ref string) bool {
	for _, c := range calls {
		if c.Ref == ref {
			return true
		}
	}
	return false
}

func unknownCalls(calls []providertest.CallRecord) []providertest.CallRecord {
	var out []providertest.CallRecord
	for _, c := range calls {
		if c.Class.String() == "unknown" {
			out = append(out, c)
		}
	}
	return out
}

// Summary describes violations for a test failure, at most max of them.
func Summary(vs []Violation, max int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d invariant violations", len(vs))
	for i, v := range vs {
		if i == max {
			fmt.Fprintf(&b, "\n  … and %d more", len(vs)-max)
			break
		}
		b.WriteString("\n  " + v.String())
	}
	return b.String()
}
