package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/reconcile"
)

func inspectCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("inspect", io)
	source := fs.String("source", "", "every effect of this source id")
	kind := fs.String("kind", "", "with --source: only this kind")
	asJSON := fs.Bool("json", false, "print JSON: an array of effects, each with its history and provider evidence (\"JSON output\" in docs/operations.md describes the fields)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if (*source == "") == (fs.NArg() == 0) {
		return usageErr("give an effect id or key, or --source")
	}
	pool, store, err := c.open(ctx, io)
	if err != nil {
		return err
	}
	defer pool.Close()
	var list []*effects.Effect
	switch {
	case *source != "" && *kind != "":
		e, err := store.GetBySource(ctx, *source, *kind)
		if err != nil {
			return err
		}
		list = []*effects.Effect{e}
	case *source != "":
		if list, err = store.List(ctx, effects.Filter{SourceID: *source, Limit: 1000}); err != nil {
			return err
		}
		if len(list) == 0 {
			return fmt.Errorf("no effect has source id %q", *source)
		}
	default:
		ref, err := oneArg(fs, "effect id or key")
		if err != nil {
			return err
		}
		e, err := lookup(ctx, store, ref)
		if err != nil {
			return err
		}
		list = []*effects.Effect{e}
	}
	type record struct {
		*effects.Effect
		Why      string // why a pending effect waits
		History  []effects.Event
		Evidence []reconcile.Stored // what the provider said of it: lookups and events
	}
	now, err := store.Now(ctx)
	if err != nil {
		return err
	}
	lim, err := c.limits(ctx, io, store)
	if err != nil {
		return err
	}
	kinds, cfg := lim.kinds, lim.cfg
	pauses, err := store.Pauses(ctx)
	if err != nil {
		return err
	}
	// The provider of each kind: the configuration's, else what the
	// dispatchers said (their heartbeats, the kinds registry).
	kp := loadKindProviders(ctx, cfg, kinds, store)
	providerPaused := false
	for _, p := range pauses {
		providerPaused = providerPaused || p.Scope == effects.PauseProvider
	}
	var recs []record
	for _, e := range list {
		h, err := store.History(ctx, e.ID)
		if err != nil {
			return err
		}
		ev, err := reconcile.Evidence(ctx, pool, store.Schema(), e.ID, e.Key)
		if err != nil {
			return err
		}
		why := effects.WhyPending(e, now, kinds)
		paused := false
		for _, p := range pauses {
			if e.State != effects.Pending {
				break // a pause holds back only what is pending
			}
			if (p.Scope == effects.PauseKind && p.Name == e.Kind) || (p.Scope == effects.PauseProvider && p.Name == kp.provider(e.Kind)) {
				paused = true
				why = fmt.Sprintf("its %s %s is paused since %s by %s (%s): sidefx resume --%s %s", p.Scope, printable(p.Name),
					p.PausedAt.UTC().Format(time.RFC3339), printable(p.Actor), orDash(printable(p.Note)), p.Scope, printable(p.Name))
			}
		}
		if e.State == effects.Pending && !paused && providerPaused && kp.provider(e.Kind) == "" {
			// A provider is paused, and whether it is this effect's is not
			// known here: say so rather than blame busy dispatchers.
			why += fmt.Sprintf(" (a provider is paused, and the provider of %s is not known here: %s; give --config to tell)",
				printable(e.Kind), kp.unknownWhy(cfg))
		}
		recs = append(recs, record{Effect: e, Why: why, History: h, Evidence: ev})
	}
	if *asJSON {
		out := []inspectJSON{}
		for _, r := range recs {
			j := inspectJSON{EffectJSON: lim.effect(r.Effect), WhyPending: effects.JSONText(r.Why),
				History: []effects.EventJSON{}, ProviderEvidence: []evidenceJSON{}}
			for _, h := range r.History {
				j.History = append(j.History, effects.NewEventJSON(h))
			}
			for _, s := range r.Evidence {
				j.ProviderEvidence = append(j.ProviderEvidence, newEvidenceJSON(s))
			}
			out = append(out, j)
		}
		enc := json.NewEncoder(io.Out)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	for i, r := range recs {
		if i > 0 {
			fmt.Fprintln(io.Out)
		}
		printEffect(io, r.Effect, r.Why, lim.text(r.Effect), r.History)
		printEvidence(io, r.Evidence, kp.provider(r.Kind))
	}
	return nil
}

// printEvidence prints what the providers said of an effect; provider,
// when known, is the one that serves its kind: what another provider said
// is marked as no evidence for it (reconciliation ignores it).
func printEvidence(io *IO, ev []reconcile.Stored, provider string) {
	if len(ev) == 0 {
		fmt.Fprintln(io.Out, "provider evidence	none (no lookup or event yet)")
		return
	}
	fmt.Fprintln(io.Out, "provider evidence:")
	for _, s := range ev {
		line := fmt.Sprintf("  %s  %s from %s: %s", when(s.RecordedAt), printable(s.Source), printable(s.Provider), s.Evidence.Verdict)
		if s.Evidence.Ref != "" {
			line += " " + printable(s.Evidence.Ref)
		}
		if s.Evidence.Status != "" {
			line += " (" + printable(s.Evidence.Status) + ")"
		}
		if !s.Evidence.At.IsZero() {
			line += " at " + when(s.Evidence.At)
		}
		if s.EventID != "" {
			line += ", event " + printable(s.EventID)
		}
		if provider != "" && s.Provider != provider {
			line += fmt.Sprintf(" — not evidence: the kind is served by %s, and reconciliation ignores what %s says of it", printable(provider), printable(s.Provider))
		}
		fmt.Fprintln(io.Out, line)
	}
}

