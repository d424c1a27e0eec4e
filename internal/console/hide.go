package console

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Hidden is what the console shows in place of a hidden payload field.
const Hidden = "(hidden)"

// minBlot is the shortest hidden value blotted out of free text (errors,
// answers, evidence, notes): a shorter one would blot out unrelated text.
const minBlot = 3

// hider hides the payload fields the configuration names.
type hider struct {
	paths [][]string
}

func newHider(fields []string) hider {
	var h hider
	for _, f := range fields {
		if f = strings.TrimSpace(f); f != "" {
			h.paths = append(h.paths, strings.Split(f, "."))
		}
	}
	return h
}

// decodeJSON reads a JSON document keeping numbers as written.
func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}

// shown is a payload as the console shows it, and the values it hid.
type shown struct {
	JSON   string // indented, the hidden fields replaced by Hidden
	values []string
}

// hide returns payload with the hidden fields replaced, indented. A
// payload that is not JSON (none is: the column is jsonb) is not shown.
func (h hider) hide(payload []byte) shown {
	if len(payload) == 0 {
		return shown{}
	}
	doc, err := decodeJSON(payload)
	if err != nil {
		return shown{JSON: "(not shown: not JSON)"}
	}
	var values []string
	for _, p := range h.paths {
		doc = walkHide(doc, p, &values)
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return shown{JSON: "(not shown)"}
	}
	return shown{JSON: string(b), values: values}
}

// walkHide replaces what path reaches in v, collecting the values
// replaced. An array is walked through: the path applies to each element,
// unless its next segment is a number, which picks one.
func walkHide(v any, path []string, values *[]string) any {
	if len(path) == 0 {
		collect(v, values)
		return Hidden
	}
	switch x := v.(type) {
	case map[string]any:
		if c, ok := x[path[0]]; ok {
			x[path[0]] = walkHide(c, path[1:], values)
		}
	case []any:
		if i, err := strconv.Atoi(path[0]); err == nil {
			if i >= 0 && i < len(x) {
				x[i] = walkHide(x[i], path[1:], values)
			}
			return x
		}
		for i := range x {
			x[i] = walkHide(x[i], path, values)
		}
	}
	return v
}

// collect adds the scalar values in v to values, as text.
func collect(v any, values *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for _, c := range x {
			collect(c, values)
		}
	case []any:
		for _, c := range x {
			collect(c, values)
		}
	case string:
		*values = append(*values, x)
	case json.Number:
		*values = append(*values, x.String())
	}
}

// blotter blots hidden values out of free text.
type blotter []string

// blotterOf returns the blotter of the values s hid: each as it is and as
// JSON writes it inside a string, longest first.
func blotterOf(values []string) blotter {
	var b blotter
	for _, v := range values {
		if len(v) < minBlot {
			continue
		}
		b = append(b, v)
		// As JSON writes it inside a string: Go's (escaping <, > and &)
		// and PostgreSQL's (escaping only quotes, backslashes and
		// controls).
		for _, escapeHTML := range []bool{true, false} {
			var j bytes.Buffer
			enc := json.NewEncoder(&j)
			enc.SetEscapeHTML(escapeHTML)
			if err := enc.Encode(v); err == nil {
				if e := strings.TrimSuffix(j.String(), "\n"); len(e) >= 2 && e[1:len(e)-1] != v {
					b = append(b, e[1:len(e)-1])
				}
			}
		}
	}
	slices.SortFunc(b, func(x, y string) int { return cmp.Or(cmp.Compare(len(y), len(x)), strings.Compare(x, y)) })
	return slices.Compact(b)
}

// text returns s with every hidden value replaced by Hidden.
func (b blotter) text(s string) string {
	for _, v := range b {
		s = strings.ReplaceAll(s, v, Hidden)
	}
	return s
}

// restore returns the payload an operator wrote for a supersession with
// every hidden field left as Hidden given its current value back (from
// old, at the same place): the form shows the payload hidden, and what it
// did not show is kept. A hidden field left as Hidden with no current
// value is refused, and so is a hidden field written with any other value,
// whatever the current one: the answer never depends on a value the
// operator cannot see (an equal guess and a different one are refused
// alike).
func (h hider) restore(written, old []byte) ([]byte, error) {
	if len(h.paths) == 0 {
		return written, nil
	}
	doc, err := decodeJSON(written)
	if err != nil {
		return nil, err
	}
	prev, err := decodeJSON(old)
	if err != nil {
		prev = nil
	}
	missing := false
	var wrote []string
	for _, p := range h.paths {
		w := false
		doc = walkRestore(doc, prev, p, &missing, &w)
		if w {
			wrote = append(wrote, strings.Join(p, "."))
		}
	}
	if len(wrote) > 0 {
		return nil, &hiddenWrite{field: wrote[0]}
	}
	if missing {
		return nil, errors.New("a hidden field is left as " + strconv.Quote(Hidden) + " where the current payload has no value to keep: write its value, or remove it")
	}
	return json.Marshal(doc)
}

