package console

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/reconcile"
)

// pageSize is how many effects a page of the list shows.
const pageSize = 50

// findingsShown bounds the reconciliation findings shown per run.
const findingsShown = 100

// kindRow is one kind's line of the overview.
type kindRow struct {
	Kind     string
	Counts   []int64 // by effects.States
	Oldest   time.Duration
	Unserved bool
}

type overviewData struct {
	Kinds             []kindRow
	Total             []int64 // by effects.States
	Uncertain, Failed int64
	OldestDue         time.Duration
	OldestKind        string
	Pauses            []effects.Pause
	KnownKinds        []string
	KnownProviders    []string
	Drift             *drift.RunRecord
	Reconcile         *reconcile.Run
	Providers         []providerRow
}

// providerRow is a provider's health, as the live dispatchers reported it
// at their last heartbeat.
type providerRow struct {
	Name        string
	Kinds       []string
	Dispatchers int // live dispatchers serving its kinds (the most for one kind)
	InFlight    int
	Limit       int
	Failures    int       // retryable or unknown answers in a row
	PausedUntil time.Time // a Retry-After the provider asked for; zero: none
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request, id *identity) {
	ctx := r.Context()
	stats, err := h.cfg.Store.Stats(ctx)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	pauses, err := h.cfg.Store.Pauses(ctx)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	dr, err := drift.Recent(ctx, h.cfg.DB, h.cfg.Schema, 1)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	rr, err := reconcile.Runs(ctx, h.cfg.DB, h.cfg.Schema, 1, findingsShown)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	d := overviewData{Total: make([]int64, len(effects.States)), Pauses: pauses}
	kinds := map[string]bool{}
	for _, s := range stats {
		row := kindRow{Kind: s.Kind, Counts: make([]int64, len(effects.States)), Oldest: s.OldestPending, Unserved: s.Unserved && s.ByState[effects.Pending] > 0}
		for i, st := range effects.States {
			row.Counts[i] = s.ByState[st]
			d.Total[i] += s.ByState[st]
		}
		if s.OldestPending > d.OldestDue {
			d.OldestDue, d.OldestKind = s.OldestPending, s.Kind
		}
		d.Kinds = append(d.Kinds, row)
		kinds[s.Kind] = true
	}
	for i, st := range effects.States {
		switch st {
		case effects.Uncertain:
			d.Uncertain = d.Total[i]
		case effects.Failed:
			d.Failed = d.Total[i]
		}
	}
	providers := map[string]bool{}
	for kind, p := range h.cfg.Providers {
		kinds[kind] = true
		if p.Name != "" {
			providers[p.Name] = true
		}
	}
	statuses, err := h.cfg.Store.KindStatuses(ctx)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	byProvider := map[string]*providerRow{}
	for _, kind := range slices.Sorted(maps.Keys(statuses)) {
		s := statuses[kind]
		name := s.Provider
		if name == "" {
			name = h.cfg.Providers[kind].Name
		}
		if name == "" {
			continue
		}
		pr := byProvider[name]
		if pr == nil {
			pr = &providerRow{Name: name}
			byProvider[name] = pr
		}
		pr.Kinds = append(pr.Kinds, kind)
		// A provider's numbers are the same for each of its kinds: the
		// largest reading stands.
		pr.Dispatchers, pr.InFlight, pr.Limit = max(pr.Dispatchers, s.Dispatchers), max(pr.InFlight, s.InFlight), max(pr.Limit, s.Limit)
		pr.Failures = max(pr.Failures, s.Failures)
		if s.Paused > 0 && s.PausedUntil.After(pr.PausedUntil) {
			pr.PausedUntil = s.PausedUntil
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byProvider)) {
		d.Providers = append(d.Providers, *byProvider[name])
	}
	d.KnownKinds = slices.Sorted(maps.Keys(kinds))
	d.KnownProviders = slices.Sorted(maps.Keys(providers))
	if len(dr) > 0 {
		d.Drift = &dr[0]
	}
	if len(rr) > 0 {
		d.Reconcile = &rr[0]
	}
	p := h.newPage("Overview", id)
	p.Flash = map[string]string{"paused": "Paused.", "resumed": "Resumed.", "already": "It was paused already."}[r.URL.Query().Get("done")]
	p.D = d
	h.render(w, r, http.StatusOK, "overview", p)
}

