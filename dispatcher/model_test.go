package dispatcher_test

// The model checker: random interleavings of every operation on effects
// (enqueue and replays, claims by three workers, calls answered in every
// class, lost answers, stored 500s, late answers, lease expiry and rescue,
// lost claims, cancel, the operators' retry, resolve, refire, supersede and
// pauses, one by one and in bulk, reaping, time passing a key window) against a real PostgreSQL,
// the real Stripe and SendGrid providers, and reference models of the
// providers that record what was performed. The world is hostile: the
// providers answer before their idempotency layer too (a rolled API key's
// 401, 403, a routing 404, a validation 400, a key in use, 429, a key
// reused with other parameters), an intermediary answers in their place
// (a proxy's 200 HTML page, a 2xx JSON without their proof), they forget
// keys past their window and store
// 5xx; their events come late, twice, out of order, hours later, and name
// other providers' keys and other objects; the reconciler settles and
// refires with its clock moving. After every step it checks the
// invariants, counting performances per effect across all its revisions
// and keys. A failure prints rapid's seed and the shrunk sequence of
// steps.
//
// make test runs a short budget (-model.budget, default 20s); make model a
// long one (MODEL_BUDGET, default 5m).

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"pgregory.net/rapid"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/reconcile"
)

var modelBudget = flag.Duration("model.budget", 20*time.Second, "how long TestModel explores (make model sets minutes)")

const (
	kindCharge = "charge.create"  // Stripe: keyed, 24h window
	kindMail   = "email.receipt"  // SendGrid: keyless, at most once
	kindDigest = "email.digest"   // SendGrid: keyless, at least once
	keyWindow  = 24 * time.Hour   // Stripe's
	modelLease = 60 * time.Second // the claims' lease
)

var modelKinds = []string{kindCharge, kindMail, kindDigest}

// answer is how a model provider treats the next new request.
type answer string

const (
	answerOK        answer = "ok"         // performed, answered
	answerLost      answer = "lost"       // performed, the connection closed before the answer
	answer500Done   answer = "500-done"   // Stripe: began executing (performed), stored a 500
	answer500Undone answer = "500-undone" // Stripe: began executing, did nothing, stored a 500
	answer503       answer = "503"        // mail: unavailable
	answerDecline   answer = "decline"    // Stripe: card declined (stored); mail: 400
	answerInvalid   answer = "invalid"    // a validation error, not stored
	answer429       answer = "429"        // rate limited, not stored
	// Refusals made before the idempotency layer reads the key: they say
	// nothing of an earlier attempt under it.
	answer401      answer = "401"      // a rolled API key
	answer403      answer = "403"      // a key without the permission
	answer404      answer = "404"      // routed nowhere
	answer409      answer = "409"      // Stripe: the key in use by another request
	answerMismatch answer = "mismatch" // Stripe: idempotency_error, the key stored with other parameters
	// An intermediary answers in the provider's place (an egress proxy's
	// block page, a maintenance page, the host a wrong base URL points
	// at): the request never reaches the provider, nothing is performed.
	answerProxyPage answer = "proxy-page" // 200 text/html
	answerProxyJSON answer = "proxy-json" // 200 (mail: 202) JSON without the provider's proof
)

// writeIntermediary answers as something in front of the provider would,
// with none of the provider's marks (Stripe's Request-Id and object id,
// SendGrid's X-Message-Id).
func writeIntermediary(w http.ResponseWriter, a answer, status int) {
	if a == answerProxyPage {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "<html><body>This site is blocked by your organisation's policy.</body></html>") //nolint:errcheck // test server
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, `{"status":"ok"}`) //nolint:errcheck // test server
}

// modelEvent is an event a model provider sends about an object it made,
// or one it sends about somebody else's object carrying a sidefx key.
type modelEvent struct {
	provider, id, key, ref, status string
	at                             time.Time // model clock: when the object was made
	first                          bool      // SendGrid's "processed": it comes within eventsWithin
}

// charge is an object the Stripe model made.
type charge struct {
	ref, key, source, kind string
	created                time.Time // on the database's frame (shifted with it)
}

// keyState is what the Stripe model holds for one Idempotency-Key.
type keyState struct {
	storedAt  time.Time // zero: no stored answer
	status    int
	body      []byte
	performed int // objects created under this key
	ref       string
	refs      []string // every object created under this key
}

// providerModel is the reference model of both providers: what was
// performed, per key, on the model's clock.
type providerModel struct {
	mu    sync.Mutex
	clock time.Time
	next  answer

	keys          map[string]*keyState // Stripe, by Idempotency-Key
	sentPastWin   []string             // Stripe keys sent again after their window
	proxied       map[string]int       // intermediary answers, by key (both providers)
	mailPerformed map[string]int       // mail, by X-Sidefx-Key
	mailRefs      map[string][]string
	objects       int
	charges       []charge     // what Stripe lists
	events        []modelEvent // sent, not yet delivered
	delivered     []modelEvent // delivered at least once
}

func newProviderModel() *providerModel {
	m := &providerModel{}
	m.reset()
	return m
}

func (m *providerModel) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clock = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m.next = answerOK
	m.keys, m.sentPastWin, m.proxied = map[string]*keyState{}, nil, map[string]int{}
	m.mailPerformed, m.mailRefs = map[string]int{}, map[string][]string{}
	m.objects = 0
	m.charges, m.events, m.delivered = nil, nil, nil
}

func (m *providerModel) setNext(a answer) {
	m.mu.Lock()
	m.next = a
	m.mu.Unlock()
}

func (m *providerModel) now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.clock
}