func walkRestore(v, old any, path []string, missing, wrote *bool) any {
	if len(path) == 0 {
		switch _, null := old.(jsonNull); {
		case !hasHidden(v): // a value written where only the placeholder may stand
			*wrote = true
			return v
		case null:
			return nil // a hidden null is kept as null
		case old == nil || hasHidden(old):
			*missing = true
			return v
		}
		return old
	}
	switch x := v.(type) {
	case map[string]any:
		c, ok := x[path[0]]
		if !ok {
			return v
		}
		var oc any
		if om, ok := old.(map[string]any); ok {
			if c, ok := om[path[0]]; ok && c == nil {
				oc = jsonNull{} // present, and null: not absent
			} else {
				oc = c
			}
		}
		x[path[0]] = walkRestore(c, oc, path[1:], missing, wrote)
	case []any:
		oa, _ := old.([]any)
		at := func(i int) any {
			if i < len(oa) {
				return oa[i]
			}
			return nil
		}
		if i, err := strconv.Atoi(path[0]); err == nil {
			if i >= 0 && i < len(x) {
				x[i] = walkRestore(x[i], at(i), path[1:], missing, wrote)
			}
			return x
		}
		for i := range x {
			x[i] = walkRestore(x[i], at(i), path, missing, wrote)
		}
	}
	return v
}

// changedField returns the first hidden field (as the configuration names
// it) whose value differs between the payloads old and new: changed, added
// or removed, or moved in an array the field's path goes through; "" when
// every hidden field is as it was, or old is no payload (a tombstone's:
// it cannot be superseded).
func (h hider) changedField(old, new []byte) (string, error) {
	if len(h.paths) == 0 || len(old) == 0 {
		return "", nil
	}
	o, err := decodeJSON(old)
	if err != nil {
		return "", err
	}
	n, err := decodeJSON(new)
	if err != nil {
		return "", err
	}
	for _, p := range h.paths {
		if !reflect.DeepEqual(reach(o, p), reach(n, p)) {
			return strings.Join(p, "."), nil
		}
	}
	return "", nil
}

// absent is what reach finds where a path reaches nothing.
type absent struct{}

// reach returns what path reaches in v, walked as walkHide walks it, in
// v's shape: the members the path goes through and, along an array, every
// element in its place.
func reach(v any, path []string) any {
	if len(path) == 0 {
		return v
	}
	switch x := v.(type) {
	case map[string]any:
		c, ok := x[path[0]]
		if !ok {
			return absent{}
		}
		return map[string]any{path[0]: reach(c, path[1:])}
	case []any:
		if i, err := strconv.Atoi(path[0]); err == nil {
			if i < 0 || i >= len(x) {
				return absent{}
			}
			return reach(x[i], path[1:])
		}
		out := make([]any, len(x))
		for i := range x {
			out[i] = reach(x[i], path)
		}
		return out
	}
	return absent{}
}

// hasHidden reports whether v is, or holds, the Hidden placeholder.
func hasHidden(v any) bool {
	switch x := v.(type) {
	case string:
		return x == Hidden
	case map[string]any:
		for _, c := range x {
			if hasHidden(c) {
				return true
			}
		}
	case []any:
		for _, c := range x {
			if hasHidden(c) {
				return true
			}
		}
	}
	return false
}

// jsonIndent writes v as indented JSON.
func jsonIndent(v any) (string, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	return string(b), err
}

// hiddenWrite refuses a supersession that writes a value at a hidden
// field: only Hidden, which keeps the value, may stand there.
type hiddenWrite struct{ field string }

func (e *hiddenWrite) Error() string {
	return fmt.Sprintf("refused: the payload writes a value at the hidden field %s: the console keeps the fields it hides as they are (leave them as %q); sidefx supersede changes them", e.field, Hidden)
}

// patchTouches returns the first hidden field (as the configuration names
// it) that the JSON merge patch would set, remove or replace (a patch
// member on the field's path that is not an object replaces all below
// it), or "": decided from the patch alone, before any effect is read.
func (h hider) patchTouches(patch []byte) (string, error) {
	doc, err := decodeJSON(patch)
	if err != nil {
		return "", err
	}
	for _, p := range h.paths {
		if touches(doc, p) {
			return strings.Join(p, "."), nil
		}
	}
	return "", nil
}

func touches(patch any, path []string) bool {
	m, ok := patch.(map[string]any)
	if !ok {
		return true // replaces the whole value, hidden fields included
	}
	if len(path) == 0 {
		return true
	}
	c, ok := m[path[0]]
	if !ok {
		return false
	}
	if len(path) == 1 {
		return true
	}
	if _, err := strconv.Atoi(path[1]); err == nil {
		return true // an array on the path: a patch replaces arrays whole
	}
	return touches(c, path[1:])
}

// jsonNull stands, in walkRestore, for a member of the current payload
// that is present and null, apart from one that is absent.
type jsonNull struct{}
