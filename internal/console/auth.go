package console

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"
)

// Role is what a user of the console may do. Each role may do what the
// ones below it may.
type Role int

// The roles.
const (
	// Viewer reads every page and acts on nothing.
	Viewer Role = iota + 1
	// Operator also performs the operators' actions: on one effect, in
	// bulk within ops.DefaultMax, and pauses and resumes kinds.
	Operator
	// Admin also raises the bulk cap and pauses and resumes providers.
	Admin
)

var roleNames = map[Role]string{Viewer: "viewer", Operator: "operator", Admin: "admin"}

func (r Role) String() string {
	if s, ok := roleNames[r]; ok {
		return s
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// ParseRole reads a role's name: viewer, operator or admin.
func ParseRole(s string) (Role, error) {
	for r, name := range roleNames {
		if strings.EqualFold(strings.TrimSpace(s), name) {
			return r, nil
		}
	}
	return 0, fmt.Errorf("%q is not a role (want viewer, operator or admin)", s)
}

// Token is one line of the tokens file: the SHA-256 of a token, never the
// token itself, its role and the actor its actions are recorded under.
type Token struct {
	Hash  [sha256.Size]byte
	Role  Role
	Actor string
}

// ParseTokens reads the lines of a tokens file: "<sha256 hex of the token>
// <role> <actor name>", the actor name running to the end of the line;
// blank lines and those starting with '#' are skipped. An error names the
// line by its number only: a line may hold something that was not meant
// for a log.
func ParseTokens(text string) ([]Token, error) {
	var out []Token
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	seen := map[[sha256.Size]byte]bool{}
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 3 {
			return nil, fmt.Errorf("tokens line %d: want \"<sha256 hex of the token> <role> <actor name>\"", n)
		}
		var t Token
		h, err := hex.DecodeString(fields[0])
		if err != nil || len(h) != sha256.Size {
			return nil, fmt.Errorf("tokens line %d: the first field is not a SHA-256 in hexadecimal (64 digits: printf %%s \"$TOKEN\" | sha256sum)", n)
		}
		copy(t.Hash[:], h)
		if t.Role, err = ParseRole(fields[1]); err != nil {
			return nil, fmt.Errorf("tokens line %d: the role is not viewer, operator or admin", n)
		}
		t.Actor = strings.Join(fields[2:], " ")
		if len(t.Actor) > 255 {
			return nil, fmt.Errorf("tokens line %d: the actor name is longer than 255 bytes", n)
		}
		if seen[t.Hash] {
			return nil, fmt.Errorf("tokens line %d: the same token is on an earlier line", n)
		}
		seen[t.Hash] = true
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	return out, nil
}

// Auth says how the console authenticates its users.
type Auth struct {
	// Tokens sign in (POST /login) and authenticate scripts
	// (Authorization: Bearer).
	Tokens []Token
	// TrustedProxies are the peers whose IdentityHeader and RoleHeader are
	// believed; from any other peer the headers are ignored. Failed
	// sign-ins through them count for the rightmost X-Forwarded-For
	// address that is not one of them.
	TrustedProxies []netip.Prefix
	// IdentityHeader names the user (the actor), RoleHeader the role
	// (empty or absent: viewer).
	IdentityHeader, RoleHeader string
	// SecureCookie marks the session cookie Secure although the request
	// came over plain HTTP (TLS ends at a proxy in front).
	SecureCookie bool
}

// sessionTTL is how long a session lasts after signing in.
const sessionTTL = 12 * time.Hour

// Cookie names.
const (
	sessionCookie = "sidefx_console"
	loginCookie   = "sidefx_console_login"
)

// How a request was authenticated.
const (
	viaSession = "session"
	viaToken   = "token"
	viaProxy   = "proxy"
)

// identity is the user a request acts for.
type identity struct {
	Actor string
	Role  Role
	Via   string
	csrf  string // the CSRF token of the user's forms
}

// Session reports whether the user signed in with a cookie (and so may
// sign out).
func (i *identity) Session() bool { return i.Via == viaSession }

// Can reports whether the user has role r or one above it.
func (i *identity) Can(r Role) bool { return i != nil && i.Role >= r }

// session is what the session cookie holds, signed.
type session struct {
	Actor  string `json:"a"`
	Role   Role   `json:"r"`
	Expiry int64  `json:"e"` // unix seconds
	Nonce  string `json:"n"`
}

// keys holds the secret the sessions and CSRF tokens are signed with,
// made at start (a restart signs everyone out), and the sessions ended
// by signing out before their expiry.
type keys struct {
	key []byte

	mu      sync.Mutex
	revoked map[string]time.Time // nonce → expiry
}

func newKeys() (*keys, error) {
	k := &keys{key: make([]byte, 32), revoked: map[string]time.Time{}}
	if _, err := rand.Read(k.key); err != nil {
		return nil, fmt.Errorf("console: session key: %w", err)
	}
	return k, nil
}

func (k *keys) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, k.key)
	for _, p := range parts {
		// Length-prefixed: no two lists of parts sign alike.
		fmt.Fprintf(m, "%d:%s;", len(p), p)
	}
	return m.Sum(nil)
}