// effectRow is one effect of a list, its last error blotted.
type effectRow struct {
	*effects.Effect
	LastError string
	Due       string
}

func (h *Handler) row(e *effects.Effect) effectRow {
	b := blotterOf(h.hider.hide(e.Payload).values)
	due := "-"
	if e.State == effects.Pending && !e.NextAttemptAt.IsZero() {
		due = e.NextAttemptAt.UTC().Format("2006-01-02 15:04:05Z")
	}
	_, last := e.LatestError()
	return effectRow{Effect: e, LastError: b.text(last), Due: due}
}

type effectsData struct {
	Form    filterForm
	Rows    []effectRow
	Total   int64
	Next    string
	Actions []admin.Action
	Max     int
}

func (h *Handler) effectsPage(w http.ResponseWriter, r *http.Request, id *identity) {
	q := r.URL.Query()
	ff := readFilter(q)
	d := effectsData{Form: ff, Actions: admin.Actions, Max: admin.DefaultMax}
	p := h.newPage("Effects", id)
	f, _, err := ff.filter(h.now())
	if err != nil {
		p.Error = err.Error()
		p.D = d
		h.render(w, r, http.StatusBadRequest, "effects", p)
		return
	}
	if f.AfterID, err = int64Param(q.Get("after")); err != nil {
		h.badRequest(w, r, id, "after: "+err.Error())
		return
	}
	f.Limit = pageSize
	list, err := h.cfg.Store.List(r.Context(), f)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	if d.Total, err = h.cfg.Store.CountMatching(r.Context(), f); err != nil {
		h.fail(w, r, id, err)
		return
	}
	for _, e := range list {
		d.Rows = append(d.Rows, h.row(e))
	}
	if len(list) == pageSize {
		next := ff.Values()
		next.Set("after", strconv.FormatInt(list[len(list)-1].ID, 10))
		d.Next = "/effects?" + next.Encode()
	}
	p.D = d
	h.render(w, r, http.StatusOK, "effects", p)
}

func int64Param(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not an effect id", s)
	}
	return n, nil
}

// historyRow is one operator action, its note blotted.
type historyRow struct {
	effects.Event
	Note string
}

// evidenceRow is one piece of a provider's evidence, its detail blotted.
type evidenceRow struct {
	reconcile.Stored
	Detail string
	Link   string
}

type effectData struct {
	E                *effects.Effect
	Payload, Outcome string
	OutcomeAttempt   int // the attempt Outcome answered (0: not known)
	LastError        string
	Why              string
	MaybePerformed   string
	History          []historyRow
	Evidence         []evidenceRow
	Provider         Provider
	Link             string
	// The actions the effect's state allows (the operations check again).
	Retry, Resolve, Refire, Cancel, Supersede bool
	// Version is the version of the effect shown, signed (h.version), for
	// the supersede form.
	Version string
}

