package providers

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// maxDepth bounds the nesting of an answer's JSON body kept as JSON in a
// Detail; a deeper body is kept as a string (PostgreSQL's jsonb parser
// recurses).
const maxDepth = 64

// AnswerJSON returns an answer's body for a Result's Detail: as is when it is complete,
// valid JSON that PostgreSQL's jsonb accepts; re-encoded when it is valid
// JSON with escapes jsonb refuses (\u0000, lone surrogates); otherwise
// (truncated, not JSON, too deep, numbers out of jsonb's range) as a JSON
// string of its text, invalid UTF-8 and NUL bytes replaced by U+FFFD. Empty
// gives nil.
func AnswerJSON(body []byte, complete bool) json.RawMessage {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if complete && json.Valid(body) {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err == nil && storable(v, 0) {
			if !bytes.Contains(body, []byte(`\u`)) {
				return bytes.TrimSpace(body)
			}
			if b, err := json.Marshal(scrubNUL(v)); err == nil {
				return b
			}
		}
	}
	b, _ := json.Marshal(strings.ReplaceAll(strings.ToValidUTF8(string(body), "\uFFFD"), "\x00", "\uFFFD"))
	return b
}

// storable reports whether a decoded JSON value nests at most maxDepth
// deep and holds only numbers of a modest size, which jsonb stores.
func storable(v any, d int) bool {
	if d > maxDepth {
		return false
	}
	switch v := v.(type) {
	case json.Number:
		return modestNumber(string(v))
	case map[string]any:
		for _, e := range v {
			if !storable(e, d+1) {
				return false
			}
		}
	case []any:
		for _, e := range v {
			if !storable(e, d+1) {
				return false
			}
		}
	}
	return true
}

// modestNumber reports whether a JSON number literal has at most 64
// characters and an exponent of at most 1000 either way: far inside the range
// of PostgreSQL's numeric.
func modestNumber(n string) bool {
	if len(n) > 64 {
		return false
	}
	i := strings.IndexAny(n, "eE")
	if i < 0 {
		return true
	}
	exp, err := strconv.Atoi(strings.TrimPrefix(n[i+1:], "+"))
	return err == nil && exp >= -1000 && exp <= 1000
}

// scrubNUL replaces NUL characters in the strings and keys of a decoded
// JSON value (the decoder already replaced lone surrogates).
func scrubNUL(v any) any {
	fix := func(s string) string { return strings.ReplaceAll(s, "\x00", "\uFFFD") }
	switch v := v.(type) {
	case string:
		return fix(v)
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[fix(k)] = scrubNUL(e)
		}
		return m
	case []any:
		for i, e := range v {
			v[i] = scrubNUL(e)
		}
		return v
	}
	return v
}
