package console_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers/stripe"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/console"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is a console on a fresh database, with one token per role.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	store  *engine.Store
	eng    *engine.Engine
	h      *console.Handler
	srv    *httptest.Server
	tokens map[console.Role]string
	actors map[console.Role]string
}

func randomToken(t *testing.T) string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "sfxc_" + hex.EncodeToString(b)
}

func tokenLine(token string, role console.Role, actor string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:]) + " " + role.String() + " " + actor
}

// newEnv starts a console; edit changes its configuration first.
func newEnv(t *testing.T, edit func(*console.Config)) *env {
	t.Helper()
	e := &env{t: t, pool: pgtest.DB(t), tokens: map[console.Role]string{}, actors: map[console.Role]string{
		console.Viewer: "viewer on call", console.Operator: "operator on call", console.Admin: "admin on call"}}
	var err error
	if e.store, err = engine.NewStore(e.pool, nil); err != nil {
		t.Fatal(err)
	}
	if e.eng, err = engine.New(e.pool, ""); err != nil {
		t.Fatal(err)
	}
	lines := "# the console's tokens\n\n"
	for _, r := range []console.Role{console.Viewer, console.Operator, console.Admin} {
		e.tokens[r] = randomToken(t)
		lines += tokenLine(e.tokens[r], r, e.actors[r]) + "\n"
	}
	tokens, err := console.ParseTokens(lines)
	if err != nil {
		t.Fatal(err)
	}
	// The names a daemon's configuration would know.
	ops, err := admin.New(e.store, &admin.Config{Known: func(scope effects.PauseScope) []string {
		if scope == effects.PauseProvider {
			return []string{"mail", "stripe"}
		}
		return []string{"charge.create", "email.receipt"}
	}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := console.Config{
		Store: e.store, Ops: ops, DB: e.pool,
		Providers:    map[string]console.Provider{"charge.create": {Name: "stripe", Link: stripeLink}, "email.receipt": {Name: "mail"}},
		HiddenFields: []string{"personalizations.to.email", "customer_email"},
		Auth:         console.Auth{Tokens: tokens},
	}
	if edit != nil {
		edit(&cfg)
	}
	if e.h, err = console.New(cfg); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.h)
	t.Cleanup(e.srv.Close)
	return e
}

// enqueue inserts effects of kind with payload, one per source id.
func (e *env) enqueue(kind, payload string, sources ...string) {
	e.t.Helper()
	var items []effects.NewEffect
	for _, s := range sources {
		items = append(items, effects.NewEffect{SourceID: s, Kind: kind, Payload: json.RawMessage(payload)})
	}
	if _, err := e.store.Insert(context.Background(), items, 0, ""); err != nil {
		e.t.Fatal(err)
	}
}

// operate brings n pending effects of kind into state st, as a dispatcher
// would, with errText as their last error; it returns their ids.
func (e *env) operate(kind string, n int, st effects.State, errText string) []int64 {
	e.t.Helper()
	ctx := context.Background()
	got, err := e.eng.Claim(ctx, engine.ClaimParams{Kinds: []string{kind}, Limit: n, Lease: time.Minute, Worker: "test"})
	if err != nil || len(got) != n {
		e.t.Fatalf("claim %d %s: %d, %v", n, kind, len(got), err)
	}
	var outs []engine.Outcome
	var ids []int64
	for _, c := range got {
		outs = append(outs, engine.Outcome{ID: c.ID, Attempt: 1, State: st, Error: errText, MaybePerformed: st == effects.Uncertain})
		ids = append(ids, c.ID)
	}
	if _, err := e.eng.Complete(ctx, outs); err != nil {
		e.t.Fatal(err)
	}
	return ids
}

func (e *env) effect(id int64) *effects.Effect {
	e.t.Helper()
	got, err := e.store.Get(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return got
}

func (e *env) history(id int64) []effects.Event {
	e.t.Helper()
	h, err := e.store.History(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return h
}

// client is a browser: a cookie jar, no redirect followed (each test
// says where it goes), Origin set on every POST as a browser does.
type client struct {
	e      *env
	t      *testing.T
	c      *http.Client
	origin string
	bearer string
}

func (e *env) client() *client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return &client{e: e, t: e.t, origin: e.srv.URL, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

type answer struct {
	status int
	body   string
	header http.Header
}

func (c *client) do(req *http.Request) answer {
	c.t.Helper()
	if c.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.bearer)
	}
	resp, err := c.c.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return answer{status: resp.StatusCode, body: string(b), header: resp.Header}
}

func (c *client) get(path string) answer {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.e.srv.URL+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.do(req)
}

// page GETs path and wants 200.
func (c *client) page(path string) string {
	c.t.Helper()
	a := c.get(path)
	if a.status != http.StatusOK {
		c.t.Fatalf("GET %s: %d\n%s", path, a.status, a.body)
	}
	return a.body
}

func (c *client) post(path string, form url.Values) answer {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.e.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if c.origin != "" {
		req.Header.Set("Origin", c.origin)
	}
	return c.do(req)
}

// bulk posts a confirmed bulk action and, when it is answered with the
// redirect to its outcome (303), follows it: the outcome's page.
func (c *client) bulk(form url.Values) answer {
	c.t.Helper()
	a := c.post("/bulk", form)
	if a.status != http.StatusSeeOther {
		return a
	}
	loc := a.header.Get("Location")
	if !strings.HasPrefix(loc, "/bulk/done/") {
		c.t.Fatalf("a bulk action redirected to %q", loc)
	}
	return c.get(loc)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf returns the CSRF token of a page's forms.
func csrf(t *testing.T, body string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", body)
	}
	return html.UnescapeString(m[1])
}

// login signs in with role's token and returns the client.
func (e *env) login(role console.Role) *client {
	e.t.Helper()
	c := e.client()
	c.signIn(e.tokens[role], http.StatusSeeOther)
	return c
}

func (c *client) signIn(token string, want int) answer {
	c.t.Helper()
	body := c.page("/login")
	a := c.post("/login", url.Values{"csrf": {csrf(c.t, body)}, "token": {token}})
	if a.status != want {
		c.t.Fatalf("sign in: %d, want %d\n%s", a.status, want, a.body)
	}
	return a
}

// actionForms are the marks of the forms that act.
var actionForms = []string{`class="act`, `name="note"`, `action="/pause"`, `action="/bulk"`, `/resolve"`, `/retry"`, `/supersede"`}

func TestConsole_AViewerCannotAct(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("email.receipt", `{"n":1}`, "v-1", "v-2")
	ids := e.operate("email.receipt", 1, effects.Uncertain, "timeout")
	viewer := e.login(console.Viewer)
	for _, path := range []string{"/", "/effects", "/effects?state=uncertain", fmt.Sprintf("/effects/%d", ids[0]), "/runs"} {
		body := viewer.page(path)
		for _, mark := range actionForms {
			if strings.Contains(body, mark) {
				t.Errorf("GET %s as a viewer: the page holds %q, an action form", path, mark)
			}
		}
		if !strings.Contains(body, e.actors[console.Viewer]) {
			t.Errorf("GET %s: the viewer's name is not shown", path)
		}
	}
	// A viewer's own valid CSRF token (its sign-out form's) does not make
	// an action go through.
	token := csrf(t, viewer.page("/"))
	for path, form := range map[string]url.Values{
		fmt.Sprintf("/effects/%d/resolve", ids[0]): {"as": {"confirmed"}, "note": {"by hand"}},
		fmt.Sprintf("/effects/%d/refire", ids[0]):  {"note": {"by hand"}},
		"/pause": {"scope": {"kind"}, "name": {"email.receipt"}, "op": {"pause"}, "note": {"by hand"}},
		"/bulk":  {"action": {"resolve"}, "as": {"confirmed"}, "kind": {"email.receipt"}, "note": {"by hand"}},
	} {
		form.Set("csrf", token)
		if a := viewer.post(path, form); a.status != http.StatusForbidden {
			t.Errorf("POST %s as a viewer: %d, want 403", path, a.status)
		}
	}
	if a := viewer.get("/bulk?action=resolve&as=confirmed"); a.status != http.StatusForbidden {
		t.Errorf("a viewer's bulk preview: %d, want 403", a.status)
	}
	if got := e.effect(ids[0]); got.State != effects.Uncertain || len(e.history(ids[0])) != 0 {
		t.Errorf("after a viewer's POSTs the effect is %s with history %v", got.State, e.history(ids[0]))
	}
	if ps, _ := e.store.Pauses(context.Background()); len(ps) != 0 {
		t.Errorf("a viewer paused %v", ps)
	}
}

func TestConsole_AnOperatorFindsAndResolvesAnUncertainEffect(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("charge.create", `{"amount":2500,"currency":"usd"}`, "order-1", "order-2", "order-3", "order-4")
	unsure := e.operate("charge.create", 2, effects.Uncertain, "timeout after 30s")
	failed := e.operate("charge.create", 1, effects.Failed, "card declined")
	op := e.login(console.Operator)

	list := op.page("/effects?state=uncertain&kind=charge.create")
	for _, id := range unsure {
		if !strings.Contains(list, fmt.Sprintf(`href="/effects/%d"`, id)) {
			t.Errorf("the uncertain filter does not list effect %d:\n%s", id, list)
		}
	}
	if strings.Contains(list, fmt.Sprintf(`href="/effects/%d"`, failed[0])) || !strings.Contains(list, "2 effects match") {
		t.Errorf("the uncertain filter lists more than the uncertain effects:\n%s", list)
	}
	if a := op.get("/effects?state=bogus"); a.status != http.StatusBadRequest || !strings.Contains(a.body, "is not a state") {
		t.Errorf("a bad state: %d", a.status)
	}

	id := unsure[0]
	page := op.page(fmt.Sprintf("/effects/%d", id))
	if !strings.Contains(page, fmt.Sprintf(`action="/effects/%d/resolve"`, id)) {
		t.Fatalf("no resolve form on an uncertain effect's page:\n%s", page)
	}
	token := csrf(t, page)
	// A note is required.
	if a := op.post(fmt.Sprintf("/effects/%d/resolve", id), url.Values{"csrf": {token}, "as": {"confirmed"}}); a.status != http.StatusBadRequest {
		t.Errorf("resolve without a note: %d, want 400", a.status)
	}
	a := op.post(fmt.Sprintf("/effects/%d/resolve", id), url.Values{"csrf": {token}, "as": {"confirmed"}, "ref": {"pi_3Abc"}, "note": {"the dashboard shows it paid"}, "attempt": {"1"}})
	if a.status != http.StatusSeeOther || a.header.Get("Location") != fmt.Sprintf("/effects/%d?done=resolve", id) {
		t.Fatalf("resolve: %d %s\n%s", a.status, a.header.Get("Location"), a.body)
	}
	page = op.page(a.header.Get("Location"))
	for _, want := range []string{"Done: resolve", "confirmed", "operator on call", "the dashboard shows it paid", "https://dashboard.stripe.com/payments/pi_3Abc"} {
		if !strings.Contains(page, want) {
			t.Errorf("the effect's page after resolving lacks %q:\n%s", want, page)
		}
	}
	if got := e.effect(id); got.State != effects.Confirmed || got.ProviderRef != "pi_3Abc" {
		t.Errorf("effect %d is %s ref %q", id, got.State, got.ProviderRef)
	}
	if h := e.history(id); len(h) != 1 || h[0].Actor != "operator on call" || h[0].Note != "the dashboard shows it paid" {
		t.Errorf("history %+v", h)
	}
	// Resolving it again is refused with its state.
	if a := op.post(fmt.Sprintf("/effects/%d/resolve", id), url.Values{"csrf": {token}, "as": {"failed"}, "note": {"again"}, "attempt": {"1"}}); a.status != http.StatusConflict || !strings.Contains(a.body, "it is confirmed") {
		t.Errorf("resolving a confirmed effect: %d\n%s", a.status, a.body)
	}
	// The failed one is retried.
	if a := op.post(fmt.Sprintf("/effects/%d/retry", failed[0]), url.Values{"csrf": {token}, "note": {"the customer updated the card"}, "attempt": {"1"}}); a.status != http.StatusSeeOther {
		t.Errorf("retry: %d\n%s", a.status, a.body)
	}
	if got := e.effect(failed[0]); got.State != effects.Pending {
		t.Errorf("retried effect is %s", got.State)
	}
	// And the pending one cancelled.
	pending, err := e.store.GetBySource(context.Background(), "order-4", "charge.create")
	if err != nil {
		t.Fatal(err)
	}
	if a := op.post(fmt.Sprintf("/effects/%d/cancel", pending.ID), url.Values{"csrf": {token}, "note": {"order withdrawn"}, "attempt": {"0"}}); a.status != http.StatusSeeOther {
		t.Errorf("cancel: %d\n%s", a.status, a.body)
	}
	if got := e.effect(pending.ID); got.State != effects.Cancelled {
		t.Errorf("cancelled effect is %s", got.State)
	}
}

func TestConsole_AForgedPostIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("email.receipt", `{"n":1}`, "f-1")
	id := e.operate("email.receipt", 1, effects.Uncertain, "timeout")[0]
	op := e.login(console.Operator)
	other := e.login(console.Operator) // another session of the same token
	token := csrf(t, op.page(fmt.Sprintf("/effects/%d", id)))
	path := fmt.Sprintf("/effects/%d/resolve", id)
	form := func(csrf string) url.Values {
		return url.Values{"csrf": {csrf}, "as": {"failed"}, "note": {"forged"}, "attempt": {"1"}}
	}
	for name, a := range map[string]answer{
		"no CSRF token":                op.post(path, url.Values{"as": {"failed"}, "note": {"forged"}}),
		"a wrong CSRF token":           op.post(path, form(token[:len(token)-2]+"xx")),
		"another session's CSRF token": other.post(path, form(token)),
	} {
		if a.status != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, a.status)
		}
	}
	// From another site, even with the right token.
	op.origin = "https://evil.example"
	if a := op.post(path, form(token)); a.status != http.StatusForbidden {
		t.Errorf("a POST from another origin: %d, want 403", a.status)
	}
	op.origin = "null"
	if a := op.post(path, form(token)); a.status != http.StatusForbidden {
		t.Errorf("a POST from origin null: %d, want 403", a.status)
	}
	if got := e.effect(id); got.State != effects.Uncertain || len(e.history(id)) != 0 {
		t.Fatalf("a forged POST changed effect %d: %s, %v", id, got.State, e.history(id))
	}
	// Without an Origin (some clients send none) the token is enough.
	op.origin = ""
	if a := op.post(path, form(token)); a.status != http.StatusSeeOther {
		t.Errorf("the genuine POST: %d\n%s", a.status, a.body)
	}
	// Signing in needs the sign-in form's token too.
	c := e.client()
	if a := c.post("/login", url.Values{"token": {e.tokens[console.Admin]}}); a.status != http.StatusForbidden {
		t.Errorf("a sign-in without the form's token: %d, want 403", a.status)
	}
}

