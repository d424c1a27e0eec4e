package browsertest_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/console"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/browsertest"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers/stripe"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// site is a console on a real PostgreSQL, with a token per role and a few
// effects: receipts uncertain after a kill, a failed charge, pending ones.
type site struct {
	t      *testing.T
	pool   *pgxpool.Pool
	st     *engine.Store
	url    string
	tokens map[console.Role]string
	// uncertain are the uncertain receipts' ids.
	uncertain []int64
}

const (
	viewerActor   = "viewer on call"
	operatorActor = "operator on call"
)

func newSite(t *testing.T) *site {
	t.Helper()
	s := &site{t: t, pool: pgtest.DB(t), tokens: map[console.Role]string{}}
	var err error
	if s.st, err = engine.NewStore(s.pool, nil); err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(s.pool, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var items []effects.NewEffect
	for i := range 8 {
		items = append(items, effects.NewEffect{SourceID: fmt.Sprintf("order-%04d", i+1), Kind: "email.receipt",
			Payload: json.RawMessage(`{"personalizations":[{"to":[{"email":"customer@example.com"}]}],"subject":"Your receipt"}`)})
	}
	for i := range 3 {
		items = append(items, effects.NewEffect{SourceID: fmt.Sprintf("order-%04d", i+1), Kind: "charge.create", Payload: json.RawMessage(`{"amount":1200,"currency":"eur"}`)})
	}
	if _, err := s.st.Insert(ctx, items, 0, ""); err != nil {
		t.Fatal(err)
	}
	settle := func(kind string, n int, st effects.State, why string) []int64 {
		got, err := eng.Claim(ctx, engine.ClaimParams{Kinds: []string{kind}, Limit: n, Lease: time.Minute, Worker: "sidefx-1"})
		if err != nil || len(got) != n {
			t.Fatalf("claim: %d, %v", len(got), err)
		}
		var outs []engine.Outcome
		var ids []int64
		for _, e := range got {
			outs = append(outs, engine.Outcome{ID: e.ID, Attempt: 1, State: st, Error: why, MaybePerformed: st == effects.Uncertain})
			ids = append(ids, e.ID)
		}
		if _, err := eng.Complete(ctx, outs); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	s.uncertain = settle("email.receipt", 5, effects.Uncertain, "attempt 1 of 25: unknown: the mail API's answer was lost")
	settle("charge.create", 1, effects.Failed, "attempt 1 of 25: rejected: card_declined")
	var lines strings.Builder
	for role, actor := range map[console.Role]string{console.Viewer: viewerActor, console.Operator: operatorActor} {
		b := make([]byte, 24)
		_, _ = rand.Read(b)
		s.tokens[role] = "sfxc_" + hex.EncodeToString(b)
		sum := sha256.Sum256([]byte(s.tokens[role]))
		fmt.Fprintf(&lines, "%s %s %s\n", hex.EncodeToString(sum[:]), role, actor)
	}
	tokens, err := console.ParseTokens(lines.String())
	if err != nil {
		t.Fatal(err)
	}
	h, err := console.New(console.Config{Store: s.st, Ops: mustAdmin(t, s.st), DB: s.pool,
		Providers:    map[string]console.Provider{"charge.create": {Name: "stripe", Link: stripeLink}, "email.receipt": {Name: "mail"}},
		HiddenFields: []string{"personalizations.to.email"},
		Auth:         console.Auth{Tokens: tokens}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// signIn signs in with role's token through the login form, as a person
// would, and waits for the page it lands on.
func (s *site) signIn(t *testing.T, ctx context.Context, role console.Role) {
	t.Helper()
	open(t, ctx, s.url+"/login")
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(`input[name="token"]`, s.tokens[role]),
		chromedp.Submit(`input[name="token"]`),
	); err != nil {
		t.Fatalf("signing in as %s: %v", role, err)
	}
	waitFor(t, ctx, "the page after signing in as "+role.String(), `!location.pathname.endsWith("/login") && document.readyState === "complete" && document.querySelector("h1") !== null`)
}

// open navigates to url and waits, polling with waitFor, until the page
// there has loaded with its heading. chromedp.Navigate waits for the
// frame's load event itself, and could miss it: a clean clone's run waited
// 120 s in it after a sign-in's redirect. The page it leaves is marked, so
// that a navigation to the URL already shown waits for the new page.
func open(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.sidefxLeft = true`)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	if err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		switch res, err := cdp.Call(ctx, tg, page.Navigate, page.NavigateParams{URL: url}); {
		case err != nil:
			return err
		case res.ErrorText != "":
			return errors.New(res.ErrorText)
		}
		return nil
	})); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	waitFor(t, ctx, url, `!window.sidefxLeft && location.href === `+fmt.Sprintf("%q", url)+` && document.readyState === "complete" && document.querySelector("h1") !== null`)
}

// waitFor waits until the JavaScript condition holds on the page, for at
// most 20 s.
func waitFor(t *testing.T, ctx context.Context, what, cond string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { try { return !!(`+cond+`) } catch (e) { return false } })()`))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
			t.Fatalf("waited 20 s for %s (%v); the page:\n%s", what, err, body)
		}
		<-tick.C
	}
}

