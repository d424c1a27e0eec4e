// Package console is sidefx's web console: the effects, the drift and
// reconciliation runs and the pauses as server-rendered pages, and the
// operators' actions as forms, each through admin (the one
// operations API the CLI uses too) and recorded with the user who acted.
//
// Every request is authenticated: by a trusted proxy's headers (only from
// a peer in a trusted CIDR), by a bearer token, or by the session cookie
// signing in with a token sets. Tokens are known by their SHA-256 only.
// After signing in the console goes back only to a clean path of its own,
// never to another site.
// Every POST carries a CSRF token bound to the user's session and is
// refused when its Origin is another host. No provider secret reaches the
// console, and the payload fields the configuration hides never reach a
// page or a log, and no supersede from the console changes them.
package console

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/httpbound"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/console.css
var staticFS embed.FS

// Provider is a kind's provider, for pausing it and for links to its
// dashboard.
type Provider struct {
	Name string
	// Link returns the page of the provider's dashboard that shows an
	// effect's reference, or "" (nil: none): the provider's
	// providers.DashboardLinker.
	Link func(ref string) string
}

// Config is what a console Handler works with.
type Config struct {
	// Store and Ops are the effects and the operations on them.
	Store *engine.Store
	Ops   *admin.Admin
	// DB and Schema hold the drift and reconciliation tables (the pool
	// of the Store).
	DB     engine.DB
	Schema string
	// Providers are the kinds' providers, by kind (the configuration's).
	Providers map[string]Provider
	// HiddenFields are payload fields shown as "(hidden)": top-level names
	// or dotted paths through objects and arrays.
	HiddenFields []string
	Auth         Auth
	// Now is the clock of sessions and of filters' "2h ago" (nil:
	// time.Now).
	Now func() time.Time
	// Log receives sign-ins, actions and errors (nil: discarded). Never a
	// token, a payload or a note.
	Log *slog.Logger
	// Warning, if not "", is shown at the top of every page (the daemon
	// sets it when the console listens beyond loopback over plain HTTP
	// with no proxy in front).
	Warning string
}

// The console's bodies: a form (a note, a merge patch) is at most MaxBody
// bytes, refused before a byte is read when it declares more; the bodies
// being read at once hold at most BodyBudget bytes, a client (its address
// block, as the sign-in throttle counts it) a quarter of that, reserved as
// their bytes arrive; a body past either gets 503 with Retry-After
// (httpbound.Budget).
const (
	MaxBody    = 1 << 20
	BodyBudget = 8 << 20
)

// Handler serves the console.
type Handler struct {
	cfg   Config
	keys  *keys
	hider hider
	pages map[string]*template.Template
	mux   *http.ServeMux
	serve http.Handler // mux, its bodies bounded
	log   *slog.Logger
	fails *throttle // failed sign-ins, by client address
	// results keeps bulk actions' outcomes for the page the POST
	// redirects to.
	results *results
}

// New returns the console's handler. The key that signs sessions is made
// here: sessions end with the process.
func New(cfg Config) (*Handler, error) {
	if cfg.Store == nil || cfg.Ops == nil || cfg.DB == nil {
		return nil, errors.New("console: Store, Ops and DB are required")
	}
	if cfg.Schema == "" {
		cfg.Schema = cfg.Store.Schema()
	}
	k, err := newKeys()
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, keys: k, hider: newHider(cfg.HiddenFields), log: cfg.Log, pages: map[string]*template.Template{}}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.fails = newThrottle(h.now)
	h.results = &results{now: h.now}
	for _, name := range []string{"login", "overview", "effects", "effect", "bulk", "done", "runs", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		h.pages[name] = t
	}
	static, _ := fs.Sub(staticFS, "static")
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /login", h.loginPage)
	mux.HandleFunc("POST /login", h.login)
	mux.HandleFunc("POST /logout", h.post(Viewer, h.logout))
	mux.HandleFunc("GET /{$}", h.get(h.overview))
	mux.HandleFunc("GET /effects", h.get(h.effectsPage))
	mux.HandleFunc("GET /effects/{id}", h.get(h.effectPage))
	mux.HandleFunc("POST /effects/{id}/{action}", h.post(Operator, h.act))
	mux.HandleFunc("POST /pause", h.post(Operator, h.pause))
	mux.HandleFunc("GET /bulk", h.get(h.bulkPreview))
	mux.HandleFunc("POST /bulk", h.post(Operator, h.bulk))
	mux.HandleFunc("GET /bulk/done/{id}", h.get(h.bulkDone))
	mux.HandleFunc("GET /runs", h.get(h.runs))
	h.mux = mux
	h.serve = httpbound.NewBudget(httpbound.BudgetConfig{Total: BodyBudget,
		Client: func(r *http.Request) string { return httpbound.Block(h.clientAddr(r)) }}).Limit(MaxBody, "a form", mux)
	return h, nil
}

func (h *Handler) now() time.Time {
	if h.cfg.Now != nil {
		return h.cfg.Now()
	}
	return time.Now()
}

// csp allows the console's own stylesheet and nothing else: no script,
// no frame, no form sent elsewhere.
const csp = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// ServeHTTP serves the console, with its security headers on every
// answer.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", csp)
	hd.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: with no-referrer a browser sends
	// "Origin: null" on the console's own form posts, which the origin
	// check must then refuse or trust blindly. Other sites get no referrer.
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Cache-Control", "no-store")
	h.serve.ServeHTTP(w, r)
}

