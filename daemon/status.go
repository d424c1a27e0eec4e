package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// statusKind is one kind's line of sidefx status --json.
type statusKind struct {
	Kind string `json:"kind"`
	// States counts its effects in each state (every state, 0 for none).
	States map[effects.State]int64 `json:"states"`
	// OldestPendingSeconds is how long the pending effect due the longest
	// has been due: 0 when every pending effect is scheduled for later or
	// backing off, null when none is pending.
	OldestPendingSeconds *float64 `json:"oldest_pending_seconds"`
}

// statusJSON is sidefx status --json.
type statusJSON struct {
	Kinds []statusKind `json:"kinds"`
	// Total counts the effects of every kind by state.
	Total map[effects.State]int64 `json:"total"`
	// Uncertain and Failed wait for an operator.
	Uncertain int64 `json:"uncertain"`
	Failed    int64 `json:"failed"`
	// UnservedPending counts, by kind, the pending effects of the kinds
	// no live dispatcher serves.
	UnservedPending map[string]int64 `json:"unserved_pending"`
	Paused          []pauseJSON      `json:"paused"`
}

// statusDatabaseJSON is one database's status, in sidefx status --json of
// a configuration with several databases.
type statusDatabaseJSON struct {
	Database string `json:"database"`
	statusJSON
}

// statusDatabasesJSON is sidefx status --json of a configuration with
// several databases and no --database: a status per database.
type statusDatabasesJSON struct {
	Databases []statusDatabaseJSON `json:"databases"`
}

func statusCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("status", io)
	asJSON := fs.Bool("json", false, "print JSON (\"JSON output\" in docs/operations.md describes the fields)")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := c.loadConfig(io)
	if err != nil {
		return err
	}
	if cfg == nil || len(cfg.Databases) < 2 || c.dbName != "" || c.databaseURL != "" {
		_, err := status(ctx, io, c, *asJSON, true)
		return err
	}
	// Several databases: a section each, or a list in the JSON.
	var all statusDatabasesJSON
	for i, name := range cfg.DatabaseNames() {
		one := *c
		one.dbName = name
		if !*asJSON {
			if i > 0 {
				fmt.Fprintln(io.Out)
			}
			fmt.Fprintf(io.Out, "database %s\n", name)
		}
		st, err := status(ctx, io, &one, *asJSON, false)
		if err != nil {
			return fmt.Errorf("database %s: %w", name, err)
		}
		if *asJSON {
			all.Databases = append(all.Databases, statusDatabaseJSON{Database: name, statusJSON: *st})
		}
	}
	if *asJSON {
		return writeJSON(io.Out, all)
	}
	return nil
}

