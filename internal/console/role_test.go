package console_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/console"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// The console acts with the daemon's database role. With the least
// privileges of deploy/postgres/daemon-role.sql its pages and every action
// work, pausing and superseding too, through the operators' functions, each
// recorded with the console user as its actor.
func TestConsole_WithTheDaemonsLeastPrivileges(t *testing.T) {
	t.Parallel()
	owner, daemon, _ := pgtest.DaemonRole(t)
	e := &env{t: t, pool: owner, tokens: map[console.Role]string{console.Admin: randomToken(t)}}
	var err error
	if e.store, err = engine.NewStore(owner, nil); err != nil {
		t.Fatal(err)
	}
	if e.eng, err = engine.New(owner, ""); err != nil {
		t.Fatal(err)
	}
	ds, err := engine.NewStore(daemon, nil)
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := console.ParseTokens(tokenLine(e.tokens[console.Admin], console.Admin, "admin on call"))
	if err != nil {
		t.Fatal(err)
	}
	if e.h, err = console.New(console.Config{Store: ds, Ops: mustAdmin(t, ds), DB: daemon, Auth: console.Auth{Tokens: tokens}}); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.h)
	t.Cleanup(e.srv.Close)
	e.enqueue("email.receipt", `{"n":1}`, "a", "b", "c", "d")
	unsure := e.operate("email.receipt", 1, effects.Uncertain, "timeout")
	failed := e.operate("email.receipt", 2, effects.Failed, "rejected")
	c := e.login(console.Admin)
	for _, p := range []string{"/", "/effects", fmt.Sprintf("/effects/%d", unsure[0]), "/runs", "/bulk?action=retry"} {
		if a := c.get(p); a.status != http.StatusOK {
			t.Errorf("GET %s as the daemon's role: %d", p, a.status)
		}
	}
	token := csrf(t, c.page("/"))
	act := func(path string, form url.Values) int {
		form.Set("csrf", token)
		form.Set("note", "least privileges")
		return c.post(path, form).status
	}
	supersede := func() int {
		path := fmt.Sprintf("/effects/%d/supersede", failed[0])
		form := hiddenInputs(t, c.page(fmt.Sprintf("/effects/%d", failed[0])), path)
		form.Set("payload", `{"n":2}`)
		return act(path, form)
	}
	pause := func() int {
		return act("/pause", url.Values{"scope": {"kind"}, "name": {"email.receipt"}, "op": {"pause"}})
	}
	if s := act(fmt.Sprintf("/effects/%d/resolve", unsure[0]), url.Values{"as": {"failed"}, "attempt": {"1"}}); s != http.StatusSeeOther {
		t.Errorf("resolve as the daemon's role: %d", s)
	}
	if s := act(fmt.Sprintf("/effects/%d/retry", failed[1]), url.Values{"attempt": {"1"}}); s != http.StatusSeeOther {
		t.Errorf("retry as the daemon's role: %d", s)
	}
	// Supersede and pause run through the operators' functions (schema
	// 34), which the daemon's role may execute: no grant more.
	if s := supersede(); s != http.StatusSeeOther {
		t.Errorf("supersede as the daemon's role: %d", s)
	}
	if s := pause(); s != http.StatusSeeOther {
		t.Errorf("pause as the daemon's role: %d", s)
	}
	if h, err := e.store.History(t.Context(), failed[0]); err != nil || len(h) != 1 || h[0].Action != "supersede" || h[0].Actor != "admin on call" {
		t.Errorf("the supersede's history: %+v, %v", h, err)
	}
	if body := c.page("/"); !strings.Contains(body, "<strong>email.receipt</strong>") {
		t.Errorf("the pause is not shown")
	}
}
