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
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/providers"
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
	// cancelled (the scenario ran to the end). Otherwise pending and fired
	// effects are allowed: a stop while the database is unreachable
	// legitimately leaves fired effects, even past their lease, for the
	// rescuer. Scenarios that must leave none fired check the states
	// themselves.
	Settled bool
}

// Violation is one broken promise.
type Violation struct {
	Key, Kind string
	What      string
}

func (v Violation) String() string { return fmt.Sprintf("%s %s: %s", v.Kind, v.Key, v.What) }

// Check reads every effect and compares it with what the fakes performed.
// Beyond the counts, it holds the attempt number to its promise as the
// fencing token: no call carries an attempt the row never reached (a call
// made without its claim recorded), and a confirmed row's attempt had a call
// answered confirmed with the row's reference (no outcome recorded for
// another attempt than the one it answered), unless an operator resolved
// it or a late answer of an earlier attempt, confirmed by a call, did.
func Check(ctx context.Context, store *engine.Store, exp Expect) ([]Violation, error) {
	// The fakes' calls are read before the rows and again after them. A call
	// recorded before is for an attempt its claim had already committed, so
	// every row read later has reached that attempt; an answer recorded
	// after is complete for every outcome the rows hold.
	before := map[*providertest.Fake][]providertest.CallRecord{}
	for _, k := range exp.Kinds {
		if _, ok := before[k.Fake]; k.Fake != nil && !ok {
			before[k.Fake] = k.Fake.AllCalls()
		}
	}
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
	seen := map[*providertest.Fake]callLog{}
	for f, recs := range before {
		seen[f] = snapshot(f, recs)
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
			sn := seen[k.Fake]
			calls := sn.after[key]
			idempotent := k.Fake.Idempotent()
			switch {
			case idempotent && performed > 1:
				bad(kind, key, "performed %d times at an idempotent provider", performed)
			case !idempotent && !k.AtLeastOnce && performed > 1:
				bad(kind, key, "performed %d times at a provider without keys: at most once was promised", performed)
			}
			// Attempts are fencing tokens: each call is made for an attempt
			// the claim recorded first, so no call can carry a higher one.
			if a := maxAttempt(sn.before[key]); a > e.Attempts {
				bad(kind, key, "the provider was called for attempt %d, but the row reached only attempt %d: a call was made without its claim being recorded", a, e.Attempts)
			}
			switch e.State {
			case effects.Confirmed:
				switch {
				case performed == 0:
					bad(kind, key, "confirmed, but the provider never performed it")
				// Calls are kept unless the fake caps its records.
				case e.ProviderRef != "" && len(calls) > 0 && !refSeen(calls, e.ProviderRef):
					bad(kind, key, "confirmed with reference %q, which no call to the provider returned", e.ProviderRef)
				// An outcome is recorded for the attempt it answers, so some
				// call of the row's attempt was confirmed; a late answer of an
				// earlier attempt is recorded too, and says so in the history.
				case !sn.capped && !confirmedAt(calls, e.Attempts, e.ProviderRef) && !confirmedOtherwise(ctx, store, e.ID, calls):
					bad(kind, key, "confirmed at attempt %d, but no call of attempt %d was confirmed%s (calls: %s): the outcome of a stale attempt was recorded",
						e.Attempts, e.Attempts, withRef(e.ProviderRef), describe(calls))
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

// callLog is a fake's call records by key: before, read before the rows;
// after, read after them. capped: the fake keeps fewer records than it
// received calls, so after may lack some.
type callLog struct {
	before, after map[string][]providertest.CallRecord
	capped        bool
}

func snapshot(f *providertest.Fake, before []providertest.CallRecord) callLog {
	st := f.Stats() // before the records: a call recorded since then is not missing
	after := f.AllCalls()
	return callLog{before: byKey(before), after: byKey(after), capped: len(after) < st.Calls}
}

func byKey(recs []providertest.CallRecord) map[string][]providertest.CallRecord {
	m := map[string][]providertest.CallRecord{}
	for _, r := range recs {
		m[r.Key] = append(m[r.Key], r)
	}
	return m
}

func maxAttempt(calls []providertest.CallRecord) int {
	n := 0
	for _, c := range calls {
		n = max(n, c.Attempt)
	}
	return n
}

// confirmedAt reports whether a call of attempt was answered confirmed, with
// ref unless ref is empty.
func confirmedAt(calls []providertest.CallRecord, attempt int, ref string) bool {
	for _, c := range calls {
		if c.Attempt == attempt && c.Class == providers.Confirmed && (ref == "" || c.Ref == ref) {
			return true
		}
	}
	return false
}

// confirmedOtherwise reports whether effect id was made confirmed by
// something else than the outcome of its current attempt: an operator's
// resolve, or a late answer of an earlier attempt (recorded after its lease
// was rescued) that some call was answered confirmed with.
func confirmedOtherwise(ctx context.Context, store *engine.Store, id int64, calls []providertest.CallRecord) bool {
	evs, err := store.History(ctx, id)
	if err != nil {
		return false
	}
	for _, ev := range evs {
		switch {
		case ev.To != effects.Confirmed:
		case ev.Action == "late_answer":
			for _, c := range calls {
				if c.Class == providers.Confirmed && c.Ref == ev.ProviderRef {
					return true
				}
			}
		default:
			return true
		}
	}
	return false
}

func withRef(ref string) string {
	if ref == "" {
		return ""
	}
	return fmt.Sprintf(" with reference %q", ref)
}

// describe lists the attempt and answer of each call, for a violation.
func describe(calls []providertest.CallRecord) string {
	if len(calls) == 0 {
		return "none"
	}
	parts := make([]string, len(calls))
	for i, c := range calls {
		class := "in flight"
		if c.Class != 0 {
			class = c.Class.String()
		}
		parts[i] = fmt.Sprintf("attempt %d %s", c.Attempt, class)
	}
	return strings.Join(parts, ", ")
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