// hiddenInputs reads a form's hidden inputs.
func hiddenInputs(t *testing.T, body, action string) url.Values {
	t.Helper()
	i := strings.Index(body, `action="`+action+`"`)
	if i < 0 {
		t.Fatalf("no form to %s:\n%s", action, body)
	}
	form := body[i:]
	form = form[:strings.Index(form, "</form>")]
	v := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(form, -1) {
		v.Add(m[1], html.UnescapeString(m[2]))
	}
	return v
}

func TestConsole_BulkPreviewConfirmAndCap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var few, many []string
	for i := range 8 {
		few = append(few, fmt.Sprintf("few-%02d", i))
	}
	for i := range admin.DefaultMax + 1 {
		many = append(many, fmt.Sprintf("many-%03d", i))
	}
	e.enqueue("email.receipt", `{"n":1}`, few...)
	e.enqueue("charge.create", `{"amount":1}`, many...)
	e.operate("email.receipt", 8, effects.Uncertain, "timeout")
	e.operate("charge.create", admin.DefaultMax+1, effects.Uncertain, "timeout")
	op := e.login(console.Operator)

	list := op.page("/effects?kind=email.receipt")
	if !strings.Contains(list, `action="/bulk"`) {
		t.Fatalf("no bulk form on the list:\n%s", list)
	}
	preview := op.page("/bulk?action=resolve&as=failed&kind=email.receipt")
	if !strings.Contains(preview, "<strong>8</strong> uncertain effects match") || !strings.Contains(preview, fmt.Sprintf("The cap is %d", admin.DefaultMax)) {
		t.Fatalf("preview:\n%s", preview)
	}
	form := hiddenInputs(t, preview, "/bulk")
	if form.Get("kind") != "email.receipt" || form.Get("action") != "resolve" || form.Get("as") != "failed" {
		t.Fatalf("the confirmation's fields: %v", form)
	}
	if a := op.post("/bulk", form); a.status != http.StatusBadRequest {
		t.Errorf("a bulk action without a note: %d, want 400", a.status)
	}
	form.Set("note", "SendGrid's activity shows none of them")
	posted := op.post("/bulk", form)
	if posted.status != http.StatusSeeOther {
		t.Fatalf("confirm: %d, want a redirect to the outcome (post-redirect-get)\n%s", posted.status, posted.body)
	}
	done := posted.header.Get("Location")
	a := op.get(done)
	if a.status != http.StatusOK || !strings.Contains(a.body, "8 done, 0 skipped") {
		t.Fatalf("confirm: %d\n%s", a.status, a.body)
	}
	// A reload shows the outcome again and sends nothing again; another
	// user is not shown it.
	if again := op.get(done); again.status != http.StatusOK || !strings.Contains(again.body, "8 done, 0 skipped") {
		t.Errorf("the outcome reloaded: %d\n%s", again.status, again.body)
	}
	if other := e.login(console.Viewer).get(done); other.status != http.StatusNotFound {
		t.Errorf("another user's view of the outcome: %d", other.status)
	}
	failed, _ := e.store.List(context.Background(), effects.Filter{Kinds: []string{"email.receipt"}, States: []effects.State{effects.Failed}})
	if len(failed) != 8 {
		t.Fatalf("%d resolved as failed, want 8", len(failed))
	}
	for _, f := range failed {
		if h := e.history(f.ID); len(h) != 1 || h[0].Actor != "operator on call" {
			t.Errorf("effect %d: history %+v", f.ID, h)
		}
	}

	// Over the cap: no confirmation offered, and one sent by hand refused.
	preview = op.page("/bulk?action=resolve&as=confirmed&kind=charge.create")
	if !strings.Contains(preview, "More effects match than the cap allows") || strings.Contains(preview, `action="/bulk"`) {
		t.Errorf("preview over the cap:\n%s", preview)
	}
	form = url.Values{"csrf": {csrf(t, list)}, "action": {"resolve"}, "as": {"confirmed"}, "kind": {"charge.create"}, "note": {"all paid"}}
	if a := op.post("/bulk", form); a.status != http.StatusConflict || !strings.Contains(a.body, "the cap is 100") {
		t.Errorf("an operator over the cap: %d\n%s", a.status, a.body)
	}
	// Only an admin raises the cap.
	form.Set("max", "200")
	if a := op.post("/bulk", form); a.status != http.StatusForbidden {
		t.Errorf("an operator raising the cap: %d, want 403", a.status)
	}
	if a := op.get("/bulk?action=resolve&as=confirmed&kind=charge.create&max=200"); a.status != http.StatusForbidden {
		t.Errorf("an operator's preview with a raised cap: %d, want 403", a.status)
	}
	if n, _ := e.store.CountMatching(context.Background(), effects.Filter{States: []effects.State{effects.Confirmed}}); n != 0 {
		t.Fatalf("refused bulk actions confirmed %d effects", n)
	}
	boss := e.login(console.Admin)
	preview = boss.page("/bulk?action=resolve&as=confirmed&kind=charge.create&max=200")
	form = hiddenInputs(t, preview, "/bulk")
	form.Set("note", "the dashboard shows them all paid")
	if a := boss.bulk(form); a.status != http.StatusOK || !strings.Contains(a.body, fmt.Sprintf("%d done", admin.DefaultMax+1)) {
		t.Errorf("an admin with a raised cap: %d\n%s", a.status, a.body)
	}
}

func TestConsole_HiddenFieldsNeverReachAPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const to, customer = "recipient.secret@example.com", "customer.hidden@example.com"
	e.enqueue("email.receipt", `{"personalizations":[{"to":[{"email":"`+to+`","name":"A"}]}],"customer_email":"`+customer+`","template_id":"d-old"}`, "h-1")
	id := e.operate("email.receipt", 1, effects.Failed, "400: does not contain a valid address: "+to)[0]
	op := e.login(console.Operator)
	for _, path := range []string{fmt.Sprintf("/effects/%d", id), "/effects", "/effects?state=failed"} {
		body := op.page(path)
		if strings.Contains(body, to) || strings.Contains(body, customer) || strings.Contains(body, "recipient.secret") {
			t.Errorf("GET %s shows a hidden field:\n%s", path, body)
		}
	}
	page := op.page(fmt.Sprintf("/effects/%d", id))
	if !strings.Contains(page, "(hidden)") || !strings.Contains(page, "d-old") {
		t.Errorf("the payload is not shown with its fields hidden:\n%s", page)
	}
	// Superseding with the payload as shown keeps the hidden values.
	m := regexp.MustCompile(`(?s)<textarea name="payload"[^>]*>(.*?)</textarea>`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no supersede form:\n%s", page)
	}
	written := strings.Replace(html.UnescapeString(m[1]), "d-old", "d-new", 1)
	form := hiddenInputs(t, page, fmt.Sprintf("/effects/%d/supersede", id))
	form.Set("payload", written)
	form.Set("note", "the template was renamed")
	a := op.post(fmt.Sprintf("/effects/%d/supersede", id), form)
	if a.status != http.StatusSeeOther {
		t.Fatalf("supersede: %d\n%s", a.status, a.body)
	}
	got := e.effect(id)
	var p struct {
		Personalizations []struct {
			To []struct{ Email string } `json:"to"`
		} `json:"personalizations"`
		CustomerEmail string `json:"customer_email"`
		TemplateID    string `json:"template_id"`
	}
	if err := json.Unmarshal(got.Payload, &p); err != nil || p.TemplateID != "d-new" || p.CustomerEmail != customer || p.Personalizations[0].To[0].Email != to {
		t.Errorf("superseded payload %s, %v", got.Payload, err)
	}
	if body := op.page(fmt.Sprintf("/effects/%d", id)); strings.Contains(body, to) || strings.Contains(body, customer) {
		t.Errorf("the superseded effect's page shows a hidden field")
	}
}