// get wraps a page: the user must be known (else, to the sign-in page).
func (h *Handler) get(fn func(http.ResponseWriter, *http.Request, *identity)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" && h.throttled(w, r) {
			return
		}
		id, err := h.identify(r)
		switch {
		case err != nil:
			h.fails.failed(h.clientAddr(r))
			h.refuse(w, r, nil, http.StatusUnauthorized, err.Error())
		case id == nil:
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		default:
			fn(w, r, id)
		}
	}
}

// post wraps an action: from this console's own pages (Origin), by a
// known user, with the user's CSRF token, and with at least role min.
// Anything else is refused before the action is looked at.
func (h *Handler) post(min Role, fn func(http.ResponseWriter, *http.Request, *identity)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.sameOrigin(r) {
			h.log.Warn("console: POST from another origin refused", "path", r.URL.Path, "origin", r.Header.Get("Origin"), "remote", r.RemoteAddr)
			h.refuse(w, r, nil, http.StatusForbidden, "this form was sent from another site")
			return
		}
		if r.Header.Get("Authorization") != "" && h.throttled(w, r) {
			return
		}
		id, err := h.identify(r)
		switch {
		case err != nil:
			h.fails.failed(h.clientAddr(r))
			h.refuse(w, r, nil, http.StatusUnauthorized, err.Error())
			return
		case id == nil:
			h.refuse(w, r, nil, http.StatusUnauthorized, "sign in first")
			return
		}
		if !checkCSRF(r, id.csrf) {
			h.log.Warn("console: POST without a valid CSRF token refused", "path", r.URL.Path, "actor", id.Actor, "remote", r.RemoteAddr)
			h.refuse(w, r, id, http.StatusForbidden, "the form has expired or was not sent by this console: load the page again")
			return
		}
		if !id.Can(min) {
			h.log.Warn("console: action refused to role", "path", r.URL.Path, "actor", id.Actor, "role", id.Role.String())
			h.refuse(w, r, id, http.StatusForbidden, fmt.Sprintf("a %s cannot do this (it needs %s)", id.Role, min))
			return
		}
		fn(w, r, id)
	}
}

// page is what every template gets.
type page struct {
	Title        string
	Who          *identity
	CSRF         string
	Flash, Error string
	Warning      string // the console's own (Config.Warning)
	D            any
}

// Act reports whether the user may act (operator or admin).
func (p *page) Act() bool { return p.Who.Can(Operator) }

// Admin reports whether the user is an admin.
func (p *page) Admin() bool { return p.Who.Can(Admin) }

func (h *Handler) newPage(title string, id *identity) *page {
	p := &page{Title: title, Who: id}
	if id != nil {
		p.CSRF = id.csrf
	}
	return p
}

// render executes a page's template, then writes it (an error writes
// nothing but the 500).
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, p *page) {
	p.Warning = h.cfg.Warning
	var b bytes.Buffer
	if err := h.pages[name].Execute(&b, p); err != nil {
		h.log.Error("console: rendering a page failed", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// refuse answers status with an error page saying why.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, id *identity, status int, why string) {
	p := h.newPage(http.StatusText(status), id)
	p.Error = why
	h.render(w, r, status, "error", p)
}

// fail answers an error: a refusal of the effects' rules says why with
// its status; anything else is logged and answered 500 without detail.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, id *identity, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, effects.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, admin.ErrOverCap), errors.Is(err, effects.ErrWrongState), errors.Is(err, effects.ErrMaybePerformed),
		errors.Is(err, effects.ErrPastKeyWindow), errors.Is(err, effects.ErrNotPaused), errors.Is(err, effects.ErrChanged):
		status = http.StatusConflict
	case errors.Is(err, effects.ErrInvalid), errors.Is(err, admin.ErrUnknownName):
		status = http.StatusBadRequest
	case errors.As(err, new(*hiddenChange)):
		status = http.StatusForbidden
	}
	if status == http.StatusInternalServerError {
		h.log.Error("console: request failed", "path", r.URL.Path, "err", err)
		h.refuse(w, r, id, status, "internal error: see the daemon's log")
		return
	}
	h.refuse(w, r, id, status, err.Error())
}

// badRequest answers 400 with why.
func (h *Handler) badRequest(w http.ResponseWriter, r *http.Request, id *identity, why string) {
	h.refuse(w, r, id, http.StatusBadRequest, why)
}

var funcs = template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"dur": func(d time.Duration) string {
		switch {
		case d <= 0:
			return "-"
		case d < time.Second:
			return "under 1s"
		}
		return d.Round(time.Second).String()
	},
	"clip": func(s string, n int) string {
		r := []rune(strings.ReplaceAll(s, "\n", " "))
		if len(r) <= n {
			return string(r)
		}
		return string(r[:n-1]) + "…"
	},
	"dash": func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	},
	"states": func() []effects.State { return effects.States },
	"counts": counts,
	"join":   strings.Join,
	"query": func(v url.Values) string {
		if len(v) == 0 {
			return ""
		}
		return "?" + v.Encode()
	},
}