func (k *keys) macString(parts ...string) string {
	return base64.RawURLEncoding.EncodeToString(k.mac(parts...))
}

func randomString() (string, error) {
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// sign returns the cookie value of s.
func (k *keys) sign(s session) (string, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return "", err
	}
	payload := base64.RawURLEncoding.EncodeToString(b)
	return payload + "." + k.macString("session", payload), nil
}

// verify reads a cookie value, refusing one not signed with the key,
// expired or revoked.
func (k *keys) verify(value string, now time.Time) (session, bool) {
	payload, sig, ok := strings.Cut(value, ".")
	if !ok {
		return session{}, false
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, k.mac("session", payload)) {
		return session{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return session{}, false
	}
	var s session
	if err := json.Unmarshal(b, &s); err != nil || s.Actor == "" || roleNames[s.Role] == "" {
		return session{}, false
	}
	if !now.Before(time.Unix(s.Expiry, 0)) {
		return session{}, false
	}
	k.mu.Lock()
	_, revoked := k.revoked[s.Nonce]
	k.mu.Unlock()
	return s, !revoked
}

// revoke ends s before its expiry.
func (k *keys) revoke(s session, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for n, exp := range k.revoked {
		if now.After(exp) {
			delete(k.revoked, n)
		}
	}
	k.revoked[s.Nonce] = time.Unix(s.Expiry, 0)
}

// errBadToken: an Authorization header with a token no line names.
var errBadToken = errors.New("the token is not recognised")

// errBadRole: a trusted proxy named a role that is not one.
var errBadRole = errors.New("the proxy's role header names no role")

// lookupToken finds the line of token, comparing every line's hash in
// constant time.
func (a *Auth) lookupToken(token string) (Token, bool) {
	sum := sha256.Sum256([]byte(token))
	var found Token
	ok := 0
	for _, t := range a.Tokens {
		if subtle.ConstantTimeCompare(sum[:], t.Hash[:]) == 1 {
			found, ok = t, 1
		}
	}
	return found, ok == 1
}

// trusted reports whether the request's peer is one of the trusted
// proxies.
func (a *Auth) trusted(r *http.Request) bool {
	if len(a.TrustedProxies) == 0 {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	return a.trustedAddr(addr)
}

// trustedAddr reports whether addr is in one of the trusted proxies'
// CIDRs.
func (a *Auth) trustedAddr(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range a.TrustedProxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// identify returns the user r acts for: named by a trusted proxy's
// headers, by a bearer token, or by a session cookie, in that order. It
// returns nil (and no error) for a request with none of them, and an
// error for a bearer token no line names or a proxy's role that is none.
func (h *Handler) identify(r *http.Request) (*identity, error) {
	a := &h.cfg.Auth
	if a.IdentityHeader != "" && a.trusted(r) {
		if user := strings.TrimSpace(r.Header.Get(a.IdentityHeader)); user != "" {
			role := Viewer
			if a.RoleHeader != "" {
				if v := r.Header.Get(a.RoleHeader); strings.TrimSpace(v) != "" {
					var err error
					if role, err = ParseRole(v); err != nil {
						return nil, errBadRole
					}
				}
			}
			return &identity{Actor: user, Role: role, Via: viaProxy, csrf: h.keys.macString("csrf", "proxy", user, role.String())}, nil
		}
	}
	if auth := r.Header.Get("Authorization"); auth != "" {
		scheme, token, _ := strings.Cut(auth, " ")
		if !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
			return nil, errBadToken
		}
		t, ok := a.lookupToken(strings.TrimSpace(token))
		if !ok {
			return nil, errBadToken
		}
		return &identity{Actor: t.Actor, Role: t.Role, Via: viaToken, csrf: h.keys.macString("csrf", "token", hex.EncodeToString(t.Hash[:]))}, nil
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		if s, ok := h.keys.verify(c.Value, h.now()); ok {
			return &identity{Actor: s.Actor, Role: s.Role, Via: viaSession, csrf: h.keys.macString("csrf", "session", c.Value)}, nil
		}
	}
	return nil, nil
}

// checkCSRF compares the form's CSRF token with the user's, in constant
// time.
func checkCSRF(r *http.Request, want string) bool {
	got := r.PostFormValue("csrf")
	return got != "" && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// sameOrigin refuses a request whose Origin header, when present, is not
// the console's own host, and one a browser says comes from another site.
// The console's host is the request's Host, or the X-Forwarded-Host a
// trusted proxy sets (a proxy that rewrites Host).
func (h *Handler) sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	if o == "null" && r.Header.Get("Sec-Fetch-Site") == "same-origin" {
		// A browser hides the origin of a request whose referrer policy
		// says no-referrer, and says itself (Sec-Fetch-Site, which pages
		// cannot set) that it is the console's own.
		return true
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" {
		return false // "null", among others
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	fwd := strings.TrimSpace(strings.Split(r.Header.Get("X-Forwarded-Host"), ",")[0])
	return fwd != "" && h.cfg.Auth.trusted(r) && strings.EqualFold(u.Host, fwd)
}

// secure reports whether the cookies of r's answer are marked Secure.
func (h *Handler) secure(r *http.Request) bool { return r.TLS != nil || h.cfg.Auth.SecureCookie }

func (h *Handler) setCookie(w http.ResponseWriter, r *http.Request, name, value, path string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: path, MaxAge: maxAge, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: h.secure(r)})
}

// loginCSRF returns the CSRF token of the sign-in form, bound to a random
// value in a cookie of its own (there is no session yet), setting the
// cookie if the request has none.
func (h *Handler) loginCSRF(w http.ResponseWriter, r *http.Request) (string, error) {
	c, err := r.Cookie(loginCookie)
	if err == nil && c.Value != "" {
		return h.keys.macString("csrf", "login", c.Value), nil
	}
	v, err := randomString()
	if err != nil {
		return "", err
	}
	h.setCookie(w, r, loginCookie, v, "/login", 3600)
	return h.keys.macString("csrf", "login", v), nil
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	csrf, err := h.loginCSRF(w, r)
	if err != nil {
		h.fail(w, r, nil, err)
		return
	}
	h.render(w, r, http.StatusOK, "login", &page{Title: "Sign in", CSRF: csrf, D: loginData{Next: safeNext(r.URL.Query().Get("next")), Tokens: len(h.cfg.Auth.Tokens) > 0}})
}

type loginData struct {
	Next   string
	Tokens bool // tokens can sign in
}

// safeNext is where to go after signing in: a clean absolute path of the
// console, never another site; anything else is "/".
//
// A browser strips tabs and newlines from a URL and reads a backslash as a
// slash, so "/\t/evil.example" or "/\evil.example" would take the user to
// another host: next is refused when it, or its percent-decoded form,
// holds a control character or a backslash; when it has a scheme or a
// host; when it does not start with exactly one "/"; when its decoded
// path holds "//" ("/%2F%2Fevil.example": some proxies decode it);
// and when it leads back to /login.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		return "/"
	}
	decoded, err := url.PathUnescape(next)
	if err != nil || unsafeByte(next) || unsafeByte(decoded) {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return "/"
	}
	if !strings.HasPrefix(u.Path, "/") || strings.Contains(u.Path, "//") {
		return "/"
	}
	if clean := path.Clean(u.Path); clean == "/login" || strings.HasPrefix(clean, "/login/") {
		return "/"
	}
	return next
}