// The supersede form carries the version of the effect its page showed
// (signed, not the payload hash, which would let a reader test guesses of
// the hidden fields): of two operators who loaded the page, the second to
// supersede is refused, the first's correction kept. A change between the
// console's read and the database's write is refused the same way.
func TestConsole_SupersedeRefusesAStalePage(t *testing.T) {
	t.Parallel()
	var meanwhile atomic.Pointer[func() error]
	e := newEnv(t, func(c *console.Config) {
		ops, err := admin.New(c.Store, &admin.Config{Check: func(kind string, p json.RawMessage) error {
			if f := meanwhile.Swap(nil); f != nil {
				return (*f)()
			}
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		c.Ops = ops
	})
	e.enqueue("email.receipt", `{"template_id":"d-old","customer_email":"c@example.com"}`, "s-1")
	id := e.operate("email.receipt", 1, effects.Failed, "400: no such template")[0]
	path := fmt.Sprintf("/effects/%d/supersede", id)
	first, second := e.login(console.Operator), e.login(console.Admin)
	firstPage, secondPage := first.page(fmt.Sprintf("/effects/%d", id)), second.page(fmt.Sprintf("/effects/%d", id))
	if hash := hex.EncodeToString(e.effect(id).PayloadHash); strings.Contains(firstPage, hash) {
		t.Fatalf("the page shows the payload hash %s", hash)
	}
	submit := func(c *client, page, template string) answer {
		form := hiddenInputs(t, page, path)
		form.Set("payload", `{"template_id":"`+template+`","customer_email":"(hidden)"}`)
		form.Set("note", "the template was renamed")
		return c.post(path, form)
	}
	if a := submit(first, firstPage, "d-first"); a.status != http.StatusSeeOther {
		t.Fatalf("the first supersede: %d\n%s", a.status, a.body)
	}
	a := submit(second, secondPage, "d-second")
	if a.status != http.StatusConflict || !strings.Contains(a.body, "it changed since you loaded its page") || !strings.Contains(a.body, "it is at revision 1") {
		t.Fatalf("the second supersede, from a stale page: %d\n%s", a.status, a.body)
	}
	got := e.effect(id)
	if got.Revision != 1 || !strings.Contains(string(got.Payload), "d-first") || len(e.history(id)) != 1 {
		t.Fatalf("after the refusal: %s (revision %d), %d events; want the first's correction only", got.Payload, got.Revision, len(e.history(id)))
	}
	// A form without the version is refused too.
	form := hiddenInputs(t, secondPage, path)
	form.Del("version")
	form.Set("payload", `{"template_id":"d-third"}`)
	form.Set("note", "x")
	if a := second.post(path, form); a.status != http.StatusConflict {
		t.Errorf("a supersede without the version: %d, want 409", a.status)
	}

	// Another supersede lands while the console's is being checked: the
	// database refuses the console's, which says so by revision.
	page := second.page(fmt.Sprintf("/effects/%d", id))
	other := func() error {
		cur, err := e.store.Get(context.Background(), id)
		if err != nil {
			return err
		}
		_, err = e.store.Supersede(context.Background(), id, cur.Version(), json.RawMessage(`{"template_id":"d-cli","customer_email":"c@example.com"}`), 1, effects.By{Actor: "cli", Note: "fix"})
		return err
	}
	meanwhile.Store(&other)
	a = submit(second, page, "d-console")
	if a.status != http.StatusConflict || !strings.Contains(a.body, "it changed since it was read (it is at revision 2)") || regexp.MustCompile(`[0-9a-f]{64}`).MatchString(a.body) {
		t.Fatalf("a supersede overtaken in the database: %d\n%s", a.status, a.body)
	}
	if got := e.effect(id); got.Revision != 2 || !strings.Contains(string(got.Payload), "d-cli") {
		t.Fatalf("after the overtaken supersede: %s (revision %d), want the other's", got.Payload, got.Revision)
	}
}

// No user of the console sees the hidden fields, so none changes them:
// a supersede, on one effect or in bulk, that would change, remove or add
// a hidden field (a recipient among them) is refused and changes nothing;
// one that leaves them as they are goes through and keeps their values.
func TestConsole_SupersedeKeepsTheHiddenFields(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const to, customer = "recipient.secret@example.com", "customer.hidden@example.com"
	e.enqueue("email.receipt", `{"personalizations":[{"to":[{"email":"`+to+`","name":"A"}]}],"customer_email":"`+customer+`","template_id":"d-old"}`, "h-1", "h-2")
	ids := e.operate("email.receipt", 2, effects.Failed, "400: no such template")
	before := map[int64]string{}
	for _, id := range ids {
		before[id] = string(e.effect(id).Payload)
	}
	unchanged := func(what string) {
		t.Helper()
		for _, id := range ids {
			if got := e.effect(id); got.Revision != 0 || string(got.Payload) != before[id] {
				t.Fatalf("%s changed effect %d: %s", what, id, got.Payload)
			}
		}
	}
	op := e.login(console.Operator)
	path := fmt.Sprintf("/effects/%d/supersede", ids[0])
	page := op.page(fmt.Sprintf("/effects/%d", ids[0]))
	for name, c := range map[string]struct{ written, says string }{
		"another recipient":        {`{"personalizations":[{"to":[{"email":"me@example.com","name":"A"}]}],"customer_email":"(hidden)","template_id":"d-new"}`, "writes a value at the hidden field"},
		"a recipient added":        {`{"personalizations":[{"to":[{"email":"(hidden)","name":"A"},{"email":"me@example.com"}]}],"customer_email":"(hidden)","template_id":"d-new"}`, "writes a value at the hidden field"},
		"a hidden field removed":   {`{"personalizations":[{"to":[{"email":"(hidden)","name":"A"}]}],"template_id":"d-new"}`, "it would change the hidden field"},
		"a hidden field rewritten": {`{"personalizations":[{"to":[{"email":"(hidden)","name":"A"}]}],"customer_email":"me@example.com","template_id":"d-new"}`, "writes a value at the hidden field"},
		// The right value is refused as a wrong one is: no answer tells
		// a guess of a hidden value from the value.
		"a hidden field guessed right": {`{"personalizations":[{"to":[{"email":"(hidden)","name":"A"}]}],"customer_email":"` + customer + `","template_id":"d-new"}`, "writes a value at the hidden field"},
	} {
		form := hiddenInputs(t, page, path)
		form.Set("payload", c.written)
		form.Set("note", "send it to me")
		if a := op.post(path, form); a.status != http.StatusForbidden || !strings.Contains(a.body, c.says) {
			t.Errorf("%s: %d\n%s", name, a.status, a.body)
		}
	}
	unchanged("a supersede of a hidden field")

	bulk := func(patch string) answer {
		t.Helper()
		preview := op.page("/bulk?action=supersede&state=failed&kind=email.receipt&patch=" + url.QueryEscape(patch))
		form := hiddenInputs(t, preview, "/bulk")
		form.Set("note", "the template was renamed")
		return op.bulk(form)
	}
	// A patch that sets a hidden field is refused from the patch alone,
	// before any effect is read: the right value as a wrong one.
	for _, patch := range []string{
		`{"customer_email":"me@example.com"}`,
		`{"customer_email":"` + customer + `"}`,
		`{"customer_email":null}`,
		`{"personalizations":[{"to":[{"email":"me@example.com"}]}]}`,
	} {
		a := op.get("/bulk?action=supersede&state=failed&kind=email.receipt&patch=" + url.QueryEscape(patch))
		if a.status != http.StatusForbidden || !strings.Contains(a.body, "sets the hidden field") {
			t.Errorf("bulk patch %s: %d\n%s", patch, a.status, a.body)
		}
	}
	unchanged("a bulk supersede of a hidden field")

	if a := bulk(`{"template_id":"d-new"}`); a.status != http.StatusOK || !strings.Contains(a.body, "2 done, 0 skipped") {
		t.Fatalf("a bulk patch of a visible field: %d\n%s", a.status, a.body)
	}
	for _, id := range ids {
		if got := string(e.effect(id).Payload); !strings.Contains(got, "d-new") || !strings.Contains(got, to) || !strings.Contains(got, customer) {
			t.Errorf("effect %d after the patch: %s", id, got)
		}
	}
}

func TestConsole_ProxyHeadersOnlyFromATrustedAddress(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) {
		c.Auth.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00::/8")}
		c.Auth.IdentityHeader, c.Auth.RoleHeader = "X-Forwarded-User", "X-Forwarded-Role"
	})
	e.enqueue("email.receipt", `{"n":1}`, "p-1")
	id := e.operate("email.receipt", 1, effects.Uncertain, "timeout")[0]
	serve := func(method, remote, path string, header map[string]string, form url.Values) *httptest.ResponseRecorder {
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		r := httptest.NewRequest(method, path, body)
		r.RemoteAddr = remote
		if form != nil {
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		for k, v := range header {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		e.h.ServeHTTP(w, r)
		return w
	}
	asOperator := map[string]string{"X-Forwarded-User": "sso:operator@example", "X-Forwarded-Role": "operator"}
	w := serve("GET", "10.1.2.3:5555", fmt.Sprintf("/effects/%d", id), asOperator, nil)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "sso:operator@example") || !strings.Contains(w.Body.String(), `/resolve"`) {
		t.Fatalf("from a trusted proxy: %d\n%s", w.Code, w.Body.String())
	}
	token := csrf(t, w.Body.String())
	for _, remote := range []string{"192.0.2.9:5555", "10.2.0.1:80", "[2001:db8::1]:443"} {
		if w := serve("GET", remote, "/", asOperator, nil); w.Code != http.StatusSeeOther || !strings.HasPrefix(w.Header().Get("Location"), "/login") {
			t.Errorf("headers from %s were believed: %d", remote, w.Code)
		}
		form := url.Values{"csrf": {token}, "as": {"confirmed"}, "note": {"spoofed"}}
		if w := serve("POST", remote, fmt.Sprintf("/effects/%d/resolve", id), asOperator, form); w.Code != http.StatusUnauthorized {
			t.Errorf("a POST with headers from %s: %d, want 401", remote, w.Code)
		}
	}
	if got := e.effect(id); got.State != effects.Uncertain {
		t.Fatalf("a spoofed header resolved the effect: %s", got.State)
	}
	// A role that is none is refused; no role is a viewer.
	if w := serve("GET", "10.1.2.3:1", "/", map[string]string{"X-Forwarded-User": "x", "X-Forwarded-Role": "root"}, nil); w.Code != http.StatusUnauthorized {
		t.Errorf("a bad role: %d", w.Code)
	}
	if w := serve("GET", "[fd00::7]:1", fmt.Sprintf("/effects/%d", id), map[string]string{"X-Forwarded-User": "reader"}, nil); w.Code != http.StatusOK || strings.Contains(w.Body.String(), `class="act`) {
		t.Errorf("a user without a role: %d, or shown action forms", w.Code)
	}
	// Behind a proxy that rewrites Host, its X-Forwarded-Host is the
	// console's host; another origin is still refused.
	form := url.Values{"csrf": {token}, "as": {"confirmed"}, "note": {"checked at SendGrid"}, "attempt": {"1"}}
	viaProxy := map[string]string{"Origin": "https://console.example", "X-Forwarded-Host": "evil.example"}
	for k, v := range asOperator {
		viaProxy[k] = v
	}
	if w := serve("POST", "10.1.2.3:5555", fmt.Sprintf("/effects/%d/resolve", id), viaProxy, form); w.Code != http.StatusForbidden {
		t.Fatalf("a proxied POST from another origin: %d", w.Code)
	}
	viaProxy["X-Forwarded-Host"] = "console.example"
	if w := serve("POST", "10.1.2.3:5555", fmt.Sprintf("/effects/%d/resolve", id), viaProxy, form); w.Code != http.StatusSeeOther {
		t.Fatalf("the proxied operator's resolve: %d\n%s", w.Code, w.Body.String())
	}
	if h := e.history(id); len(h) != 1 || h[0].Actor != "sso:operator@example" {
		t.Errorf("history %+v", h)
	}
}

func TestConsole_TokensSignInAndNeverShow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.Auth.SecureCookie = true })
	e.enqueue("email.receipt", `{"n":1}`, "t-1")
	id := e.operate("email.receipt", 1, effects.Uncertain, "timeout")[0]

	// A bad token cannot sign in, nor act as a bearer.
	c := e.client()
	a := c.signIn("sfxc_not-a-token", http.StatusUnauthorized)
	if !strings.Contains(a.body, "not recognised") || strings.Contains(a.body, "sfxc_not-a-token") {
		t.Errorf("a bad token's answer:\n%s", a.body)
	}
	if a := c.get("/"); a.status != http.StatusSeeOther || !strings.HasPrefix(a.header.Get("Location"), "/login") {
		t.Errorf("after a bad token: %d %s", a.status, a.header.Get("Location"))
	}
	c.bearer = "sfxc_not-a-token"
	if a := c.get("/"); a.status != http.StatusUnauthorized {
		t.Errorf("a bad bearer token: %d", a.status)
	}

	// A good one signs in: a cookie that is HttpOnly, SameSite=Strict and
	// Secure (secure_cookie), holding neither the token nor its hash.
	token := e.tokens[console.Operator]
	sum := sha256.Sum256([]byte(token))
	c = e.client()
	body := c.page("/login")
	a = c.post("/login", url.Values{"csrf": {csrf(t, body)}, "token": {token}, "next": {"/effects"}})
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/effects" {
		t.Fatalf("sign in: %d %s", a.status, a.header.Get("Location"))
	}
	var session string
	for _, sc := range a.header.Values("Set-Cookie") {
		if strings.Contains(sc, token) || strings.Contains(sc, hex.EncodeToString(sum[:])) {
			t.Errorf("a cookie holds the token or its hash: %s", sc)
		}
		if strings.HasPrefix(sc, "sidefx_console=") {
			session = sc
		}
	}
	for _, attr := range []string{"HttpOnly", "SameSite=Strict", "Secure", "Path=/"} {
		if !strings.Contains(session, attr) {
			t.Errorf("the session cookie lacks %s: %s", attr, session)
		}
	}
	u, _ := url.Parse(e.srv.URL)
	for _, ck := range c.c.Jar.Cookies(u) {
		if strings.Contains(ck.Value, token) {
			t.Errorf("cookie %s holds the token", ck.Name)
		}
	}
	pages := []string{"/", "/effects", fmt.Sprintf("/effects/%d", id), "/runs", "/login", "/bulk?action=refire"}
	for _, path := range pages {
		a := c.get(path)
		if a.status != http.StatusOK {
			t.Errorf("GET %s: %d", path, a.status)
		}
		if strings.Contains(a.body, token) || strings.Contains(a.body, hex.EncodeToString(sum[:])) {
			t.Errorf("GET %s shows the token or its hash", path)
		}
		for k, want := range map[string]string{"X-Frame-Options": "DENY", "Referrer-Policy": "same-origin"} {
			if got := a.header.Get(k); got != want {
				t.Errorf("GET %s: %s %q, want %q", path, k, got, want)
			}
		}
		if csp := a.header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: CSP %q", path, csp)
		}
		if !strings.Contains(a.body, `name="viewport"`) {
			t.Errorf("GET %s has no viewport", path)
		}
	}
	if css := c.page("/static/console.css"); !strings.Contains(css, "overflow-x: auto") || !strings.Contains(css, "@media (max-width") {
		t.Errorf("the stylesheet does not let tables scroll on narrow screens")
	}

	// A bearer token works for scripts, with the same CSRF rule.
	script := e.client()
	script.bearer = e.tokens[console.Admin]
	page := script.page(fmt.Sprintf("/effects/%d", id))
	if !strings.Contains(page, e.actors[console.Admin]) {
		t.Errorf("the bearer's page does not name its actor")
	}
	if a := script.post(fmt.Sprintf("/effects/%d/refire", id), url.Values{"note": {"no csrf"}}); a.status != http.StatusForbidden {
		t.Errorf("a bearer POST without a CSRF token: %d", a.status)
	}
	if a := script.post(fmt.Sprintf("/effects/%d/refire", id), url.Values{"csrf": {csrf(t, page)}, "note": {"scripted"}, "attempt": {"1"}}); a.status != http.StatusSeeOther {
		t.Errorf("a bearer POST: %d\n%s", a.status, a.body)
	}

	// Signing out ends the session: its cookie, sent again, is refused.
	old := strings.TrimPrefix(strings.SplitN(session, ";", 2)[0], "sidefx_console=")
	if a := c.post("/logout", url.Values{"csrf": {csrf(t, c.page("/"))}}); a.status != http.StatusSeeOther {
		t.Fatalf("sign out: %d", a.status)
	}
	stale := e.client()
	stale.c.Jar.SetCookies(u, []*http.Cookie{{Name: "sidefx_console", Value: old}})
	if a := stale.get("/"); a.status != http.StatusSeeOther {
		t.Errorf("a signed-out session's cookie: %d, want a redirect to sign in", a.status)
	}
}

