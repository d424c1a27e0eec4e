package ptype

import (
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The checks the built-in types share, for settings that name
// environment variables, addresses and headers.

var envNameRE = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)

// IsEnvName reports whether s is a conventional environment variable name:
// upper case letters, digits and _, not starting with a digit.
func IsEnvName(s string) bool { return envNameRE.MatchString(s) }

// IsToken reports whether s is an HTTP token: a header name or a method.
func IsToken(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool { return !isTokenChar(r) })
}

func isTokenChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

// SecretEnv checks field, which names the environment variable holding a
// secret that a provider of type typ requires: set, and a variable name
// (example is one).
func (p *Problems) SecretEnv(field, value, typ, example string) {
	switch {
	case value == "":
		p.Add(field, "required for %s providers: the name of the environment variable holding the secret", typ)
	case !IsEnvName(value):
		p.Add(field, "%q is not an environment variable name (want e.g. %s)", value, example)
	}
}

// BaseURLProblem says what is wrong with raw as an API's address (an
// http(s) URL without credentials, query or fragment), or "". It does not
// quote the URL, which may hold a credential.
func BaseURLProblem(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "not a URL"
	case u.Scheme != "http" && u.Scheme != "https":
		return "scheme " + strconv.Quote(u.Scheme) + " is not http or https"
	case u.Host == "":
		return "no host"
	case u.User != nil:
		return "holds user information: the API key goes in api_key_env"
	case u.RawQuery != "" || u.Fragment != "":
		return "holds a query or fragment: want scheme://host[:port][/path]"
	}
	return ""
}

// BaseURL checks field, an API's address (BaseURLProblem).
func (p *Problems) BaseURL(field, raw string) {
	if msg := BaseURLProblem(raw); msg != "" {
		p.Add(field, "%s", msg)
	}
}

// URL checks field, the endpoint a provider of type typ requires: an
// http(s) URL with a host. Its problems do not quote the URL, which may
// hold a token.
func (p *Problems) URL(field, raw, typ string) {
	if raw == "" {
		p.Add(field, "required for %s providers", typ)
		return
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		p.Add(field, "not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		p.Add(field, "scheme %q is not http or https", u.Scheme)
	case u.Host == "":
		p.Add(field, "no host")
	}
}

// Headers checks the fields headers (static request headers) and
// headers_env (header name → the environment variable holding its
// value): header names, each header once, variable names.
func (p *Problems) Headers(headers, headersEnv map[string]string) {
	for _, h := range slices.Sorted(maps.Keys(headers)) {
		if !IsToken(h) {
			p.Add("headers["+strconv.Quote(h)+"]", "not a valid header name")
		}
	}
	for _, h := range slices.Sorted(maps.Keys(headersEnv)) {
		field := "headers_env[" + strconv.Quote(h) + "]"
		if !IsToken(h) {
			p.Add(field, "not a valid header name")
		}
		if slices.ContainsFunc(slices.Collect(maps.Keys(headers)), func(s string) bool { return strings.EqualFold(s, h) }) {
			p.Add(field, "also set in headers: give each header once")
		}
		if name := headersEnv[h]; !IsEnvName(name) {
			p.Add(field, "%q is not an environment variable name (want e.g. PARTNER_API_TOKEN)", name)
		}
	}
}
