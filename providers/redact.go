package providers

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strings"
)

// Redacted is what a Redactor writes in place of a secret.
const Redacted = "[redacted]"

// MinSecretLen is the length, in bytes, below which a value is not searched
// for as a secret. A credential is far longer; a value of a few characters
// (a tenant "t1" in a header, "v=2" in a query) would otherwise be replaced
// wherever it occurs, turning a status 401 into "40[redacted]" and words
// into nonsense.
const MinSecretLen = 6

// Redactor replaces configured secret values with Redacted wherever a peer,
// a library or an error echoes them: in a Result's Ref, Detail and Err, and
// so in the outcome and last_error columns, the logs and anything printed
// from them. It looks for each secret as it is and in the encodings an echo
// carries it in (see NewRedactor). Every provider in this module builds one
// from its secrets and passes each Result through Redactor.Result on the way
// out.
//
// A Redactor is safe for concurrent use. A nil *Redactor redacts nothing.
type Redactor struct {
	needles  []string // longest first
	replacer *strings.Replacer
}

// NewRedactor returns a Redactor for secrets. Each secret is searched for as
// it is, URL-escaped as a query value (url.QueryEscape) and as a path
// segment (url.PathEscape), and escaped as inside a JSON string (with and
// without HTML escaping, and with "/" written "\/" as PHP writes it).
// Secrets shorter than MinSecretLen are ignored.
//
// Derived forms that only the caller knows are secrets of their own: pass
// them too (URLSecrets and HeaderSecrets give those of an endpoint URL and a
// header value; a signing secret's raw key in base64 and hex is the signing
// provider's to add).
func NewRedactor(secrets ...string) *Redactor {
	seen := map[string]bool{}
	var needles []string
	add := func(s string) {
		if len(s) >= MinSecretLen && !seen[s] {
			seen[s] = true
			needles = append(needles, s)
		}
	}
	for _, s := range secrets {
		if len(s) < MinSecretLen {
			continue
		}
		add(s)
		add(url.QueryEscape(s))
		add(url.PathEscape(s))
		for _, j := range jsonForms(s) {
			add(j)
			add(strings.ReplaceAll(j, "/", `\/`))
		}
	}
	// Longest first: strings.Replacer tries its patterns in argument order
	// at each position, so a form that contains another is replaced whole.
	slices.SortFunc(needles, func(a, b string) int {
		if len(a) != len(b) {
			return len(b) - len(a)
		}
		return strings.Compare(a, b)
	})
	r := &Redactor{needles: needles}
	if len(needles) > 0 {
		pairs := make([]string, 0, 2*len(needles))
		for _, n := range needles {
			pairs = append(pairs, n, Redacted)
		}
		r.replacer = strings.NewReplacer(pairs...)
	}
	return r
}

// jsonForms returns s as it appears between the quotes of a JSON string:
// with Go's HTML escaping (\u003c) and without.
func jsonForms(s string) []string {
	html, _ := json.Marshal(s) // a string always encodes
	var plain bytes.Buffer
	enc := json.NewEncoder(&plain)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return []string{
		string(html[1 : len(html)-1]),
		strings.TrimSuffix(strings.TrimSpace(plain.String()), `"`)[1:],
	}
}

// Contains reports whether s holds a secret in any of the forms searched
// for.
func (r *Redactor) Contains(s string) bool {
	if r == nil {
		return false
	}
	for _, n := range r.needles {
		if strings.Contains(s, n) {
			return true
		}
	}
	return false
}

// String returns s with every secret replaced by Redacted.
func (r *Redactor) String(s string) string {
	if r == nil || r.replacer == nil || !r.Contains(s) {
		return s
	}
	return r.replacer.Replace(s)
}

// Bytes returns b with every secret replaced by Redacted; b itself is not
// modified.
func (r *Redactor) Bytes(b []byte) []byte {
	if r == nil || r.replacer == nil || !r.Contains(string(b)) {
		return b
	}
	return []byte(r.replacer.Replace(string(b)))
}

// TrimPartial returns b without its longest ending that is the start of a
// secret (in any form searched for), so a read cut at a limit, which may
// split a secret, holds none of it once redacted: redaction finds whole
// secrets only. b itself is not modified. Call it on a body whose read
// stopped at its limit, before Bytes.
func (r *Redactor) TrimPartial(b []byte) []byte {
	if r == nil {
		return b
	}
	cut := 0
	for _, n := range r.needles {
		for k := min(len(n)-1, len(b)); k > cut; k-- {
			if bytes.HasSuffix(b, []byte(n[:k])) {
				cut = k
				break
			}
		}
	}
	return b[:len(b)-cut]
}

