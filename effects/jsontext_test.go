package effects_test

import (
	"strings"
	"testing"

	"github.com/sidefx/sidefx/effects"
)

func TestJSONProblem(t *testing.T) {
	t.Parallel()
	ok := []string{`{}`, `{"a":"\\u0000"}`, `{"a":"\ud83d\ude00"}`, `{"a":"\u00e9"}`, `{"a":"\n\t"}`}
	for _, s := range ok {
		if p := effects.JSONProblem([]byte(s)); p != "" {
			t.Errorf("JSONProblem(%s) = %q", s, p)
		}
	}
	bad := map[string]string{
		`{"a":"\u0000"}`:       `\u0000`,
		`{"a":"x\ud800"}`:      "surrogate",
		`{"a":"\udc00x"}`:      "surrogate",
		`{"a":"\ud800\u0041"}`: "surrogate",
		"{\"a\":\"\xff\"}":     "UTF-8",
	}
	for s, want := range bad {
		if p := effects.JSONProblem([]byte(s)); !strings.Contains(p, want) {
			t.Errorf("JSONProblem(%q) = %q, want %q", s, p, want)
		}
	}
}
