package console_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/internal/console"
)

// guesser sends sign-ins to a console behind the trusted proxy 10.1.0.0/16,
// each as the client the proxy names in X-Forwarded-For.
type guesser struct {
	t *testing.T
	e *env
}

func (g guesser) serve(r *http.Request, client string) *httptest.ResponseRecorder {
	r.RemoteAddr = "10.1.2.3:5555"
	r.Header.Set("X-Forwarded-For", client)
	w := httptest.NewRecorder()
	g.e.h.ServeHTTP(w, r)
	return w
}

// signIn sends the sign-in form with token from client, and returns the
// answer's status and its Retry-After.
func (g guesser) signIn(client, token string) (int, string) {
	g.t.Helper()
	w := g.serve(httptest.NewRequest(http.MethodGet, "/login", nil), client)
	if w.Code != http.StatusOK {
		g.t.Fatalf("the sign-in page for %s: %d", client, w.Code)
	}
	form := url.Values{"csrf": {csrf(g.t, w.Body.String())}, "token": {token}}
	r := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, c := range w.Result().Cookies() {
		r.AddCookie(c)
	}
	a := g.serve(r, client)
	return a.Code, a.Header().Get("Retry-After")
}

func newGuesser(t *testing.T, now func() time.Time) guesser {
	e := newEnv(t, func(c *console.Config) {
		c.Auth.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
		c.Now = now
	})
	return guesser{t: t, e: e}
}

// A client writing a new IPv6 address from its /64 on every guess is one
// client: 300 guesses, each from another address of 2001:db8:7:9::/64, are
// throttled after the tenth; another /64 is not locked out, and an IPv4
// client is counted by its own address.
func TestConsole_SignInThrottleHoldsAgainstAddressRotation(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	g := newGuesser(t, func() time.Time { return now })
	refused, throttled := 0, 0
	for i := range 300 {
		client := fmt.Sprintf("2001:db8:7:9:%x:%x:%x:%x", i>>12, i&0xfff, i*7, i*13)
		switch code, retry := g.signIn(client, fmt.Sprintf("sfxc_guess_%d", i)); {
		case code == http.StatusUnauthorized:
			refused++
		case code == http.StatusTooManyRequests && retry != "":
			throttled++
		default:
			t.Fatalf("guess %d from %s: %d (Retry-After %q)", i+1, client, code, retry)
		}
	}
	if refused != 10 || throttled != 290 {
		t.Fatalf("300 guesses from one /64: %d checked and refused (401), %d throttled (429); want 10 and 290", refused, throttled)
	}
	// The right token from that /64 waits too; from the next /64, and
	// from an IPv4 address, it signs in.
	if code, _ := g.signIn("2001:db8:7:9::1", g.e.tokens[console.Operator]); code != http.StatusTooManyRequests {
		t.Errorf("the right token from the throttled /64: %d, want 429", code)
	}
	if code, _ := g.signIn("2001:db8:7:a::1", g.e.tokens[console.Operator]); code != http.StatusSeeOther {
		t.Errorf("the right token from the next /64: %d, want 303", code)
	}
	// An IPv4-mapped address of a throttled IPv4 client is that client.
	for i := range 10 {
		if code, _ := g.signIn("198.51.100.7", fmt.Sprintf("sfxc_v4_%d", i)); code != http.StatusUnauthorized {
			t.Fatalf("IPv4 guess %d: %d, want 401", i+1, code)
		}
	}
	if code, _ := g.signIn("::ffff:198.51.100.7", g.e.tokens[console.Operator]); code != http.StatusTooManyRequests {
		t.Errorf("the throttled IPv4 client written as IPv4-mapped IPv6: %d, want 429", code)
	}
	if code, _ := g.signIn("198.51.100.8", g.e.tokens[console.Operator]); code != http.StatusSeeOther {
		t.Errorf("the IPv4 address next to the throttled one: %d, want 303", code)
	}
}

// Past 100 failed sign-ins in a minute over all clients (here 10 from
// each of 10 IPv4 addresses), a client that has not failed is not locked
// out: a valid bearer token, and the sign-in form, from another address
// are accepted. A block that failed in the minute waits with 429 and
// Retry-After; a fresh block may guess once, and is then locked until the
// minute has passed.
func TestConsole_SignInGlobalCeilingLocksOnlyWhoFailed(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	g := newGuesser(t, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	for i := range 100 {
		client := fmt.Sprintf("203.0.113.%d", i/10+1)
		if code, _ := g.signIn(client, fmt.Sprintf("sfxc_guess_%d", i)); code != http.StatusUnauthorized {
			t.Fatalf("guess %d from %s: %d, want 401 (no client is past its 10)", i+1, client, code)
		}
	}
	bearer := func(client, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/effects", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		return g.serve(r, client)
	}
	if w := bearer("192.0.2.45", g.e.tokens[console.Viewer]); w.Code != http.StatusOK {
		t.Fatalf("a valid bearer token from a client that has not failed, past the ceiling: %d, want 200\n%s", w.Code, w.Body.String())
	}
	if code, _ := g.signIn("192.0.2.44", g.e.tokens[console.Operator]); code != http.StatusSeeOther {
		t.Fatalf("the right token in the form from a client that has not failed, past the ceiling: %d, want 303", code)
	}
	// A guesser's own address waits, the right token included.
	if code, retry := g.signIn("203.0.113.1", g.e.tokens[console.Operator]); code != http.StatusTooManyRequests || retry == "" {
		t.Fatalf("the right token from an address that failed: %d (Retry-After %q), want 429 with Retry-After", code, retry)
	}
	// A fresh block: one guess, then locked, its right token too.
	if w := bearer("2001:db8:5:6::1", "sfxc_wrong"); w.Code != http.StatusUnauthorized {
		t.Fatalf("a wrong bearer token from a fresh block past the ceiling: %d, want 401", w.Code)
	}
	for _, token := range []string{"sfxc_wrong_again", g.e.tokens[console.Viewer]} {
		w := bearer("2001:db8:5:6::2", token)
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "too many failed sign-ins on this console") {
			t.Fatalf("a bearer token from the block that failed once past the ceiling: %d (Retry-After %q), want 429\n%s", w.Code, w.Header().Get("Retry-After"), w.Body.String())
		}
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	if w := bearer("2001:db8:5:6::2", g.e.tokens[console.Viewer]); w.Code != http.StatusOK {
		t.Fatalf("the right bearer token once the minute passed: %d, want 200", w.Code)
	}
}
