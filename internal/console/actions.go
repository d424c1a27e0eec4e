package console

import (
	"crypto/hmac"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/effects"
)

// note reads an action's note: required, it says why.
func note(r *http.Request) string { return strings.TrimSpace(r.PostFormValue("note")) }

const noteRequired = "a note is required: say why (it is recorded with your name)"

// act performs an action on one effect (POST /effects/{id}/{action}).
func (h *Handler) act(w http.ResponseWriter, r *http.Request, id *identity) {
	ctx := r.Context()
	eid, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		h.refuse(w, r, id, http.StatusNotFound, "no such effect")
		return
	}
	action, err := admin.ParseAction(r.PathValue("action"))
	if err != nil {
		h.refuse(w, r, id, http.StatusNotFound, err.Error())
		return
	}
	req := admin.Request{Action: action, Actor: id.Actor, Note: note(r), PastKeyWindow: r.PostFormValue("past_key_window") != "", Guard: h.keepHidden}
	if req.Note == "" {
		h.badRequest(w, r, id, noteRequired)
		return
	}
	e, err := h.cfg.Store.Get(ctx, eid)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	if action != admin.Supersede {
		// The attempt the page showed: a decision on it never applies to
		// a later attempt made since (Supersede names its version). Every
		// form carries it.
		n, err := strconv.Atoi(r.PostFormValue("attempt"))
		if err != nil || n < 0 {
			h.badRequest(w, r, id, "the form carries no attempt count: reload the effect's page and act from it")
			return
		}
		req.AtAttempt = &n
	}
	// And the version it showed. A supersede's payload replaces the one
	// shown, or nothing: its form must carry it, and the operations check
	// that it is still the effect's when they replace it. For the other
	// actions, a correction keeps the attempts, and a decision on the
	// payload read is not one on the payload that replaced it (a form
	// without it is the acting user's own choice to act on the effect as
	// it is).
	if v := r.PostFormValue("version"); (action == admin.Supersede || v != "") && !h.sameVersion(v, e) {
		h.fail(w, r, id, changed{&effects.ChangedError{ID: e.ID, Op: string(action), Now: e.Version()}, true})
		return
	}
	b := blotterOf(h.hider.hide(e.Payload).values)
	switch action {
	case admin.Resolve:
		switch as := effects.State(r.PostFormValue("as")); as {
		case effects.Confirmed:
			req.As, req.Ref = as, strings.TrimSpace(r.PostFormValue("ref"))
		case effects.Failed:
			req.As = as
		default:
			h.badRequest(w, r, id, "resolve: as confirmed or as failed")
			return
		}
	case admin.Supersede:
		written := strings.TrimSpace(r.PostFormValue("payload"))
		if written == "" || !json.Valid([]byte(written)) {
			h.badRequest(w, r, id, "supersede: the payload is not JSON")
			return
		}
		payload, err := h.hider.restore([]byte(written), e.Payload)
		if hw := new(hiddenWrite); errors.As(err, &hw) {
			h.refuse(w, r, id, http.StatusForbidden, "supersede: "+err.Error())
			return
		} else if err != nil {
			h.badRequest(w, r, id, "supersede: "+err.Error())
			return
		}
		req.Payload = payload
		b = append(b, blotterOf(h.hider.hide(payload).values)...)
	}
	if _, err := h.cfg.Ops.Apply(ctx, e, req); err != nil {
		err = h.opaque(e, unhashed(err))
		h.log.Info("console: action refused", "actor", id.Actor, "action", string(action), "effect", e.ID, "err", b.text(err.Error()))
		h.fail(w, r, id, blotted{err, b})
		return
	}
	h.log.Info("console: action", "actor", id.Actor, "role", id.Role.String(), "action", string(action), "effect", e.ID)
	http.Redirect(w, r, fmt.Sprintf("/effects/%d?done=%s", e.ID, action), http.StatusSeeOther)
}