func (h *Handler) effectPage(w http.ResponseWriter, r *http.Request, id *identity) {
	ctx := r.Context()
	eid, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		h.refuse(w, r, id, http.StatusNotFound, "no such effect")
		return
	}
	e, err := h.cfg.Store.Get(ctx, eid)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	history, err := h.cfg.Store.History(ctx, e.ID)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	evidence, err := reconcile.Evidence(ctx, h.cfg.DB, h.cfg.Schema, e.ID, e.Key)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	s := h.hider.hide(e.Payload)
	b := blotterOf(s.values)
	// The latest attempt's error and answer only, each saying its attempt:
	// an earlier attempt's never stands beside them.
	_, last := e.LatestError()
	d := effectData{E: e, Payload: s.JSON, LastError: b.text(last), MaybePerformed: effects.WhetherPerformed(e), Provider: h.cfg.Providers[e.Kind]}
	if at, out := e.LatestOutcome(); len(out) > 0 {
		d.Outcome, d.OutcomeAttempt = b.text(indent(out)), at
	}
	d.Link = d.Provider.link(e.ProviderRef)
	for _, ev := range history {
		// A note is blotted for everyone but its author: shown to its
		// author as written, it tells them nothing they did not write,
		// where blotted it would answer a guess written into it (a right
		// one read "(hidden)", a wrong one as written).
		note := b.text(ev.Note)
		if ev.Actor == id.Actor {
			note = ev.Note
		}
		d.History = append(d.History, historyRow{Event: ev, Note: note})
	}
	for _, ev := range evidence {
		row := evidenceRow{Stored: ev, Link: h.provider(ev.Provider).link(ev.Evidence.Ref)}
		if len(ev.Evidence.Detail) > 0 {
			row.Detail = b.text(string(ev.Evidence.Detail))
		}
		d.Evidence = append(d.Evidence, row)
	}
	if e.State == effects.Pending {
		if d.Why, err = h.whyPending(r, e); err != nil {
			h.fail(w, r, id, err)
			return
		}
	}
	live := e.ReapedAt.IsZero()
	d.Retry = e.State == effects.Failed && live
	d.Resolve = e.State == effects.Uncertain
	d.Refire = e.State == effects.Uncertain && live
	d.Cancel = e.State == effects.Pending && !e.MaybePerformed()
	d.Supersede = (e.State == effects.Pending || e.State == effects.Failed) && !e.MaybePerformed() && live
	d.Version = h.version(e)
	p := h.newPage(fmt.Sprintf("Effect %d", e.ID), id)
	if a, err := admin.ParseAction(r.URL.Query().Get("done")); err == nil {
		p.Flash = fmt.Sprintf("Done: %s. The effect is %s now.", a, e.State)
	}
	p.D = d
	h.render(w, r, http.StatusOK, "effect", p)
}

// whyPending says why a pending effect waits, as sidefx inspect does.
func (h *Handler) whyPending(r *http.Request, e *effects.Effect) (string, error) {
	ctx := r.Context()
	now, err := h.cfg.Store.Now(ctx)
	if err != nil {
		return "", err
	}
	kinds, err := h.cfg.Store.KindStatuses(ctx)
	if err != nil {
		return "", err
	}
	pauses, err := h.cfg.Store.Pauses(ctx)
	if err != nil {
		return "", err
	}
	why := effects.WhyPending(e, now, kinds)
	for _, p := range pauses {
		if (p.Scope == effects.PauseKind && p.Name == e.Kind) || (p.Scope == effects.PauseProvider && p.Name == h.cfg.Providers[e.Kind].Name) {
			why = fmt.Sprintf("its %s %s is paused since %s by %s", p.Scope, p.Name, p.PausedAt.UTC().Format(time.RFC3339), p.Actor)
		}
	}
	return why, nil
}

// provider is the provider named name, as the configuration gave it.
func (h *Handler) provider(name string) Provider {
	for _, p := range h.cfg.Providers {
		if p.Name == name {
			return p
		}
	}
	return Provider{Name: name}
}

// link is the page of p's dashboard that shows ref, where there is one.
func (p Provider) link(ref string) string {
	if p.Link == nil || ref == "" {
		return ""
	}
	return p.Link(ref)
}

// indent indents a JSON document, or returns it as it is.
func indent(b []byte) string {
	v, err := decodeJSON(b)
	if err != nil {
		return string(b)
	}
	out, err := jsonIndent(v)
	if err != nil {
		return string(b)
	}
	return out
}

type runsData struct {
	Drift     []drift.RunRecord
	Reconcile []reconcile.Run
}

func (h *Handler) runs(w http.ResponseWriter, r *http.Request, id *identity) {
	dr, err := drift.Recent(r.Context(), h.cfg.DB, h.cfg.Schema, 20)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	rr, err := reconcile.Runs(r.Context(), h.cfg.DB, h.cfg.Schema, 20, findingsShown)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	p := h.newPage("Runs", id)
	p.D = runsData{Drift: dr, Reconcile: rr}
	h.render(w, r, http.StatusOK, "runs", p)
}

// counts lists a reconciliation run's counts by finding, in order.
func counts(m map[reconcile.FindingKind]int) []struct {
	Finding reconcile.FindingKind
	N       int
} {
	var out []struct {
		Finding reconcile.FindingKind
		N       int
	}
	for _, k := range slices.SortedFunc(maps.Keys(m), func(a, b reconcile.FindingKind) int { return cmp.Compare(a, b) }) {
		out = append(out, struct {
			Finding reconcile.FindingKind
			N       int
		}{k, m[k]})
	}
	return out
}