// Error returns err when its message holds no secret, and otherwise an
// error whose message is err's redacted. That error answers errors.Is as
// err does, but does not unwrap to err, and errors.As does not reach err's
// types: their text, and perhaps their fields, hold the secret.
func (r *Redactor) Error(err error) error {
	if err == nil || !r.Contains(err.Error()) {
		return err
	}
	return &redactedError{msg: r.String(err.Error()), err: err}
}

// redactedError is an error whose message had its secrets removed.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }

// Is reports whether the original error matches target.
func (e *redactedError) Is(target error) bool { return errors.Is(e.err, target) }

// JSON returns raw with every secret in its strings, object keys and
// numbers replaced, and still valid JSON: valid JSON in, valid JSON out (an
// object key or number that held a secret becomes a string holding
// Redacted). raw that is not valid JSON is returned as a JSON string of its
// redacted text. raw without a secret is returned as it is.
func (r *Redactor) JSON(raw json.RawMessage) json.RawMessage {
	if r == nil || len(raw) == 0 || !r.Contains(string(raw)) && !bytes.Contains(raw, []byte(`\`)) {
		return raw
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		b, _ := json.Marshal(r.String(string(raw)))
		return b
	}
	v, changed := r.value(v)
	if !changed {
		return raw // a backslash escape, but no secret behind it
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		b, _ := json.Marshal(Redacted)
		return b
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n"))
}

// value redacts a decoded JSON value and reports whether it changed.
func (r *Redactor) value(v any) (any, bool) {
	switch v := v.(type) {
	case string:
		s := r.String(v)
		return s, s != v
	case json.Number:
		if r.Contains(string(v)) {
			return r.String(string(v)), true
		}
		return v, false
	case []any:
		changed := false
		for i, e := range v {
			var c bool
			v[i], c = r.value(e)
			changed = changed || c
		}
		return v, changed
	case map[string]any:
		out := make(map[string]any, len(v))
		changed := false
		for k, e := range v {
			rk := r.String(k)
			re, c := r.value(e)
			out[rk] = re
			changed = changed || c || rk != k
		}
		return out, changed
	}
	return v, false
}

// Result returns res with every secret removed from its Ref, Detail and
// Err: the last guard on a Result's way to the effect's row and the logs.
func (r *Redactor) Result(res Result) Result {
	if r == nil {
		return res
	}
	res.Ref = r.String(res.Ref)
	res.Detail = r.JSON(res.Detail)
	res.Err = r.Error(res.Err)
	return res
}

// URLSecrets returns the secret-bearing parts of an endpoint URL, each a
// secret for NewRedactor: the user information — the user name, the
// password, "user:password" and its standard base64, which is how an HTTP
// client sends it ("Authorization: Basic …") — and every query value, as
// written in the URL and decoded. The scheme, host and path are not
// secrets. A URL that does not parse is a secret whole.
func URLSecrets(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil {
		return []string{raw}
	}
	var out []string
	if u.User != nil {
		name := u.User.Username()
		pass, _ := u.User.Password()
		out = append(out, name, pass, name+":"+pass,
			base64.StdEncoding.EncodeToString([]byte(name+":"+pass)),
			// As written in a URL, which escapes other characters than a
			// query or a path does.
			u.User.String(), url.User(name).String(), strings.TrimPrefix(url.UserPassword("", pass).String(), ":"))
	}
	for _, pair := range strings.FieldsFunc(u.RawQuery, func(r rune) bool { return r == '&' || r == ';' }) {
		_, v, _ := strings.Cut(pair, "=")
		out = append(out, v)
		if d, err := url.QueryUnescape(v); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// HeaderSecrets returns the secret forms of a request header's value, each
// a secret for NewRedactor: the value itself; for a value of the form
// "<scheme> <credentials>" ("Bearer abc…"), the credentials alone; and for
// Basic credentials, the decoded "user:password" and the password.
func HeaderSecrets(value string) []string {
	out := []string{value}
	scheme, cred, ok := strings.Cut(strings.TrimSpace(value), " ")
	if !ok {
		return out
	}
	cred = strings.TrimSpace(cred)
	out = append(out, cred)
	if strings.EqualFold(scheme, "Basic") {
		if dec, err := base64.StdEncoding.DecodeString(cred); err == nil {
			_, pass, _ := strings.Cut(string(dec), ":")
			out = append(out, string(dec), pass)
		}
	}
	return out
}

// RedactURL shows a URL's scheme, host and path, never its user
// information, query or fragment, which may hold a credential or a token: a
// query is shown as "?[redacted]". A URL that does not parse, or has no
// host, is shown as "(invalid URL)".
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(invalid URL)"
	}
	shown := u.Scheme + "://" + u.Host + u.EscapedPath()
	if u.RawQuery != "" {
		shown += "?" + Redacted
	}
	return shown
}