// unsafeByte reports whether s holds a control character (below 0x20, or
// 0x7f) or a backslash.
func unsafeByte(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < 0x20 || b == 0x7f || b == '\\' {
			return true
		}
	}
	return false
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if !h.sameOrigin(r) {
		h.refuse(w, r, nil, http.StatusForbidden, "this form was sent from another site")
		return
	}
	c, err := r.Cookie(loginCookie)
	if err != nil || !checkCSRF(r, h.keys.macString("csrf", "login", c.Value)) {
		h.refuse(w, r, nil, http.StatusForbidden, "the form has expired or was not sent by this console: load the sign-in page again")
		return
	}
	if h.throttled(w, r) {
		return
	}
	t, ok := h.cfg.Auth.lookupToken(strings.TrimSpace(r.PostFormValue("token")))
	if !ok {
		h.fails.failed(h.clientAddr(r))
		h.log.Warn("console: sign-in refused: unknown token", "remote", r.RemoteAddr)
		csrf, _ := h.loginCSRF(w, r)
		h.render(w, r, http.StatusUnauthorized, "login", &page{Title: "Sign in", CSRF: csrf, Error: "That token is not recognised.",
			D: loginData{Next: safeNext(r.PostFormValue("next")), Tokens: len(h.cfg.Auth.Tokens) > 0}})
		return
	}
	nonce, err := randomString()
	if err != nil {
		h.fail(w, r, nil, err)
		return
	}
	v, err := h.keys.sign(session{Actor: t.Actor, Role: t.Role, Expiry: h.now().Add(sessionTTL).Unix(), Nonce: nonce})
	if err != nil {
		h.fail(w, r, nil, err)
		return
	}
	h.setCookie(w, r, sessionCookie, v, "/", int(sessionTTL.Seconds()))
	h.setCookie(w, r, loginCookie, "", "/login", -1)
	h.log.Info("console: signed in", "actor", t.Actor, "role", t.Role.String(), "remote", r.RemoteAddr)
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request, id *identity) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		if s, ok := h.keys.verify(c.Value, h.now()); ok {
			h.keys.revoke(s, h.now())
		}
	}
	h.setCookie(w, r, sessionCookie, "", "/", -1)
	h.log.Info("console: signed out", "actor", id.Actor)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