// lookup finds an effect by id or by key.
func lookup(ctx context.Context, store *engine.Store, ref string) (*effects.Effect, error) {
	if derive.Valid(ref) {
		return store.GetByKey(ctx, ref)
	}
	id, err := strconv.ParseInt(ref, 10, 64)
	if err != nil || id <= 0 {
		return nil, usageErr("%q is neither an effect id nor a key (sfx1_…)", ref)
	}
	return store.Get(ctx, id)
}

// text says how many attempts e may make, and where that comes from, as
// sidefx inspect writes it ("5 (the kind's)").
func (l *limits) text(e *effects.Effect) string {
	a := l.of(e)
	switch a.Source {
	case effects.LimitEffect:
		return strconv.Itoa(a.Max)
	case effects.LimitKind:
		if a.UpTo != a.Max {
			return fmt.Sprintf("%d to %d (the kind's: its dispatchers differ)", a.Max, a.UpTo)
		}
		return fmt.Sprintf("%d (the kind's)", a.Max)
	case effects.LimitConfig:
		return fmt.Sprintf("%d (the kind's, in the configuration)", a.Max)
	}
	if l.kinds[e.Kind].Dispatchers > 0 {
		// Dispatchers of an earlier release do not report it.
		return fmt.Sprintf("%d (the default, unless its dispatchers set the kind's max_attempts)", a.Max)
	}
	return fmt.Sprintf("%d (the default)", a.Max)
}

func printEffect(io *IO, e *effects.Effect, why, maxA string, history []effects.Event) {
	w := tabwriter.NewWriter(io.Out, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(w, "%s\t%v\n", k, v) }
	row("effect", e.ID)
	row("source_id", printable(e.SourceID))
	row("kind", printable(e.Kind))
	if e.Revision > 0 {
		row("key", fmt.Sprintf("%s (revision %d: superseded, see the history)", e.Key, e.Revision))
	} else {
		row("key", e.Key)
	}
	row("state", e.State)
	if why != "" {
		row("why pending", printable(why))
	}
	row("attempts", fmt.Sprintf("%d of %s", e.Attempts, maxA))
	row("created", when(e.CreatedAt))
	if e.State == effects.Pending {
		// Only a pending effect has a next attempt; the column keeps the
		// last due time of the others.
		row("next attempt", when(e.NextAttemptAt))
	}
	row("first fired", when(e.FirstFiredAt))
	row("fired", when(e.FiredAt))
	if e.State == effects.Fired {
		row("lease until", when(e.LeaseUntil))
	}
	row("claimed by", orDash(printable(e.ClaimedBy)))
	row("confirmed", when(e.ConfirmedAt))
	row("updated", when(e.UpdatedAt))
	row("provider ref", orDash(printable(e.ProviderRef)))
	if e.Traceparent != "" {
		row("traceparent", printable(e.Traceparent))
	}
	row("last error", orDash(printable(e.LastError)))
	row("maybe performed", effects.WhetherPerformed(e))
	if e.Flag != "" {
		row("flag", printable(e.Flag))
	}
	if !e.ReapedAt.IsZero() {
		row("tombstone", "reaped at "+when(e.ReapedAt)+": payload and stored answer dropped; the key and guard stay")
	} else {
		row("payload", printable(string(e.Payload)))
		row("payload hash", fmt.Sprintf("%x (sidefx supersede --expect-hash)", e.PayloadHash))
		row("outcome", orDash(printable(string(e.Outcome))))
	}
	w.Flush()
	if len(history) == 0 {
		fmt.Fprintln(io.Out, "history\tno operator action")
		return
	}
	fmt.Fprintln(io.Out, "history:")
	for _, h := range history {
		line := fmt.Sprintf("  %s  %s %s → %s by %s", when(h.At), h.Action, h.From, h.To, printable(h.Actor))
		if h.ProviderRef != "" {
			line += " ref " + printable(h.ProviderRef)
		}
		if h.Action == "supersede" {
			line += fmt.Sprintf(" key %s → %s, payload hash %x → %x", h.OldKey, h.NewKey, h.OldPayloadHash, h.NewPayloadHash)
		}
		if h.Note != "" {
			line += ": " + printable(h.Note)
		}
		// Schema 37: the key window a retry or refire used, whether it
		// started again, and the database login behind the actor.
		if h.WindowRestarted {
			line += fmt.Sprintf(" [past the key window of %s: window and key epoch started again]", h.KeyWindow)
		} else if h.KeyWindow > 0 {
			line += fmt.Sprintf(" [key window %s]", h.KeyWindow)
		}
		if h.Login != "" {
			line += " [login " + printable(h.Login) + "]"
		}
		fmt.Fprintln(io.Out, strings.TrimRight(line, " "))
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// when formats a time for inspect, "-" for none.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}
