package engine

import (
	"slices"
	"strings"
	"testing"
)

// What the literal encoder writes, the parser reads back element for
// element, whatever the elements hold (the parser also reads PostgreSQL's
// own output, which quotes only where needed: see the round trips through
// the server in driver_test.go).
func FuzzArrayLiteral(f *testing.F) {
	for _, s := range []string{"", "a", `a"b`, `\`, `{,}`, "NULL", " x ", "a\x1fb\x1f", "ünï\x1f✓"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		elems := strings.Split(s, "\x1f")
		lit := arrayLiteral(len(elems), func(i int) string { return quote(elems[i]) })
		got, err := arrayElems(lit)
		if err != nil {
			t.Fatalf("%q: %v", lit, err)
		}
		back := make([]string, len(got))
		for i, p := range got {
			if p == nil {
				t.Fatalf("%q: element %d read as NULL", lit, i+1)
			}
			back[i] = *p
		}
		if !slices.Equal(back, elems) {
			t.Fatalf("%q read back as %q, want %q", lit, back, elems)
		}
	})
}

func TestArrayElems_PostgresForms(t *testing.T) {
	str := func(s string) *string { return &s }
	for _, c := range []struct {
		in   string
		want []*string
	}{
		{`{}`, []*string{}},
		{`{a,b}`, []*string{str("a"), str("b")}},
		{`{NULL,"NULL",null}`, []*string{nil, str("NULL"), nil}},
		{`{"a,b","c\"d","e\\f",""}`, []*string{str("a,b"), str(`c"d`), str(`e\f`), str("")}},
		{`[0:1]={1,2}`, []*string{str("1"), str("2")}},
	} {
		got, err := arrayElems(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if !slices.EqualFunc(got, c.want, func(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }) {
			t.Errorf("%s: got %v", c.in, got)
		}
	}
	for _, bad := range []string{``, `{`, `a,b`, `{"a}`, `{"a"b}`, `{{1},{2}}`} {
		if _, err := arrayElems(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