func (m *providerModel) advance(d time.Duration) {
	m.mu.Lock()
	m.clock = m.clock.Add(d)
	for i := range m.charges {
		m.charges[i].created = m.charges[i].created.Add(-d)
	}
	m.mu.Unlock()
}

// listCharges answers GET /v1/charges: every charge made, in the span asked
// for, newest first, on one page.
func (m *providerModel) listCharges(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	gte, _ := strconv.ParseInt(q.Get("created[gte]"), 10, 64)
	lt, _ := strconv.ParseInt(q.Get("created[lt]"), 10, 64)
	m.mu.Lock()
	var data []map[string]any
	for i := len(m.charges) - 1; i >= 0; i-- {
		c := m.charges[i]
		if at := c.created.Unix(); (gte != 0 && at < gte) || (lt != 0 && at >= lt) {
			continue
		}
		data = append(data, map[string]any{"id": c.ref, "object": "charge", "status": "succeeded", "created": c.created.Unix(),
			"metadata": map[string]string{"sidefx_key": c.key, "sidefx_source_id": c.source, "sidefx_kind": c.kind}})
	}
	m.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"object": "list", "url": "/v1/charges", "has_more": false, "data": data})
	w.Header().Set("Content-Type", "application/json")
	// Stripe's mark, on every answer: the provider reads no list without it.
	w.Header().Set("Request-Id", "req_list")
	w.Write(b) //nolint:errcheck // the client may be gone
}

// event queues an event about an object (m.mu held).
func (m *providerModel) event(provider, key, ref, status string, first bool) {
	m.objects++
	m.events = append(m.events, modelEvent{provider: provider, id: fmt.Sprintf("evt_%d", m.objects), key: key, ref: ref,
		status: status, at: m.clock, first: first})
}

// lose closes the client's connection without an answer.
func lose(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func writeStripe(w http.ResponseWriter, status int, body []byte, replayed bool) {
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_model") // Stripe's, on every answer
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client may be gone
}

func stripeErr(typ, code, msg string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"type": typ, "code": code, "message": msg}})
	return b
}

func (m *providerModel) stripe(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	form, _ := url.ParseQuery(string(body))
	key := r.Header.Get("Idempotency-Key")
	m.mu.Lock()
	a := m.next
	if a == answerProxyPage || a == answerProxyJSON {
		m.proxied[key]++
		m.mu.Unlock()
		writeIntermediary(w, a, http.StatusOK)
		return
	}
	// Refused before the idempotency layer reads the key: nothing stored,
	// nothing replayed, whatever an earlier attempt did.
	front := map[answer]func(){
		answer401: func() {
			writeStripe(w, http.StatusUnauthorized, stripeErr("invalid_request_error", "", "Invalid API Key provided: sk_test_****"), false)
		},
		answer403: func() {
			writeStripe(w, http.StatusForbidden, stripeErr("invalid_request_error", "", "The provided key does not have the required permissions"), false)
		},
		answer404: func() {
			writeStripe(w, http.StatusNotFound, stripeErr("invalid_request_error", "", "Unrecognized request URL (POST: /v1/charges)"), false)
		},
		answer409: func() {
			writeStripe(w, http.StatusConflict, stripeErr("idempotency_error", "idempotency_key_in_use", "There is currently another in-progress request using this Idempotent Key"), false)
		},
		answerInvalid: func() {
			writeStripe(w, http.StatusBadRequest, stripeErr("invalid_request_error", "parameter_invalid_integer", "Invalid integer: amount"), false)
		},
		answer429: func() {
			w.Header().Set("Retry-After", "1")
			writeStripe(w, http.StatusTooManyRequests, stripeErr("rate_limit_error", "rate_limit", "Too many requests"), false)
		},
	}
	if f := front[a]; f != nil {
		m.mu.Unlock()
		f()
		return
	}
	st := m.keys[key]
	if st == nil {
		st = &keyState{}
		m.keys[key] = st
	}
	if a == answerMismatch && !st.storedAt.IsZero() && m.clock.Sub(st.storedAt) <= keyWindow {
		// The key is stored with other parameters (as if the request's
		// encoding had changed between attempts): refused, and proof that
		// an earlier request under the key reached Stripe.
		m.mu.Unlock()
		writeStripe(w, http.StatusBadRequest, stripeErr("idempotency_error", "", "Keys for idempotent requests can only be used with the same parameters they were first used with"), false)
		return
	}
	if !st.storedAt.IsZero() && m.clock.Sub(st.storedAt) <= keyWindow {
		status, b := st.status, st.body
		m.mu.Unlock()
		writeStripe(w, status, b, true)
		return
	}
	if !st.storedAt.IsZero() {
		// Stripe has forgotten the key: this request is new to it. That is a
		// danger when the stored answer was not a definite refusal: the
		// effect may have been performed under the key.
		if st.status < 400 || st.status >= 500 {
			m.sentPastWin = append(m.sentPastWin, key)
		}
		st.storedAt = time.Time{}
	}
	store := func(status int, b []byte) {
		st.storedAt, st.status, st.body = m.clock, status, b
	}
	perform := func() []byte {
		m.objects++
		st.performed++
		st.ref = fmt.Sprintf("ch_%d", m.objects)
		st.refs = append(st.refs, st.ref)
		m.charges = append(m.charges, charge{ref: st.ref, key: form.Get("metadata[sidefx_key]"),
			source: form.Get("metadata[sidefx_source_id]"), kind: form.Get("metadata[sidefx_kind]"), created: time.Now()})
		m.event("stripe", form.Get("metadata[sidefx_key]"), st.ref, "succeeded", false)
		amount, _ := strconv.Atoi(form.Get("amount"))
		b, _ := json.Marshal(map[string]any{"id": st.ref, "object": "charge", "status": "succeeded",
			"amount": amount, "metadata": map[string]string{"sidefx_key": form.Get("metadata[sidefx_key]")}})
		return b
	}
	switch a {
	case answerOK, answerLost:
		b := perform()
		store(http.StatusOK, b)
		m.mu.Unlock()
		if a == answerLost {
			lose(w)
			return
		}
		writeStripe(w, http.StatusOK, b, false)
	case answer500Done, answer500Undone:
		if a == answer500Done {
			perform()
		}
		b := stripeErr("api_error", "", "An unknown error occurred")
		store(http.StatusInternalServerError, b)
		m.mu.Unlock()
		writeStripe(w, http.StatusInternalServerError, b, false)
	case answerDecline:
		b := stripeErr("card_error", "card_declined", "Your card was declined.")
		store(http.StatusPaymentRequired, b)
		m.mu.Unlock()
		writeStripe(w, http.StatusPaymentRequired, b, false)
	default: // a mismatch with nothing stored: a validation error
		m.mu.Unlock()
		writeStripe(w, http.StatusBadRequest, stripeErr("invalid_request_error", "parameter_invalid_integer", "Invalid integer: amount"), false)
	}
}