// count counts the elements sel matches on the page.
func count(t *testing.T, ctx context.Context, sel string) int {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// forge submits, from the page, a form it builds itself: to action, with
// fields, the way a hostile page's form would post (no CSRF token unless
// given). It returns the text of the page the post lands on.
func forge(t *testing.T, ctx context.Context, action string, fields map[string]string) string {
	t.Helper()
	js := `(() => { const f = document.createElement("form"); f.method = "post"; f.action = ` + fmt.Sprintf("%q", action) + `;`
	for k, v := range fields {
		js += fmt.Sprintf(`{ const i = document.createElement("input"); i.type = "hidden"; i.name = %q; i.value = %q; f.appendChild(i); }`, k, v)
	}
	// Submitted after the evaluation returns: a navigation started inside
	// it can destroy the page's context before its result is sent, and the
	// evaluation then waits for an answer that never comes (a clean clone's
	// run timed out here after 120 s).
	js += `document.body.appendChild(f); setTimeout(() => f.submit(), 0); return true; })()`
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the forged post's answer", `location.pathname === `+fmt.Sprintf("%q", action)+` && document.readyState === "complete"`)
	body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	return body
}

// A viewer sees the uncertain effects, and no action anywhere; an action
// posted by hand, with the page's own CSRF token, is refused and changes
// nothing.
func TestBrowser_AViewerCannotAct(t *testing.T) {
	s := newSite(t)
	ctx := browsertest.Within(t, browsertest.Browser(t, 1280, 900), 2*time.Minute)
	s.signIn(t, ctx, console.Viewer)
	id := s.uncertain[0]
	for _, page := range []string{"/", "/effects?state=uncertain", fmt.Sprintf("/effects/%d", id)} {
		open(t, ctx, s.url+page)
		if n := count(t, ctx, `form[method="post"]:not([action="/logout"])`); n != 0 {
			t.Errorf("%s shows a viewer %d action forms", page, n)
		}
	}
	csrf, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('form[action="/logout"] input[name="csrf"]').value`))
	if err != nil || csrf == "" {
		t.Fatalf("the page's CSRF token: %q, %v", csrf, err)
	}
	body := forge(t, ctx, fmt.Sprintf("/effects/%d/resolve", id), map[string]string{"csrf": csrf, "as": "confirmed", "note": "viewer tries"})
	if !strings.Contains(strings.ToLower(body), "forbidden") && !strings.Contains(body, "403") && !strings.Contains(body, "viewer") {
		t.Errorf("a viewer's resolve: the page says %q", body)
	}
	if e, _ := s.st.Get(context.Background(), id); e.State != effects.Uncertain {
		t.Fatalf("a viewer's post changed effect %d to %s", id, e.State)
	}
}

// An operator filters the effects down to the uncertain ones, opens one,
// resolves it with a note; the effect's page then shows it confirmed and
// the operator in its history.
func TestBrowser_AnOperatorResolvesAnUncertainEffect(t *testing.T) {
	s := newSite(t)
	ctx := browsertest.Within(t, browsertest.Browser(t, 1280, 900), 2*time.Minute)
	s.signIn(t, ctx, console.Operator)
	open(t, ctx, s.url+"/effects")
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(`form.filter input[name="state"]`, "uncertain"),
		chromedp.Click(`form.filter button`),
	); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the filtered list", `location.search.includes("state=uncertain") && document.readyState === "complete" && document.querySelector("table") !== null`)
	text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if !strings.Contains(text, fmt.Sprintf("%d effects match", len(s.uncertain))) || strings.Contains(text, "charge.create") {
		t.Fatalf("the filtered list:\n%s", text)
	}
	id := s.uncertain[2]
	note := "SendGrid's activity shows it delivered"
	if err := chromedp.Do(ctx,
		chromedp.Click(fmt.Sprintf(`a[href="/effects/%d"]`, id)),
		chromedp.WaitVisible(`form[action$="/resolve"] textarea[name="note"]`),
		chromedp.SendKeys(`form[action$="/resolve"] input[name="ref"]`, "msg_delivered_1"),
		chromedp.SendKeys(`form[action$="/resolve"] textarea[name="note"]`, note),
		chromedp.Click(`form[action$="/resolve"] button`),
	); err != nil {
		t.Fatal(err)
	}
	// The console answers an action with the effect's page (?done=resolve).
	waitFor(t, ctx, "the resolve's answer", `location.search.includes("done=resolve") && document.readyState === "complete"`)
	page, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if !strings.Contains(page, "confirmed") || !strings.Contains(page, operatorActor) || !strings.Contains(page, note) {
		t.Fatalf("the effect's page after the resolve:\n%s", page)
	}
	e, _ := s.st.Get(context.Background(), id)
	h, _ := s.st.History(context.Background(), id)
	if e.State != effects.Confirmed || e.ProviderRef != "msg_delivered_1" || len(h) != 1 || h[0].Actor != operatorActor || h[0].Note != note {
		t.Fatalf("effect %d: %s %s, history %+v", id, e.State, e.ProviderRef, h)
	}
	if strings.Contains(page, "customer@example.com") {
		t.Error("a hidden payload field reached the page")
	}
}

// A POST without the CSRF token, from the operator's own signed-in
// browser (what a hostile page's form would send with the cookie), is
// refused and changes nothing.
func TestBrowser_AForgedPostIsRefused(t *testing.T) {
	s := newSite(t)
	ctx := browsertest.Within(t, browsertest.Browser(t, 1280, 900), 2*time.Minute)
	s.signIn(t, ctx, console.Operator)
	id := s.uncertain[1]
	open(t, ctx, fmt.Sprintf("%s/effects/%d", s.url, id))
	body := forge(t, ctx, fmt.Sprintf("/effects/%d/resolve", id), map[string]string{"as": "confirmed", "note": "forged"})
	if !strings.Contains(strings.ToLower(body), "forbidden") && !strings.Contains(strings.ToLower(body), "csrf") {
		t.Errorf("the forged post: the page says %q", body)
	}
	if e, _ := s.st.Get(context.Background(), id); e.State != effects.Uncertain {
		t.Fatalf("a forged post changed effect %d to %s", id, e.State)
	}
}

// The pages are usable at 1280 px and at 390 px wide: nothing makes the
// page itself scroll sideways (wide tables scroll in their own box), and
// the main controls are on screen. With SIDEFX_SCREENSHOTS=DIR, the pages
// are saved there as PNG (docs/ holds them).
func TestBrowser_PagesFitDesktopAndPhone(t *testing.T) {
	s := newSite(t)
	for _, w := range []struct {
		name          string
		width, height int
	}{{"desktop", 1280, 900}, {"phone", 390, 844}} {
		t.Run(w.name, func(t *testing.T) {
			ctx := browsertest.Within(t, browsertest.Browser(t, w.width, w.height), 2*time.Minute)
			s.signIn(t, ctx, console.Operator)
			for _, p := range []struct{ name, path string }{
				{"overview", "/"}, {"effects", "/effects?state=uncertain"}, {"effect", fmt.Sprintf("/effects/%d", s.uncertain[0])}, {"runs", "/runs"},
			} {
				open(t, ctx, s.url+p.path)
				overflow, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth - window.innerWidth`))
				if err != nil {
					t.Fatal(err)
				}
				if overflow > 0 {
					t.Errorf("%s at %d px: the page is %d px wider than the screen", p.name, w.width, overflow)
				}
				if n := count(t, ctx, `h1`); n != 1 {
					t.Errorf("%s at %d px: %d headings", p.name, w.width, n)
				}
				if dir := os.Getenv("SIDEFX_SCREENSHOTS"); dir != "" {
					png, err := chromedp.Run(ctx, chromedp.FullScreenshot(90))
					if err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("console-%s-%s.png", p.name, w.name)), png, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
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