func TestConsole_PausesByRole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	op := e.login(console.Operator)
	overview := op.page("/")
	if strings.Contains(overview, "Pause a provider") || !strings.Contains(overview, "Pause a kind") {
		t.Errorf("an operator's overview: the wrong pause forms")
	}
	token := csrf(t, overview)
	pause := func(c *client, token, scope, name, opName string) int {
		return c.post("/pause", url.Values{"csrf": {token}, "scope": {scope}, "name": {name}, "op": {opName}, "note": {"incident 42"}}).status
	}
	if s := pause(op, token, "kind", "email.receipt", "pause"); s != http.StatusSeeOther {
		t.Errorf("an operator pausing a kind: %d", s)
	}
	if s := pause(op, token, "provider", "stripe", "pause"); s != http.StatusForbidden {
		t.Errorf("an operator pausing a provider: %d, want 403", s)
	}
	// A typo pauses nothing, and says so.
	if a := op.post("/pause", url.Values{"csrf": {token}, "scope": {"kind"}, "name": {"emial.receipt"}, "op": {"pause"}, "note": {"incident 42"}}); a.status != http.StatusBadRequest || !strings.Contains(a.body, "did you mean &#34;email.receipt&#34;") {
		t.Errorf("an operator pausing a misspelt kind: %d\n%s", a.status, a.body)
	}
	boss := e.login(console.Admin)
	atoken := csrf(t, boss.page("/"))
	if s := pause(boss, atoken, "provider", "stripe", "pause"); s != http.StatusSeeOther {
		t.Errorf("an admin pausing a provider: %d", s)
	}
	ps, _ := e.store.Pauses(context.Background())
	if len(ps) != 2 || ps[0].Actor != "operator on call" || ps[1].Actor != "admin on call" || ps[1].Note != "incident 42" {
		t.Errorf("pauses %+v", ps)
	}
	overview = op.page("/?done=paused")
	if !strings.Contains(overview, "Paused.") || !strings.Contains(overview, "<strong>stripe</strong>") || !strings.Contains(overview, "<strong>email.receipt</strong>") {
		t.Errorf("the overview does not show the pauses:\n%s", overview)
	}
	if s := pause(op, token, "provider", "stripe", "resume"); s != http.StatusForbidden {
		t.Errorf("an operator resuming a provider: %d, want 403", s)
	}
	if s := pause(op, token, "kind", "email.receipt", "resume"); s != http.StatusSeeOther {
		t.Errorf("an operator resuming a kind: %d", s)
	}
	if s := pause(op, token, "kind", "email.receipt", "resume"); s != http.StatusConflict {
		t.Errorf("resuming what is not paused: %d, want 409", s)
	}
}

func TestConsole_OverviewAndRunsShowTheLastRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("email.receipt", `{"n":1}`, "r-1", "r-2", "r-3")
	e.operate("email.receipt", 1, effects.Uncertain, "timeout")
	e.operate("email.receipt", 1, effects.Failed, "rejected")
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO sidefx_drift_runs (runner, finished_at, errors, stuck) VALUES ('replica-a', now(), 0, '{"uncertain": 1, "failed": 1}')`,
		`INSERT INTO sidefx_drift_findings (run_id, rule, kind, missing, missing_ids) SELECT max(id), 'paid_orders_have_receipts', 'email.receipt', 2, '{order-77,order-78}' FROM sidefx_drift_runs`,
		`INSERT INTO sidefx_reconcile_runs (runner, finished_at) VALUES ('replica-b', now())`,
		`INSERT INTO sidefx_reconcile_findings (run_id, finding, kind, provider, key, ref, detail) SELECT max(id), 'extra', 'charge.create', 'stripe', 'sfx1_x', 'ch_orphan', 'a charge no effect is confirmed with' FROM sidefx_reconcile_runs`,
	} {
		if _, err := e.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// A live dispatcher's heartbeat: the mail provider asked it to wait,
	// and failed three times in a row.
	if err := e.eng.Beat(ctx, engine.Beat{Worker: "replica-a", Kinds: []string{"email.receipt"}, Interval: time.Minute,
		Status: []engine.KindBeat{{Kind: "email.receipt", Provider: "mail", PausedFor: time.Hour, InFlight: 2, Limit: 50, Failures: 3, MaxAttempts: 25}}}); err != nil {
		t.Fatal(err)
	}
	v := e.login(console.Viewer)
	overview := v.page("/")
	for _, want := range []string{"email.receipt", "paid_orders_have_receipts", "order-77", "ch_orphan", "extra 1", `<span class="n">1</span> uncertain`, `<span class="n">1</span> failed`,
		"<h2>Providers</h2>", "<strong>mail</strong>", "2 / 50", `<span class="warn">3</span>`, `<span class="warn">until `} {
		if !strings.Contains(overview, want) {
			t.Errorf("the overview lacks %q:\n%s", want, overview)
		}
	}
	runs := v.page("/runs")
	for _, want := range []string{"replica-a", "replica-b", "paid_orders_have_receipts", "ch_orphan"} {
		if !strings.Contains(runs, want) {
			t.Errorf("the runs page lacks %q", want)
		}
	}
}

// Failed sign-ins are limited per address: after ten, the form and bearer
// tokens get 429 with Retry-After, the right token included, until the
// allowance comes back with time.
func TestConsole_FailedSignInsAreThrottled(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	e := newEnv(t, func(c *console.Config) {
		c.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	})
	c := e.client()
	for i := range 10 {
		c.signIn(fmt.Sprintf("sfxc_guess_%d", i), http.StatusUnauthorized)
	}
	a := c.signIn(e.tokens[console.Operator], http.StatusTooManyRequests)
	if a.header.Get("Retry-After") == "" || !strings.Contains(a.body, "too many failed sign-ins") {
		t.Fatalf("the 11th try: Retry-After %q\n%s", a.header.Get("Retry-After"), a.body)
	}
	// A bearer token from the same address is refused too, unchecked.
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/effects", nil)
	req.Header.Set("Authorization", "Bearer "+e.tokens[console.Operator])
	if b := c.do(req); b.status != http.StatusTooManyRequests {
		t.Fatalf("a bearer token while throttled: %d", b.status)
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	c.signIn(e.tokens[console.Operator], http.StatusSeeOther)
}

// Behind a trusted proxy, failures are counted for the client the proxy
// saw (the rightmost X-Forwarded-For entry that is not a trusted proxy),
// not for the entries the client writes itself; from any other peer, the
// header is ignored.
func TestConsole_SignInThrottleKeysOnTheAddressTheProxySaw(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	e := newEnv(t, func(c *console.Config) {
		c.Auth.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
		c.Now = func() time.Time { return now }
	})
	serve := func(r *http.Request, remote, xff string) *httptest.ResponseRecorder {
		r.RemoteAddr = remote
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		w := httptest.NewRecorder()
		e.h.ServeHTTP(w, r)
		return w
	}
	// signIn sends the sign-in form with a guessed token.
	signIn := func(remote, xff string) int {
		t.Helper()
		w := serve(httptest.NewRequest(http.MethodGet, "/login", nil), remote, xff)
		if w.Code != http.StatusOK {
			return w.Code
		}
		form := url.Values{"csrf": {csrf(t, w.Body.String())}, "token": {"sfxc_guess"}}
		r := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for _, c := range w.Result().Cookies() {
			r.AddCookie(c)
		}
		return serve(r, remote, xff).Code
	}
	bearer := func(remote, xff string) int {
		r := httptest.NewRequest(http.MethodGet, "/effects", nil)
		r.Header.Set("Authorization", "Bearer sfxc_guess")
		return serve(r, remote, xff).Code
	}

	// A client through two trusted proxies writes a new first entry on
	// every try: the limit holds.
	const proxy = "10.1.2.3:5555"
	for i := range 10 {
		if got := signIn(proxy, fmt.Sprintf("198.51.100.%d, 203.0.113.7, 10.1.9.9", i)); got != http.StatusUnauthorized {
			t.Fatalf("bad sign-in %d: %d, want 401", i+1, got)
		}
	}
	if got := signIn(proxy, "198.51.100.77, 203.0.113.7, 10.1.9.9"); got != http.StatusTooManyRequests {
		t.Fatalf("the 11th bad sign-in with a new first entry: %d, want 429", got)
	}
	if got := bearer(proxy, "192.0.2.200,203.0.113.7"); got != http.StatusTooManyRequests {
		t.Errorf("a bearer token from the throttled client: %d, want 429", got)
	}
	// Another client behind the same proxy is not locked out.
	if got := signIn(proxy, "198.51.100.1, 203.0.113.8"); got != http.StatusUnauthorized {
		t.Errorf("another client behind the proxy: %d, want 401", got)
	}

	// From a peer that is no trusted proxy, X-Forwarded-For is ignored:
	// varying it does not help, and naming another client does not
	// throttle that one.
	for i := range 10 {
		if got := bearer("192.0.2.9:4444", fmt.Sprintf("198.51.100.%d", i)); got != http.StatusUnauthorized {
			t.Fatalf("bad bearer %d from an untrusted peer: %d, want 401", i+1, got)
		}
	}
	if got := bearer("192.0.2.9:4445", "198.51.100.99"); got != http.StatusTooManyRequests {
		t.Errorf("the 11th bad bearer from an untrusted peer: %d, want 429", got)
	}
	if got := bearer("192.0.2.10:4444", "192.0.2.9"); got != http.StatusUnauthorized {
		t.Errorf("a peer naming the throttled one in X-Forwarded-For: %d, want 401", got)
	}
}

// The console's warning (Config.Warning) is at the top of every page,
// the sign-in page included; without one there is none.
func TestConsole_ShowsItsWarningOnEveryPage(t *testing.T) {
	t.Parallel()
	const warning = "this console listens on 0.0.0.0:8080 over plain HTTP"
	e := newEnv(t, func(c *console.Config) { c.Warning = warning })
	if body := e.client().page("/login"); !strings.Contains(body, `<p class="error" role="alert">`+warning) {
		t.Errorf("the sign-in page lacks the warning:\n%s", body)
	}
	plain := newEnv(t, nil)
	if body := plain.client().page("/login"); strings.Contains(body, "plain HTTP") {
		t.Errorf("a console without a warning shows one:\n%s", body)
	}
}

// stripeLink is the Stripe provider's dashboard link, as the daemon gives
// it to the console.
var stripeLink = (&stripe.Provider{}).DashboardLink

// mustAdmin returns the operations API on s.
func mustAdmin(t testing.TB, s *engine.Store) *admin.Admin {
	t.Helper()
	o, err := admin.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// A page's decision applies to the attempt it showed: resolving an
// uncertain effect as failed from a page read after attempt 1 is refused
// once the effect was sent again and is uncertain after attempt 2, which
// may have been performed.
func TestConsole_AFormActsOnTheAttemptItShowed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("email.receipt", `{"n":1}`, "a-1")
	id := e.operate("email.receipt", 1, effects.Uncertain, "timeout")[0]
	op := e.login(console.Operator)
	path := fmt.Sprintf("/effects/%d/resolve", id)
	form := hiddenInputs(t, op.page(fmt.Sprintf("/effects/%d", id)), path)
	if form.Get("attempt") != "1" {
		t.Fatalf("the resolve form carries attempt %q, want 1: %v", form.Get("attempt"), form)
	}
	ctx := context.Background()
	if _, err := e.store.Refire(ctx, id, 1, effects.RefireOptions{}, effects.By{Actor: "another operator"}); err != nil {
		t.Fatal(err)
	}
	got, err := e.eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"email.receipt"}, Limit: 1, Lease: time.Minute, Worker: "test"})
	if err != nil || len(got) != 1 || got[0].Attempts != 2 {
		t.Fatalf("claim again: %v, %v", got, err)
	}
	if _, err := e.eng.Complete(ctx, []engine.Outcome{{ID: id, Attempt: 2, State: effects.Uncertain, Error: "timeout", MaybePerformed: true}}); err != nil {
		t.Fatal(err)
	}
	form.Set("as", "failed")
	form.Set("note", "the provider shows nothing")
	a := op.post(path, form)
	if a.status != http.StatusConflict || !strings.Contains(a.body, "made attempt 2 since") {
		t.Fatalf("resolve from a page of attempt 1: %d\n%s", a.status, a.body)
	}
	if got := e.effect(id); got.State != effects.Uncertain {
		t.Fatalf("the refused resolve changed the effect: %s", got.State)
	}
	if a := op.post(path, url.Values{"csrf": form["csrf"], "as": {"failed"}, "attempt": {"x"}, "note": {"n"}}); a.status != http.StatusBadRequest {
		t.Errorf("an attempt that is not a count: %d", a.status)
	}
}

// A provider's check that quotes what the operator wrote tells nothing of
// a hidden field: its reason, about the payload with the hidden values
// restored, is not shown, so a guess written as a field's name reads the
// same right or wrong, on one effect and in bulk. A hidden null is kept
// as null.
func TestConsole_ACheckRefusalTellsNothingOfHiddenFields(t *testing.T) {
	t.Parallel()
	const customer = "customer.hidden@example.com"
	e := newEnv(t, func(c *console.Config) {
		ops, err := admin.New(c.Store, &admin.Config{Check: func(kind string, p json.RawMessage) error {
			var known struct {
				CustomerEmail any    `json:"customer_email"`
				TemplateID    string `json:"template_id"`
			}
			d := json.NewDecoder(bytes.NewReader(p))
			d.DisallowUnknownFields()
			return d.Decode(&known) // quotes an unknown field's name
		}})
		if err != nil {
			t.Fatal(err)
		}
		c.Ops = ops
	})
	e.enqueue("email.receipt", `{"customer_email":"`+customer+`","template_id":"d-old"}`, "c-1", "c-2")
	e.enqueue("email.receipt", `{"customer_email":null,"template_id":"d-old"}`, "c-null")
	ids := e.operate("email.receipt", 3, effects.Failed, "400: no such template")
	op := e.login(console.Operator)
	path := fmt.Sprintf("/effects/%d/supersede", ids[0])
	page := op.page(fmt.Sprintf("/effects/%d", ids[0]))
	var bodies []string
	for _, guess := range []string{customer, "someone.else@example.com"} {
		form := hiddenInputs(t, page, path)
		form.Set("payload", `{"customer_email":"(hidden)","template_id":"d-new","`+guess+`":1}`)
		form.Set("note", "probe")
		a := op.post(path, form)
		if a.status != http.StatusBadRequest || !strings.Contains(a.body, "it is not shown here") {
			t.Fatalf("a supersede its check refuses, guessing %s: %d\n%s", guess, a.status, a.body)
		}
		bodies = append(bodies, a.body)
	}
	if strings.Contains(bodies[1], "someone.else") {
		t.Errorf("the refusal quotes what was written:\n%s", bodies[1])
	}
	for _, guess := range []string{customer, "someone.else@example.com"} {
		preview := op.page("/bulk?action=supersede&state=failed&kind=email.receipt&patch=" + url.QueryEscape(`{"`+guess+`":1}`))
		form := hiddenInputs(t, preview, "/bulk")
		form.Set("note", "probe")
		a := op.bulk(form)
		// Effect 3 has no hidden value to tell of: its reason is shown.
		if a.status != http.StatusOK || strings.Contains(a.body, "(hidden)") || strings.Count(a.body, "it is not shown here") != 2 || !strings.Contains(a.body, "0 done, 3 skipped") {
			t.Errorf("a bulk patch guessing %s: %d\n%s", guess, a.status, a.body)
		}
	}
	// The effect whose hidden field is null: superseded as shown, null kept.
	npath := fmt.Sprintf("/effects/%d/supersede", ids[2])
	form := hiddenInputs(t, op.page(fmt.Sprintf("/effects/%d", ids[2])), npath)
	form.Set("payload", `{"customer_email":"(hidden)","template_id":"d-new"}`)
	form.Set("note", "template renamed")
	if a := op.post(npath, form); a.status != http.StatusSeeOther {
		t.Fatalf("a supersede of an effect with a hidden null: %d\n%s", a.status, a.body)
	}
	if got := string(e.effect(ids[2]).Payload); !strings.Contains(got, `"customer_email": null`) || !strings.Contains(got, "d-new") {
		t.Errorf("after the supersede: %s", got)
	}
}

// A form acts on the version its page showed: a cancel from a page read
// before another operator's supersede (which keeps the attempts, and the
// state pending) is refused, and the corrected effect stays pending.
func TestConsole_AFormActsOnTheVersionItShowed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("email.receipt", `{"template_id":"d-old"}`, "v-1")
	cur, err := e.store.GetBySource(context.Background(), "v-1", "email.receipt")
	if err != nil {
		t.Fatal(err)
	}
	id := cur.ID
	op := e.login(console.Operator)
	path := fmt.Sprintf("/effects/%d/cancel", id)
	form := hiddenInputs(t, op.page(fmt.Sprintf("/effects/%d", id)), path)
	if form.Get("version") == "" || form.Get("attempt") != "0" {
		t.Fatalf("the cancel form carries %v", form)
	}
	if _, err := e.store.Supersede(context.Background(), id, cur.Version(), json.RawMessage(`{"template_id":"d-new"}`), 1, effects.By{Actor: "another operator"}); err != nil {
		t.Fatal(err)
	}
	form.Set("note", "order withdrawn")
	if a := op.post(path, form); a.status != http.StatusConflict || !strings.Contains(a.body, "changed since you loaded its page") {
		t.Fatalf("a cancel from a page read before a supersede: %d\n%s", a.status, a.body)
	}
	if got := e.effect(id); got.State != effects.Pending || got.Revision != 1 {
		t.Fatalf("after the refused cancel: %s revision %d", got.State, got.Revision)
	}
}

// A note is no oracle for a hidden field: its author reads it as written,
// a right guess as a wrong one; anyone else reads it blotted.
func TestConsole_ANoteTellsItsAuthorNothingOfHiddenFields(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const customer = "customer.hidden@example.com"
	e.enqueue("email.receipt", `{"customer_email":"`+customer+`","template_id":"d-old"}`, "n-1")
	id := e.operate("email.receipt", 1, effects.Failed, "400: no such template")[0]
	op := e.login(console.Operator)
	path := fmt.Sprintf("/effects/%d/retry", id)
	form := hiddenInputs(t, op.page(fmt.Sprintf("/effects/%d", id)), path)
	note := "is it " + customer + " or someone.else@example.com?"
	form.Set("note", note)
	if a := op.post(path, form); a.status != http.StatusSeeOther {
		t.Fatalf("retry: %d\n%s", a.status, a.body)
	}
	if page := op.page(fmt.Sprintf("/effects/%d", id)); !strings.Contains(page, "is it "+customer+" or someone.else@example.com?") {
		t.Errorf("the note's author does not read it as written:\n%s", page)
	}
	viewer := e.login(console.Viewer)
	if page := viewer.page(fmt.Sprintf("/effects/%d", id)); strings.Contains(page, customer) || !strings.Contains(page, "is it (hidden) or someone.else@example.com?") {
		t.Errorf("another user reads the note unblotted:\n%s", page)
	}
}

// A quarantined effect (its lease ran out max_rescues times in a row) shows
// why on its page and in the list of uncertain effects.
func TestConsole_ShowsWhyAnEffectIsQuarantined(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	e.enqueue("email.receipt", `{"to":"x"}`, "poison")
	got, err := e.eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"email.receipt"}, Limit: 1, Lease: time.Millisecond, Worker: "w#1"})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %d, %v", len(got), err)
	}
	id := got[0].ID
	policy := []engine.RescuePolicy{{Kind: "email.receipt", Repeatable: true, MaxAttempts: 5, MaxRescues: 1}}
	deadline := time.Now().Add(10 * time.Second)
	for e.effect(id).State == effects.Fired {
		if time.Now().After(deadline) {
			t.Fatal("effect not rescued within 10s")
		}
		if _, err := e.eng.Rescue(ctx, policy, 10); err != nil {
			t.Fatal(err)
		}
	}
	const why = "quarantined: its claim or call ended the process 1 times in a row"
	if got := e.effect(id); got.State != effects.Uncertain || !strings.HasPrefix(got.LastError, why) {
		t.Fatalf("effect %d: %s (%q), want uncertain, quarantined", id, got.State, got.LastError)
	}
	op := e.login(console.Viewer)
	for _, path := range []string{fmt.Sprintf("/effects/%d", id), "/effects?state=uncertain"} {
		if page := op.page(path); !strings.Contains(page, why) {
			t.Errorf("%s does not say why the effect is quarantined:\n%s", path, page)
		}
	}
}

// The effect's page and the list show the latest attempt's error and
// answer only, saying whose: attempt 6's 429 body never stands beside
// attempt 7's EOF, and a confirmation shows no error of an earlier attempt.
func TestConsole_ShowsTheLatestAttemptOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	e.enqueue("email.receipt", `{"n":1}`, "eof")
	e.enqueue("charge.create", `{"n":2}`, "ok")
	settle := func(kind string, last engine.Outcome) int64 {
		t.Helper()
		var id int64
		for attempt := 1; attempt <= 7; attempt++ {
			got, err := e.eng.Claim(ctx, engine.ClaimParams{Kinds: []string{kind}, Limit: 1, Lease: time.Minute, Worker: "test"})
			if err != nil || len(got) != 1 || got[0].Attempts != attempt {
				t.Fatalf("claim of attempt %d: %v, %v", attempt, got, err)
			}
			id = got[0].ID
			o := engine.Outcome{ID: id, Attempt: attempt, State: effects.Pending, Detail: json.RawMessage(`{"status": 429, "body": "rate limited"}`),
				Error: fmt.Sprintf("attempt %d of 8: retryable: 429 Too Many Requests", attempt)}
			if attempt == 7 {
				o = last
				o.ID, o.Attempt = id, attempt
			}
			if _, err := e.eng.Complete(ctx, []engine.Outcome{o}); err != nil {
				t.Fatal(err)
			}
		}
		return id
	}
	eof := settle("email.receipt", engine.Outcome{State: effects.Uncertain, MaybePerformed: true, Error: "attempt 7 of 8: unknown: EOF"})
	ok := settle("charge.create", engine.Outcome{State: effects.Confirmed, ProviderRef: "ch_7", Detail: json.RawMessage(`{"id": "ch_7"}`)})
	viewer := e.login(console.Viewer)
	page := viewer.page(fmt.Sprintf("/effects/%d", eof))
	if !strings.Contains(page, "attempt 7 of 8: unknown: EOF") || strings.Contains(page, "rate limited") || !strings.Contains(page, "None stored for attempt 7.") {
		t.Errorf("the page of the effect whose attempt 7 ended in an EOF:\n%s", page)
	}
	page = viewer.page(fmt.Sprintf("/effects/%d", ok))
	if strings.Contains(page, "429") || !strings.Contains(page, "(confirmed by attempt 7)") || !strings.Contains(page, "Outcome (the provider's answer to attempt 7)") ||
		!strings.Contains(page, "ch_7") {
		t.Errorf("the page of the effect attempt 7 confirmed:\n%s", page)
	}
	if list := viewer.page("/effects"); strings.Contains(list, "429") || !strings.Contains(list, "attempt 7 of 8: unknown: EOF") {
		t.Errorf("the list:\n%s", list)
	}
}