func (m *providerModel) mail(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Personalizations []struct {
			CustomArgs map[string]string `json:"custom_args"`
		} `json:"personalizations"`
	}
	json.NewDecoder(r.Body).Decode(&body) //nolint:errcheck // a body without the key counts under ""
	key := ""
	if len(body.Personalizations) > 0 {
		key = body.Personalizations[0].CustomArgs["sidefx_key"]
	}
	m.mu.Lock()
	a := m.next
	switch a {
	case answerProxyPage, answerProxyJSON:
		m.proxied[key]++
		m.mu.Unlock()
		writeIntermediary(w, a, http.StatusAccepted)
	case answerOK, answerLost, answer500Done:
		m.objects++
		m.mailPerformed[key]++
		ref := fmt.Sprintf("msg_%d", m.objects)
		m.mailRefs[key] = append(m.mailRefs[key], ref)
		m.event("sendgrid", key, ref, "processed", true)
		m.event("sendgrid", key, ref, "delivered", false)
		m.mu.Unlock()
		if a == answerLost {
			lose(w)
			return
		}
		if a == answer500Done {
			// Accepted, then the answer went wrong on the way.
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.Header().Set("X-Message-Id", ref)
		w.WriteHeader(http.StatusAccepted)
	case answer401, answer403, answer404:
		m.mu.Unlock()
		status, _ := strconv.Atoi(string(a))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, `{"errors":[{"message":"The provided authorization grant is invalid, expired, or revoked"}]}`) //nolint:errcheck // test server
	case answerDecline, answerInvalid:
		m.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"errors":[{"message":"The to field is invalid.","field":"personalizations.0.to"}]}`) //nolint:errcheck // test server
	case answer429:
		m.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
	default: // 503, 500-undone
		m.mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}
}

// modelEffect is what the model knows of one enqueued effect.
type modelEffect struct {
	source, kind string
	variant      int
	id           int64
	key          string   // the current revision's
	keys         []string // every revision's, the first first
	revisions    int
	refired      bool // an operator accepted a possible duplicate
	forced       bool // an operator sent it again past its key window
	resolved     bool // an operator resolved it as failed
	cancelled    bool
}

// call is one claimed effect a worker holds, and, once called, its outcome.
type call struct {
	e         *effects.Effect
	claimedAt time.Time // on the model's clock
	out       *engine.Outcome
}

type world struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	store  *engine.Store
	eng    *engine.Engine
	model  *providerModel
	kinds  map[string]dispatcher.Kind
	effs   map[[2]string]*modelEffect
	order  [][2]string
	work   [3][]*call // per worker: claimed, maybe called, not recorded
	claims int
	recon  *reconcile.Reconciler
	events int // foreign events made up
	tb     interface {
		Fatalf(string, ...any)
		Logf(string, ...any)
	}
}

func (w *world) fatalf(format string, args ...any) { w.tb.Fatalf(format, args...) }

func (w *world) policies() []engine.RescuePolicy {
	var ps []engine.RescuePolicy
	for _, name := range modelKinds {
		k := w.kinds[name]
		ps = append(ps, engine.RescuePolicy{Kind: name, Repeatable: k.Provider.Idempotent() || k.AtLeastOnce,
			MaxAttempts: k.MaxAttempts, KeyWindow: providers.KeyWindow(k.Provider), Timeout: k.Timeout})
	}
	return ps
}

func payload(kind string, variant int) json.RawMessage {
	if kind == kindCharge {
		return json.RawMessage(fmt.Sprintf(`{"amount": %d, "currency": "usd", "source": "tok_visa"}`, 1000+variant))
	}
	return json.RawMessage(fmt.Sprintf(`{"personalizations": [{"to": [{"email": "a@example.com"}]}], "from": {"email": "shop@example.com"},
		"subject": "receipt %d", "content": [{"type": "text/plain", "value": "thanks"}]}`, variant))
}

// shift moves every stored time back by d: time passing, on the database's
// clock as on the providers'.
func (w *world) shift(d time.Duration) {
	_, err := w.pool.Exec(w.ctx, `UPDATE side_effects SET
		created_at = created_at - $1 * interval '1 millisecond',
		next_attempt_at = next_attempt_at - $1 * interval '1 millisecond',
		lease_until = lease_until - $1 * interval '1 millisecond',
		fired_at = fired_at - $1 * interval '1 millisecond',
		first_fired_at = first_fired_at - $1 * interval '1 millisecond',
		updated_at = updated_at - $1 * interval '1 millisecond'`, d.Milliseconds())
	if err == nil {
		_, err = w.pool.Exec(w.ctx, `UPDATE sidefx_evidence SET
			recorded_at = recorded_at - $1 * interval '1 millisecond',
			observed_at = observed_at - $1 * interval '1 millisecond'`, d.Milliseconds())
	}
	if err != nil {
		w.fatalf("shift time: %v", err)
	}
	w.model.advance(d)
}

// eventsWithin is how soon SendGrid's "processed" event follows a mail it
// accepted: the reconciler takes a mail with no event that long after its
// latest attempt as never sent. The model keeps that contract; every other
// event may come at any time, twice, or never.
const eventsWithin = 10 * time.Minute

// deliver records ev as the daemon's events endpoint would, once verified.
func (w *world) deliver(ev modelEvent) {
	if _, err := reconcile.Record(w.ctx, w.pool, "", 0, ev.key, ev.provider, "event", ev.id,
		providers.Evidence{Verdict: providers.Found, Ref: ev.ref, Succeeded: true, Status: ev.status, Source: "model " + ev.provider + " event"}); err != nil {
		w.fatalf("record event %+v: %v", ev, err)
	}
}

// deliverEvent delivers one pending event, any of them: events come out of
// order.
func (w *world) deliverEvent(t *rapid.T) {
	w.deliver(w.drawEvent(t, &w.model.events, true, "no event pending"))
}

// replayEvent delivers again an event delivered before, perhaps hours
// later: the provider retries deliveries it thinks failed.
func (w *world) replayEvent(t *rapid.T) {
	w.deliver(w.drawEvent(t, &w.model.delivered, false, "no event delivered"))
}

// drawEvent draws one event of list (a list of the model's), taking it out
// to the delivered ones when take; it skips the step when list is empty.
func (w *world) drawEvent(t *rapid.T, list *[]modelEvent, take bool, none string) modelEvent {
	w.model.mu.Lock()
	n := len(*list)
	w.model.mu.Unlock()
	if n == 0 {
		t.Skip(none)
	}
	i := rapid.IntRange(0, n-1).Draw(t, "event")
	w.model.mu.Lock()
	defer w.model.mu.Unlock()
	ev := (*list)[i]
	if take {
		*list = slices.Delete(*list, i, i+1)
		w.model.delivered = append(w.model.delivered, ev)
	}
	return ev
}

// foreignEvent delivers an event about an object that is not the effect's:
// another provider's event naming its key (any object in a Stripe account
// can carry a computed key in its metadata), or one of its own provider
// about an object of another type (a customer carrying a charge's key).
func (w *world) foreignEvent(t *rapid.T) {
	me := w.pick(t)
	w.events++
	var ev modelEvent
	switch {
	case me.kind == kindCharge && rapid.Bool().Draw(t, "customer"):
		ev = modelEvent{provider: "stripe", ref: fmt.Sprintf("cus_foreign%d", w.events), status: "created"}
	case me.kind == kindCharge:
		ev = modelEvent{provider: "sendgrid", ref: fmt.Sprintf("msg_foreign%d", w.events), status: "delivered"}
	default:
		ev = modelEvent{provider: "stripe", ref: rapid.SampledFrom([]string{"cus_foreign", "ch_foreign"}).Draw(t, "object") + strconv.Itoa(w.events), status: "succeeded"}
	}
	ev.id, ev.key = fmt.Sprintf("evt_foreign%d", w.events), me.key
	w.deliver(ev)
}

// keepEventContract delivers, before d passes, the "processed" events that
// would otherwise come later than eventsWithin after their mail.
func (w *world) keepEventContract(d time.Duration) {
	w.model.mu.Lock()
	var due []modelEvent
	left := w.model.events[:0]
	for _, ev := range w.model.events {
		if ev.first && w.model.clock.Add(d).Sub(ev.at) >= eventsWithin-time.Minute {
			due = append(due, ev)
			w.model.delivered = append(w.model.delivered, ev)
		} else {
			left = append(left, ev)
		}
	}
	w.model.events = left
	w.model.mu.Unlock()
	for _, ev := range due {
		w.deliver(ev)
	}
}

// runReconciler runs the reconciler, as its schedule or an operator would.
func (w *world) runReconciler(t *rapid.T) {
	if _, err := w.recon.RunNow(w.ctx); err != nil {
		w.fatalf("reconcile: %v", err)
	}
}

func (w *world) enqueue(t *rapid.T) {
	src := rapid.SampledFrom([]string{"o1", "o2", "o3", "o4"}).Draw(t, "source")
	kind := rapid.SampledFrom(modelKinds).Draw(t, "kind")
	variant := rapid.IntRange(0, 1).Draw(t, "variant")
	res, err := w.store.Insert(w.ctx, []effects.NewEffect{{SourceID: src, Kind: kind, Payload: payload(kind, variant)}}, 0, "")
	me := w.effs[[2]string{src, kind}]
	switch {
	case me == nil && err != nil:
		w.fatalf("enqueue %s %s: %v", src, kind, err)
	case me == nil:
		if !res[0].Inserted {
			w.fatalf("enqueue %s %s: a new effect was not inserted", src, kind)
		}
		w.effs[[2]string{src, kind}] = &modelEffect{source: src, kind: kind, variant: variant, id: res[0].ID, key: res[0].Key, keys: []string{res[0].Key}}
		w.order = append(w.order, [2]string{src, kind})
	case variant == me.variant:
		if err != nil || res[0].Inserted || res[0].ID != me.id {
			w.fatalf("replay of %s %s: %+v, %v; want the existing effect %d", src, kind, res, err, me.id)
		}
	default:
		if !errors.Is(err, effects.ErrPayloadMismatch) {
			w.fatalf("replay of %s %s with another payload: %+v, %v; want a mismatch", src, kind, res, err)
		}
	}
}

// served is the kinds a dispatcher claims: those not paused, as it reads
// the pauses.
func (w *world) served() []string {
	ps, err := w.store.Pauses(w.ctx)
	if err != nil {
		w.fatalf("pauses: %v", err)
	}
	var out []string
	for _, k := range modelKinds {
		if !slices.ContainsFunc(ps, func(p effects.Pause) bool {
			return p.Scope == effects.PauseKind && p.Name == k || p.Scope == effects.PauseProvider && p.Name == w.kinds[k].Provider.Name()
		}) {
			out = append(out, k)
		}
	}
	return out
}

// pause pauses or resumes a kind or a provider, as an operator would.
func (w *world) pause(t *rapid.T) {
	scope := rapid.SampledFrom([]effects.PauseScope{effects.PauseKind, effects.PauseProvider}).Draw(t, "scope")
	name := rapid.SampledFrom(modelKinds).Draw(t, "kind")
	if scope == effects.PauseProvider {
		name = w.kinds[name].Provider.Name()
	}
	_, err := w.store.SetPause(w.ctx, scope, name, rapid.Bool().Draw(t, "pause"), op)
	if err != nil && !errors.Is(err, effects.ErrNotPaused) {
		w.fatalf("pause: %v", err)
	}
}

func (w *world) claimParams(worker string, limit int) engine.ClaimParams {
	p := engine.ClaimParams{Kinds: w.served(), Limit: limit, Lease: modelLease, Worker: worker,
		KeyWindows: map[string]time.Duration{}, Timeouts: map[string]time.Duration{}}
	for name, k := range w.kinds {
		p.KeyWindows[name], p.Timeouts[name] = providers.KeyWindow(k.Provider), modelLease
	}
	return p
}

func (w *world) claim(t *rapid.T) {
	i := rapid.IntRange(0, 2).Draw(t, "worker")
	w.claims++
	got, err := w.eng.Claim(w.ctx, w.claimParams(fmt.Sprintf("w%d#%d", i, w.claims), rapid.IntRange(1, 3).Draw(t, "limit")))
	if err != nil {
		w.fatalf("claim: %v", err)
	}
	for _, e := range got {
		if e.State == effects.Fired {
			w.work[i] = append(w.work[i], &call{e: e, claimedAt: w.model.now()})
		}
	}
}

// lostClaim is a claim whose answer never reached its worker, which puts
// back what it may have claimed.
func (w *world) lostClaim(t *rapid.T) {
	w.claims++
	worker := fmt.Sprintf("lost#%d", w.claims)
	got, err := w.eng.Claim(w.ctx, w.claimParams(worker, 2))
	if err != nil {
		w.fatalf("claim: %v", err)
	}
	if _, err := w.eng.PutBack(w.ctx, worker, nil); err != nil {
		w.fatalf("put back: %v", err)
	}
	// Never called: each is as it was before the claim, pending, with no
	// evidence of anything performed.
	for _, e := range got {
		if e.State != effects.Fired {
			continue
		}
		now, err := w.store.Get(w.ctx, e.ID)
		if err != nil {
			w.fatalf("get: %v", err)
		}
		if now.State != effects.Pending || now.Attempts != e.Attempts-1 || !slices.Equal(now.MaybeAttempts, e.MaybeAttempts) {
			w.fatalf("effect %d of a lost claim, put back: %s at attempt %d, maybe %v; want pending at %d, maybe %v",
				e.ID, now.State, now.Attempts, now.MaybeAttempts, e.Attempts-1, e.MaybeAttempts)
		}
	}
}

// busy draws one of the workers for which has holds.
func (w *world) busy(t *rapid.T, has func(*call) bool) int {
	var ws []int
	for i := range w.work {
		if slices.ContainsFunc(w.work[i], has) {
			ws = append(ws, i)
		}
	}
	if len(ws) == 0 {
		t.Skip("no worker has anything to do")
	}
	return rapid.SampledFrom(ws).Draw(t, "worker")
}

func (w *world) call(t *rapid.T) {
	i := w.busy(t, func(c *call) bool { return c.out == nil })
	var open []*call
	for _, c := range w.work[i] {
		if c.out == nil {
			open = append(open, c)
		}
	}
	w.callOne(t, rapid.SampledFrom(open).Draw(t, "call"))
}

// dispatch is one dispatcher's pass: a claim, a call for each effect
// claimed, and their outcomes recorded, with nothing between.
func (w *world) dispatch(t *rapid.T) {
	i := rapid.IntRange(0, 2).Draw(t, "worker")
	w.claims++
	got, err := w.eng.Claim(w.ctx, w.claimParams(fmt.Sprintf("w%d#%d", i, w.claims), rapid.IntRange(1, 3).Draw(t, "limit")))
	if err != nil {
		w.fatalf("claim: %v", err)
	}
	if len(got) == 0 {
		t.Skip("nothing to claim")
	}
	var outs []engine.Outcome
	for _, e := range got {
		if e.State != effects.Fired {
			continue
		}
		c := &call{e: e, claimedAt: w.model.now()}
		w.callOne(t, c)
		outs = append(outs, *c.out)
	}
	if len(outs) == 0 {
		return
	}
	if _, err := w.eng.Complete(w.ctx, outs); err != nil {
		w.fatalf("record outcomes: %v", err)
	}
}

// callOne makes call c with an answer drawn from the hostile world's.
func (w *world) callOne(t *rapid.T, c *call) {
	choices := []answer{answerOK, answerLost, answer503, answerDecline, answerInvalid, answer429, answer401, answer403, answer404,
		answerProxyPage, answerProxyJSON}
	if c.e.Kind == kindCharge {
		choices = []answer{answerOK, answerLost, answer500Done, answer500Undone, answerDecline, answerInvalid, answer429,
			answer401, answer403, answer404, answer409, answerMismatch, answerProxyPage, answerProxyJSON}
	}
	w.model.setNext(rapid.SampledFrom(choices).Draw(t, "answer"))
	k := w.kinds[c.e.Kind]
	var res providers.Result
	if w.model.now().Sub(c.claimedAt) >= modelLease-5*time.Second {
		// As the dispatcher does: a call that could not end inside its
		// lease is not made (the process was paused, say).
		res = providers.Retry(errors.New("not called: the lease was nearly over"), 0)
	} else {
		res = k.Provider.Call(w.ctx, providers.Call{EffectID: c.e.ID, SourceID: c.e.SourceID, Kind: c.e.Kind,
			Key: c.e.Key, Payload: c.e.Payload, Attempt: c.e.Attempts})
	}
	out := dispatcher.Decide(c.e, k, res)
	c.out = &out
}

func (w *world) record(t *rapid.T) {
	i := w.busy(t, func(c *call) bool { return c.out != nil })
	var outs []engine.Outcome
	var left []*call
	for _, c := range w.work[i] {
		if c.out != nil {
			outs = append(outs, *c.out)
		} else {
			left = append(left, c)
		}
	}
	if len(outs) == 0 {
		t.Skip("nothing to record")
	}
	fenced, err := w.eng.Complete(w.ctx, outs)
	if err != nil {
		w.fatalf("record outcomes: %v", err)
	}
	if rapid.Bool().Draw(t, "ambiguous") {
		// The commit looked failed: the dispatcher writes the same batch
		// again. What the first write recorded must not now count as fenced.
		again, err := w.eng.Complete(w.ctx, outs)
		if err != nil {
			w.fatalf("record outcomes again: %v", err)
		}
		for _, o := range again {
			if !slices.ContainsFunc(fenced, func(f engine.Outcome) bool { return f.ID == o.ID && f.Attempt == o.Attempt }) {
				w.fatalf("effect %d attempt %d: recorded by the first write, fenced by the same write again", o.ID, o.Attempt)
			}
		}
	}
	w.work[i] = left
}

// crash loses a worker's claims and unrecorded outcomes.
func (w *world) crash(t *rapid.T) {
	w.work[rapid.IntRange(0, 2).Draw(t, "worker")] = nil
}

func (w *world) passTime(t *rapid.T) {
	d := rapid.SampledFrom([]time.Duration{time.Second, 2 * modelLease, 2 * time.Hour, keyWindow + time.Hour}).Draw(t, "by")
	w.keepEventContract(d)
	w.shift(d)
}

func (w *world) rescue(t *rapid.T) {
	if _, err := w.eng.Rescue(w.ctx, w.policies(), 100); err != nil {
		w.fatalf("rescue: %v", err)
	}
}

func (w *world) reap(t *rapid.T) {
	if _, err := w.eng.Reap(w.ctx, 0, 100); err != nil {
		w.fatalf("reap: %v", err)
	}
}

func (w *world) pick(t *rapid.T) *modelEffect {
	if len(w.order) == 0 {
		t.Skip("nothing enqueued")
	}
	return w.effs[rapid.SampledFrom(w.order).Draw(t, "effect")]
}

var op = effects.By{Actor: "model", Note: "checked"}

func (w *world) cancel(t *rapid.T) {
	me := w.pick(t)
	if _, err := w.store.Cancel(w.ctx, me.source, me.kind); err == nil {
		me.cancelled = true
	}
}

// performed reports how often the providers performed me, under every key
// of every revision — one business intent — and its last reference.
func (w *world) performed(me *modelEffect) (int, string) {
	refs := w.refs(me)
	if len(refs) == 0 {
		return 0, ""
	}
	return len(refs), refs[len(refs)-1]
}

// refs lists the objects the providers made for me, under every key of
// every revision, oldest first within a key.
func (w *world) refs(me *modelEffect) []string {
	w.model.mu.Lock()
	defer w.model.mu.Unlock()
	var out []string
	for _, key := range me.keys {
		if me.kind == kindCharge {
			if st := w.model.keys[key]; st != nil {
				out = append(out, st.refs...)
			}
		} else {
			out = append(out, w.model.mailRefs[key]...)
		}
	}
	return out
}

// resolve settles an uncertain effect as an operator would after looking at
// the provider: truthfully.
func (w *world) resolve(t *rapid.T) {
	me := w.pick(t)
	n, ref := w.performed(me)
	var err error
	if n > 0 {
		_, err = w.store.Resolve(w.ctx, me.id, effects.Confirmed, ref, op)
	} else if _, err = w.store.Resolve(w.ctx, me.id, effects.Failed, "", op); err == nil {
		me.resolved = true
	}
	if err != nil && !errors.Is(err, effects.ErrWrongState) {
		w.fatalf("resolve: %v", err)
	}
}

func (w *world) refire(t *rapid.T) {
	me := w.pick(t)
	k := w.kinds[me.kind]
	force := rapid.Bool().Draw(t, "force")
	_, err := w.store.Refire(w.ctx, me.id, 1, effects.RefireOptions{KeyWindow: providers.KeyWindow(k.Provider), PastKeyWindow: force}, op)
	switch {
	case err == nil:
		me.refired, me.forced = true, me.forced || force
	case errors.Is(err, effects.ErrWrongState), errors.Is(err, effects.ErrPastKeyWindow):
	default:
		w.fatalf("refire: %v", err)
	}
}

func (w *world) retry(t *rapid.T) {
	me := w.pick(t)
	k := w.kinds[me.kind]
	_, err := w.store.Retry(w.ctx, me.id, 1, effects.RefireOptions{KeyWindow: providers.KeyWindow(k.Provider)}, op)
	if err != nil && !errors.Is(err, effects.ErrWrongState) && !errors.Is(err, effects.ErrPastKeyWindow) {
		w.fatalf("retry: %v", err)
	}
}

// supersede corrects an effect's payload as an operator would, from the
// version the operator read; a second operator correcting the same version
// at once is refused.
func (w *world) supersede(t *rapid.T) {
	me := w.pick(t)
	e, err := w.store.Get(w.ctx, me.id)
	if err != nil {
		w.fatalf("get: %v", err)
	}
	me.revisions++
	variant := 10 + me.revisions
	got, err := w.store.Supersede(w.ctx, me.id, e.Version(), payload(me.kind, variant), 2, op)
	var mpe *effects.MaybePerformedError
	switch {
	case err == nil:
		me.key = got.Key
		me.keys = append(me.keys, got.Key)
		// The second operator's correction, from the same version.
		if _, err := w.store.Supersede(w.ctx, me.id, e.Version(), payload(me.kind, variant+100), 2, op); !errors.Is(err, effects.ErrChanged) {
			w.fatalf("a second supersede from the version the first replaced: %v, want ErrChanged", err)
		}
	case errors.As(err, &mpe), errors.Is(err, effects.ErrWrongState), errors.Is(err, effects.ErrChanged):
	default:
		w.fatalf("supersede: %v", err)
	}
}

// bulk acts on every effect of a kind as an operator would from the CLI or
// the console (admin, one rule for both): retry, refire (forced past
// the key window or not), cancel, or supersede by a merge patch.
func (w *world) bulk(t *rapid.T) {
	kind := rapid.SampledFrom(modelKinds).Draw(t, "kind")
	action := rapid.SampledFrom([]admin.Action{admin.Retry, admin.Refire, admin.Cancel, admin.Supersede}).Draw(t, "action")
	force := action == admin.Refire && rapid.Bool().Draw(t, "force")
	r := admin.Request{Action: action, Attempts: 2, PastKeyWindow: force, Actor: "model", Note: "bulk"}
	if action == admin.Supersede {
		w.events++
		r.Patch = json.RawMessage(fmt.Sprintf(`{"subject": "receipt, corrected %d"}`, w.events))
		if kind == kindCharge {
			r.Patch = json.RawMessage(fmt.Sprintf(`{"amount": %d}`, 5000+w.events))
		}
	}
	o, err := admin.New(w.store, &admin.Config{KeyWindow: func(k string) time.Duration { return providers.KeyWindow(w.kinds[k].Provider) }})
	if err != nil {
		w.fatalf("admin: %v", err)
	}
	res, err := o.ApplyAll(w.ctx, r, effects.Filter{Kinds: []string{kind}}, 0)
	if err != nil {
		w.fatalf("bulk %s: %v", action, err)
	}
	byID := map[int64]*modelEffect{}
	for _, me := range w.effs {
		byID[me.id] = me
	}
	for _, e := range res.Done {
		me := byID[e.ID]
		switch action {
		case admin.Refire:
			me.refired, me.forced = true, me.forced || force
		case admin.Cancel:
			me.cancelled = true
		case admin.Supersede:
			me.key = e.Key
			me.keys = append(me.keys, e.Key)
		}
	}
}

// check holds the invariants.
func (w *world) check(t *rapid.T) {
	rows, err := w.store.List(w.ctx, effects.Filter{Limit: 1000})
	if err != nil {
		w.fatalf("list: %v", err)
	}
	byPair := map[[2]string]*effects.Effect{}
	for _, e := range rows {
		p := [2]string{e.SourceID, e.Kind}
		if byPair[p] != nil {
			w.fatalf("two effects for %v", p)
		}
		byPair[p] = e
	}
	if len(rows) != len(w.effs) {
		w.fatalf("%d effects stored, %d enqueued", len(rows), len(w.effs))
	}
	w.model.mu.Lock()
	pastWin := slices.Clone(w.model.sentPastWin)
	proxied := maps.Clone(w.model.proxied)
	w.model.mu.Unlock()
	byKey := map[string]*modelEffect{}
	for _, me := range w.effs {
		for _, k := range me.keys {
			byKey[k] = me
		}
	}
	for _, key := range pastWin {
		if me := byKey[key]; me == nil || !me.forced {
			w.fatalf("sent to Stripe again after the key window, and no operator asked for it: %+v", me)
		}
	}
	for p, me := range w.effs {
		e := byPair[p]
		if e == nil || e.ID != me.id || e.Key != me.key {
			w.fatalf("effect %v lost or changed: %+v", p, e)
		}
		n, ref := w.performed(me)
		switch {
		case me.kind == kindCharge && n > 1 && !me.forced:
			w.fatalf("charge %d performed %d times (keys %v) and no operator forced it", me.id, n, me.keys)
		case me.kind == kindMail && n > 1 && !me.refired:
			w.fatalf("at-most-once email %d sent %d times (keys %v)", me.id, n, me.keys)
		case e.State == effects.Confirmed && n == 0 && proxiedAny(proxied, me.keys):
			// Nothing an intermediary answers is recorded confirmed.
			w.fatalf("effect %d confirmed with %q on an intermediary's answer (%d of them), never performed", e.ID, e.ProviderRef, proxiedCount(proxied, me.keys))
		case e.State == effects.Confirmed && n == 0:
			w.fatalf("effect %d confirmed with %q, never performed", e.ID, e.ProviderRef)
		case e.State == effects.Confirmed && me.kind != kindDigest && !slices.Contains(w.refs(me), e.ProviderRef):
			// (One reference unless an operator sent it again.)
			w.fatalf("effect %d confirmed with %q, the provider holds %q", e.ID, e.ProviderRef, ref)
		case n > 0 && e.State == effects.Cancelled && e.Flag == "":
			// Only an effect never possibly performed is cancelled; a late
			// "performed" after that flags it.
			w.fatalf("effect %d was cancelled but was performed (%d)", e.ID, n)
		case n > 0 && e.State == effects.Failed && len(e.MaybeAttempts) == 0 && e.Flag == "":
			w.fatalf("effect %d is failed but was performed (%d), and holds no evidence of it", e.ID, n)
		case e.State == effects.Failed && len(e.MaybeAttempts) > 0 && e.Flag == "" && !me.resolved:
			// failed means definitely not performed: only an operator's
			// decision, or a late answer flagged, leaves evidence on it.
			w.fatalf("effect %d is failed although attempts %v may have been performed", e.ID, e.MaybeAttempts)
		}
	}
}

// proxiedCount is how many requests under keys an intermediary answered.
func proxiedCount(proxied map[string]int, keys []string) int {
	n := 0
	for _, k := range keys {
		n += proxied[k]
	}
	return n
}

func proxiedAny(proxied map[string]int, keys []string) bool { return proxiedCount(proxied, keys) > 0 }

// weighted repeats the actions named in weights under more names, so that
// rapid (which draws an action's name uniformly) draws them that many
// times as often: a whole dispatch, the reconciler and time passing are
// what most histories are made of.
func weighted(actions map[string]func(*rapid.T), weights map[string]int) map[string]func(*rapid.T) {
	for name, n := range weights {
		for i := 2; i <= n; i++ {
			actions[fmt.Sprintf("%s#%d", name, i)] = actions[name]
		}
	}
	return actions
}

func TestModel(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	fx, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(pool, "")
	if err != nil {
		t.Fatal(err)
	}
	m := newProviderModel()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", m.stripe)
	mux.HandleFunc("GET /v1/charges", m.listCharges)
	mux.HandleFunc("POST /v3/mail/send", m.mail)
	// Every answer closes its connection: net/http resends a request that
	// carries an Idempotency-Key when a reused connection closes without an
	// answer, which would turn most lost answers into replays.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	st, err := stripe.New(&stripe.Config{APIKey: "sk_test_model", BaseURL: srv.URL, Timeout: 5 * time.Second,
		Operations: map[string]string{kindCharge: "charges.create"}, ConsistencyDelay: time.Minute, LookupRate: 1e6})
	if err != nil {
		t.Fatal(err)
	}
	mail, err := sendgrid.New(&sendgrid.Config{APIKey: "SG.model", BaseURL: srv.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	kind := func(p providers.Provider, alo bool) dispatcher.Kind {
		return dispatcher.Kind{Provider: p, MaxAttempts: 4, Timeout: 30 * time.Second,
			BackoffBase: time.Second, BackoffMax: time.Minute, AtLeastOnce: alo}
	}
	kinds := map[string]dispatcher.Kind{kindCharge: kind(st, false), kindMail: kind(mail, false), kindDigest: kind(mail, true)}
	// The reconciler: Stripe's lookups and events, SendGrid's events with
	// their delay, a lost at-most-once email refired when absent.
	recon, err := reconcile.New(pool, &reconcile.Config{Logger: quiet(), Kinds: map[string]reconcile.Kind{
		kindCharge: {Provider: st},
		kindMail:   {Provider: mail, EventsWithin: eventsWithin, RefireWhenAbsentAfter: eventsWithin},
		kindDigest: {Provider: mail, EventsWithin: eventsWithin},
	}})
	if err != nil {
		t.Fatal(err)
	}

	prop := func(rt *rapid.T) {
		if _, err := pool.Exec(ctx, `TRUNCATE side_effects, side_effect_events, sidefx_evidence, sidefx_reconcile_runs,
				sidefx_reconcile_findings, sidefx_pauses, sidefx_pause_log RESTART IDENTITY`); err != nil {
			rt.Fatalf("reset: %v", err)
		}
		m.reset()
		w := &world{ctx: ctx, pool: pool, store: fx, eng: eng, model: m, kinds: kinds, effs: map[[2]string]*modelEffect{}, tb: rt, recon: recon}
		rt.Repeat(weighted(map[string]func(*rapid.T){
			"":          w.check,
			"enqueue":   w.enqueue,
			"claim":     w.claim,
			"dispatch":  w.dispatch,
			"lostClaim": w.lostClaim,
			"call":      w.call,
			"record":    w.record,
			"crash":     w.crash,
			"passTime":  w.passTime,
			"rescue":    w.rescue,
			"reap":      w.reap,
			"cancel":    w.cancel,
			"resolve":   w.resolve,
			"refire":    w.refire,
			"retry":     w.retry,
			"supersede": w.supersede,
			"pause":     w.pause,
			"bulk":      w.bulk,
			"event":     w.deliverEvent,
			"replay":    w.replayEvent,
			"foreign":   w.foreignEvent,
			"reconcile": w.runReconciler,
		}, map[string]int{"dispatch": 4, "reconcile": 2, "passTime": 2, "enqueue": 2}))
	}
	// Longer histories than rapid's default (30 steps on average): a
	// defect may take a dozen steps to show.
	if f := flag.Lookup("rapid.steps"); f != nil && f.Value.String() == "30" {
		if err := f.Value.Set("80"); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(*modelBudget)
	runs := 0
	for time.Now().Before(deadline) && !t.Failed() {
		rapid.Check(t, prop)
		runs++
	}
	t.Logf("model: %d rounds of rapid checks in %s", runs, *modelBudget)
}