// keepHidden refuses a superseding payload that changes, adds or removes
// a hidden field: no user of the console sees them, so none changes them
// (the CLI, with the database, does).
func (h *Handler) keepHidden(e *effects.Effect, payload json.RawMessage) error {
	field, err := h.hider.changedField(e.Payload, payload)
	if err != nil {
		return fmt.Errorf("supersede effect %d: %w", e.ID, err)
	}
	if field != "" {
		return &hiddenChange{id: e.ID, field: field}
	}
	return nil
}

// hiddenChange refuses a supersede that would change a hidden field.
type hiddenChange struct {
	id    int64
	field string
}

func (e *hiddenChange) Error() string {
	return fmt.Sprintf("supersede effect %d: refused, it would change the hidden field %s: the console keeps the fields it hides as they are (leave them as %q); sidefx supersede changes them", e.id, e.field, Hidden)
}

// version signs the version of e shown on its page (its id, revision and
// payload hash) with the console's key: the supersede form carries it, not
// the payload hash itself, which would let a reader test guesses of the
// hidden fields.
func (h *Handler) version(e *effects.Effect) string {
	return h.keys.macString("version", strconv.FormatInt(e.ID, 10), strconv.Itoa(e.Revision), hex.EncodeToString(e.PayloadHash))
}

// sameVersion reports whether v, a form's version, is e's.
func (h *Handler) sameVersion(v string, e *effects.Effect) bool {
	got, err := base64.RawURLEncoding.DecodeString(v)
	return err == nil && v != "" && hmac.Equal(got, h.keys.mac("version", strconv.FormatInt(e.ID, 10), strconv.Itoa(e.Revision), hex.EncodeToString(e.PayloadHash)))
}

// changed is an *effects.ChangedError as the console says it: by revision,
// never by payload hash.
type changed struct {
	err *effects.ChangedError
	// form: the form's version was found stale (it may also be from
	// before the console restarted, which changes its key).
	form bool
}

func (c changed) Error() string {
	if c.form {
		return fmt.Sprintf("%s effect %d: refused, it changed since you loaded its page, or the console restarted since (it is at revision %d): load it again",
			c.err.Op, c.err.ID, c.err.Now.Revision)
	}
	return fmt.Sprintf("%s effect %d: refused, it changed since it was read (it is at revision %d): load it again", c.err.Op, c.err.ID, c.err.Now.Revision)
}

func (c changed) Unwrap() error { return c.err }

// unhashed returns err with an *effects.ChangedError said by revision.
func unhashed(err error) error {
	var ce *effects.ChangedError
	if errors.As(err, &ce) {
		return changed{err: ce}
	}
	return err
}

// blotted is an error whose message has the hidden values blotted out; it
// wraps the error for errors.Is.
type blotted struct {
	err error
	b   blotter
}

func (e blotted) Error() string { return e.b.text(e.err.Error()) }
func (e blotted) Unwrap() error { return e.err }

