package ptype

import (
	"fmt"
	"strings"
)

// Problem is one thing wrong with a provider's settings, or with what a
// kind asks of its provider.
type Problem struct {
	// Path names the field from the top of the file:
	// providers["sms"].token_env, kinds["sms.send"].operation.
	Path string
	// Message says what is wrong. It holds no secret.
	Message string
}

// Problems collects what is wrong with one provider's own settings (a
// type's check), or with what a kind asks of its provider (a type's
// CheckKind).
type Problems struct {
	path string
	list []Problem
}

// NewProblems returns an empty collection for the provider or kind at path
// (providers["sms"], kinds["sms.send"]). Package config makes them.
func NewProblems(path string) *Problems { return &Problems{path: path} }

// Add records a problem with field, a path relative to the provider (or
// kind) as the YAML spells it ("token_env", "routes[2].url",
// `headers["X-Tenant"]`), or "" for the provider (or kind) as a whole. The
// message must hold no secret.
func (p *Problems) Add(field, format string, args ...any) {
	p.list = append(p.list, Problem{Path: Join(p.path, field), Message: fmt.Sprintf(format, args...)})
}

// List returns the problems recorded, in order.
func (p *Problems) List() []Problem { return p.list }

// Join returns the path of field (relative, as Problems.Add takes it) under
// path.
func Join(path, field string) string {
	switch {
	case field == "":
		return path
	case strings.HasPrefix(field, "["):
		return path + field
	}
	return path + "." + field
}