// status reports the effects of the database c names, as text or JSON;
// the JSON is returned, and printed if printJSON.
func status(ctx context.Context, io *IO, c *common, asJSON, printJSON bool) (*statusJSON, error) {
	pool, store, err := c.open(ctx, io)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	stats, err := store.Stats(ctx)
	if err != nil {
		return nil, schemaProblem(ctx, pool, store.Schema(), err)
	}
	pauses, err := store.Pauses(ctx)
	if err != nil {
		return nil, schemaProblem(ctx, pool, store.Schema(), err)
	}
	total := allStates(nil)
	var kinds []statusKind
	// The pending effects of kinds no live dispatcher serves, by kind.
	unserved := map[string]int64{}
	var unservedStats []effects.KindStats
	for _, s := range stats {
		if s.Unserved && s.ByState[effects.Pending] > 0 {
			unserved[s.Kind] = s.ByState[effects.Pending]
			unservedStats = append(unservedStats, s)
		}
		k := statusKind{Kind: s.Kind, States: allStates(s.ByState)}
		if s.ByState[effects.Pending] > 0 {
			oldest := s.OldestPending.Seconds()
			k.OldestPendingSeconds = &oldest
		}
		kinds = append(kinds, k)
		for st, n := range s.ByState {
			total[st] += n
		}
	}
	if asJSON {
		st := statusJSON{Kinds: kinds, Total: total, Uncertain: total[effects.Uncertain], Failed: total[effects.Failed],
			UnservedPending: unserved, Paused: pausedJSON(pauses)}
		if !printJSON {
			return &st, nil // one of several: the caller prints the list
		}
		enc := json.NewEncoder(io.Out)
		enc.SetIndent("", "  ")
		return &st, enc.Encode(st)
	}
	// The text stays a screenful however many kinds producers wrote: the
	// kinds a dispatcher serves each have a row, and past statusUnservedRows
	// the kinds nothing serves are summed in one (the JSON has them all).
	var other *statusKind
	otherKinds := 0
	if len(unservedStats) > statusUnservedRows {
		keep := kinds[:0]
		seen := 0
		other = &statusKind{States: map[effects.State]int64{}}
		for i, k := range kinds {
			if stats[i].Unserved {
				if seen++; seen > statusUnservedRows {
					otherKinds++
					for st, n := range k.States {
						other.States[st] += n
					}
					continue
				}
			}
			keep = append(keep, k)
		}
		kinds = keep
		other.Kind = fmt.Sprintf("(%d more unserved kinds)", otherKinds)
		kinds = append(kinds, *other)
	}
	w := tabwriter.NewWriter(io.Out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(w, "KIND\t")
	for _, st := range effects.States {
		fmt.Fprintf(w, "%s\t", st)
	}
	fmt.Fprintln(w, "oldest pending\t")
	for _, k := range kinds {
		fmt.Fprintf(w, "%s\t", printable(k.Kind))
		for _, st := range effects.States {
			fmt.Fprintf(w, "%d\t", k.States[st])
		}
		fmt.Fprintf(w, "%s\t\n", oldestPending(k.OldestPendingSeconds))
	}
	fmt.Fprint(w, "total\t")
	for _, st := range effects.States {
		fmt.Fprintf(w, "%d\t", total[st])
	}
	fmt.Fprintln(w, "\t")
	if err := w.Flush(); err != nil {
		return nil, err
	}
	var advise func(kind string) string
	if len(unservedStats) > 0 {
		advise = unservedAdvisor(ctx, c, io, store)
	}
	for i, s := range unservedStats {
		if i == statusUnservedRows {
			var pending int64
			for _, r := range unservedStats[i:] {
				pending += r.ByState[effects.Pending]
			}
			fmt.Fprintf(io.Out, "\n%d pending effects of %d more kinds wait for a dispatcher: no live dispatcher serves them (sidefx status --json lists them all).\n",
				pending, len(unservedStats)-i)
			break
		}
		fmt.Fprintf(io.Out, "\n%d pending %s effects wait for a dispatcher: no live dispatcher serves %s (the oldest due %s ago). %s\n",
			s.ByState[effects.Pending], printable(s.Kind), printable(s.Kind), s.OldestPending.Round(time.Second), advise(s.Kind))
	}
	var kp kindProviders
	var cfg *config.Config
	for _, p := range pauses {
		covers := ""
		if p.Scope == effects.PauseProvider {
			if kp.of == nil {
				// What a provider's pause holds back: the kinds it serves,
				// from the configuration, else the dispatchers.
				cfg, _ = c.loadConfig(io)
				live, _ := store.KindStatuses(ctx)
				kp = loadKindProviders(ctx, cfg, live, store)
			}
			if ks := kp.kindsOf(p.Name); len(ks) > 0 {
				for i := range ks {
					ks[i] = printable(ks[i])
				}
				covers = " It holds back the kinds " + strings.Join(ks, ", ") + "."
			} else {
				covers = " Which kinds it serves is not known here: " + strings.Replace(kp.unknownWhy(cfg), "the kind", "a kind of it", 1) + "."
			}
		}
		fmt.Fprintf(io.Out, "\n%s %s is paused since %s by %s (%s): none of its effects is claimed until sidefx resume --%s %s.%s\n",
			p.Scope, printable(p.Name), p.PausedAt.UTC().Format(time.RFC3339), printable(p.Actor), orDash(printable(p.Note)), p.Scope, printable(p.Name), covers)
	}
	if total[effects.Uncertain]+total[effects.Failed] > 0 {
		fmt.Fprintf(io.Out, "\n%d uncertain and %d failed effects wait for an operator: sidefx inspect, retry, resolve.\n", total[effects.Uncertain], total[effects.Failed])
	}
	return nil, nil
}

// statusUnservedRows is how many kinds no live dispatcher serves sidefx
// status names one by one; the rest are summed.
const statusUnservedRows = 20

// oldestPending says how long the pending effect due the longest has been
// due, or that none is pending, or none due yet.
func oldestPending(seconds *float64) string {
	switch {
	case seconds == nil:
		return "nothing pending"
	case *seconds <= 0:
		return "none due yet"
	}
	return time.Duration(*seconds * float64(time.Second)).Round(time.Second).String()
}

// allStates is n with every state in it, 0 for the ones it lacks.
func allStates(n map[effects.State]int64) map[effects.State]int64 {
	out := make(map[effects.State]int64, len(effects.States))
	for _, st := range effects.States {
		out[st] = n[st]
	}
	return out
}

// unservedAdvisor returns what to say about a kind no live dispatcher
// serves: start the daemon that serves it, when the configuration given has
// it or a dispatcher served it before; else add it to a daemon's
// configuration, or check its spelling, naming the close known kinds. It
// reads the configuration and the registered kinds once, for every kind.
func unservedAdvisor(ctx context.Context, c *common, io *IO, store *engine.Store) func(kind string) string {
	configured := map[string]bool{}
	if cfg, err := c.loadConfig(io); err == nil && cfg != nil {
		for k := range cfg.Kinds {
			configured[k] = true
		}
	}
	registered, err := store.RegisteredKinds(ctx)
	if err != nil {
		registered = nil // an older schema, or no SELECT on sidefx_kinds
	}
	return func(kind string) string {
		switch {
		case configured[kind]:
			return "The configuration serves it: start sidefx run with it (or see why its daemons are down)."
		case slices.Contains(registered, kind):
			return "A dispatcher served it before: start the daemon that serves it (or see why it is down)."
		}
		return "Add the kind to a daemon's configuration, or check its spelling" + closeOnes(kind, registered) + "."
	}
}