// pause pauses or resumes a kind (operators) or a provider (admins).
func (h *Handler) pause(w http.ResponseWriter, r *http.Request, id *identity) {
	scope := effects.PauseScope(r.PostFormValue("scope"))
	switch scope {
	case effects.PauseKind:
	case effects.PauseProvider:
		if !id.Can(Admin) {
			h.refuse(w, r, id, http.StatusForbidden, "only an admin pauses or resumes a provider")
			return
		}
	default:
		h.badRequest(w, r, id, "pause a kind or a provider")
		return
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	op := r.PostFormValue("op")
	if name == "" || (op != "pause" && op != "resume") {
		h.badRequest(w, r, id, "name the "+string(scope)+" to pause or resume")
		return
	}
	n := note(r)
	if n == "" {
		h.badRequest(w, r, id, noteRequired)
		return
	}
	set := h.cfg.Ops.Resume
	if op == "pause" {
		set = h.cfg.Ops.Pause
	}
	changed, err := set(r.Context(), scope, name, id.Actor, n)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	h.log.Info("console: "+op, "actor", id.Actor, "role", id.Role.String(), "scope", string(scope), "name", name)
	done := map[bool]string{true: "paused", false: "resumed"}[op == "pause"]
	if !changed {
		done = "already"
	}
	http.Redirect(w, r, "/?done="+done, http.StatusSeeOther)
}

// bulkReq is a bulk action as its form gives it.
type bulkReq struct {
	req    admin.Request
	filter effects.Filter
	form   filterForm // with absolute times
	max    int
	as     string
	patch  string
}

// statusError is a refusal with its status.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

// readBulk reads a bulk action from v (the preview's query, or the
// confirmation's form): the action, its filter and its cap, which only an
// admin raises above admin.DefaultMax.
func (h *Handler) readBulk(v url.Values, id *identity) (bulkReq, error) {
	var b bulkReq
	action, err := admin.ParseAction(v.Get("action"))
	if err != nil {
		return b, &statusError{http.StatusBadRequest, err.Error()}
	}
	b.req = admin.Request{Action: action, Actor: id.Actor, Guard: h.keepHidden}
	b.as, b.patch = v.Get("as"), strings.TrimSpace(v.Get("patch"))
	switch {
	case action == admin.Resolve:
		if st := effects.State(b.as); st != effects.Confirmed && st != effects.Failed {
			return b, &statusError{http.StatusBadRequest, "resolve: as confirmed or as failed"}
		}
		b.req.As = effects.State(b.as)
	case b.as != "":
		b.as = ""
	}
	switch {
	case action == admin.Supersede:
		if b.patch == "" || !json.Valid([]byte(b.patch)) {
			return b, &statusError{http.StatusBadRequest, "supersede in bulk takes a patch: a JSON merge patch (RFC 7396) of each payload"}
		}
		// Decided from the patch alone: a patch that sets a hidden field
		// is refused before any effect is read, whatever their values.
		if field, err := h.hider.patchTouches([]byte(b.patch)); err != nil || field != "" {
			return b, &statusError{http.StatusForbidden, fmt.Sprintf("refused: the patch sets the hidden field %s: the console keeps the fields it hides as they are; sidefx bulk supersede changes them", field)}
		}
		b.req.Patch = json.RawMessage(b.patch)
	case b.patch != "":
		return b, &statusError{http.StatusBadRequest, "a patch is for supersede"}
	}
	if b.max, err = positiveInt(v.Get("max"), admin.DefaultMax); err != nil {
		return b, &statusError{http.StatusBadRequest, "cap: " + err.Error()}
	}
	if b.max > admin.DefaultMax && !id.Can(Admin) {
		return b, &statusError{http.StatusForbidden, fmt.Sprintf("only an admin raises the cap above %d", admin.DefaultMax)}
	}
	ff := readFilter(v)
	if b.filter, b.form, err = ff.filter(h.now()); err != nil {
		return b, &statusError{http.StatusBadRequest, err.Error()}
	}
	return b, nil
}

type bulkData struct {
	Action        admin.Action
	As, Patch     string
	Max, Default  int
	Form          filterForm
	Count         int64
	States        string
	Sample        []effectRow
	Over, Nothing bool
}

// bulkPreview shows what a bulk action would touch: the count, a sample
// and the cap, and the form that confirms it.
func (h *Handler) bulkPreview(w http.ResponseWriter, r *http.Request, id *identity) {
	if !id.Can(Operator) {
		h.refuse(w, r, id, http.StatusForbidden, fmt.Sprintf("a %s cannot act", id.Role))
		return
	}
	b, err := h.readBulk(r.URL.Query(), id)
	if err != nil {
		h.refuseErr(w, r, id, err)
		return
	}
	p, err := h.cfg.Ops.Preview(r.Context(), b.req, b.filter)
	if err != nil {
		h.fail(w, r, id, err)
		return
	}
	d := bulkData{Action: b.req.Action, As: b.as, Patch: b.patch, Max: b.max, Default: admin.DefaultMax, Form: b.form, Count: p.Count,
		Over: p.Count > int64(b.max), Nothing: p.Count == 0}
	var states []string
	for _, st := range p.Filter.States {
		states = append(states, string(st))
	}
	d.States = strings.Join(states, "/")
	for _, e := range p.Sample {
		d.Sample = append(d.Sample, h.row(e))
	}
	pg := h.newPage("Bulk "+string(b.req.Action), id)
	pg.D = d
	h.render(w, r, http.StatusOK, "bulk", pg)
}

type doneData struct {
	Action  admin.Action
	Done    []int64
	Skipped []admin.Skip
	More    bool // the cap was reached with more effects matching
}

// bulk performs a confirmed bulk action.
func (h *Handler) bulk(w http.ResponseWriter, r *http.Request, id *identity) {
	b, err := h.readBulk(r.PostForm, id)
	if err != nil {
		h.refuseErr(w, r, id, err)
		return
	}
	if b.req.Note = note(r); b.req.Note == "" {
		h.badRequest(w, r, id, noteRequired)
		return
	}
	res, err := h.cfg.Ops.ApplyAll(r.Context(), b.req, b.filter, b.max)
	if err != nil {
		h.log.Info("console: bulk action refused", "actor", id.Actor, "action", string(b.req.Action), "err", err)
		h.fail(w, r, id, err)
		return
	}
	h.log.Info("console: bulk action", "actor", id.Actor, "role", id.Role.String(), "action", string(b.req.Action),
		"done", len(res.Done), "skipped", len(res.Skipped), "cap", b.max)
	d := doneData{Action: b.req.Action, More: res.More}
	for _, e := range res.Done {
		d.Done = append(d.Done, e.ID)
	}
	for _, s := range res.Skipped {
		e, err := h.cfg.Store.Get(r.Context(), s.ID)
		if s.Err != nil {
			s.Reason = unhashed(s.Err).Error()
			if err == nil {
				s.Reason = h.opaque(e, unhashed(s.Err)).Error()
			}
		}
		// A refusal may quote the payload (a provider's check): blot it.
		if err == nil {
			values := h.hider.hide(e.Payload).values
			if merged, err := admin.MergePatch(e.Payload, b.req.Patch); len(b.req.Patch) > 0 && err == nil {
				values = append(values, h.hider.hide(merged).values...)
			}
			s.Reason = blotterOf(values).text(s.Reason)
		} else {
			s.Reason = "refused"
		}
		d.Skipped = append(d.Skipped, s)
	}
	// Post-redirect-get: a reload shows the outcome again, and never
	// sends the action again.
	key := h.results.put(id.Actor, "Bulk "+string(b.req.Action)+": done", d)
	http.Redirect(w, r, "/bulk/done/"+key, http.StatusSeeOther)
}

func (h *Handler) refuseErr(w http.ResponseWriter, r *http.Request, id *identity, err error) {
	var se *statusError
	if errors.As(err, &se) {
		h.refuse(w, r, id, se.status, se.msg)
		return
	}
	h.fail(w, r, id, err)
}

// opaque returns err, unless it is a superseding payload refused by its
// provider's check or by its size while e's payload holds a hidden field:
// then a refusal that says so and no more. Such a reason is about the
// payload with the hidden values restored, and may quote what the
// operator wrote: blotting the hidden values out of it would show a guess
// that is right as "(hidden)" and a wrong one as written, and the size
// counts the hidden values' length.
func (h *Handler) opaque(e *effects.Effect, err error) error {
	var ve *effects.ValidationError
	if !errors.As(err, &ve) || ve.Field != "payload" || len(h.hider.hide(e.Payload).values) == 0 {
		return err
	}
	if strings.Contains(ve.Reason, "provider can send") || strings.Contains(ve.Reason, "the limit is") {
		return fmt.Errorf("supersede effect %d: %w", e.ID, &effects.ValidationError{Index: -1, Field: "payload",
			Reason: "is refused by its provider's check or its size, with the fields the console hides restored; the reason may quote them, so it is not shown here: sidefx supersede shows it"})
	}
	return err
}
