package webhook

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxRefBytes bounds a Ref taken from an answer, and a webhook-id.
const maxRefBytes = 255

// maxDepth bounds the nesting of an answer's JSON body kept as JSON in a
// Detail; a deeper body is kept as a string (PostgreSQL's jsonb parser
// recurses).
const maxDepth = 64

// detail is a Result's Detail for an answer: what an operator needs to see
// why a delivery was not confirmed, or what the receiver said when it was.
type detail struct {
	Status    int             `json:"status"`
	Location  string          `json:"location,omitempty"`
	RequestID string          `json:"request_id,omitempty"`
	Body      json.RawMessage `json:"body,omitempty"`
	Truncated bool            `json:"truncated,omitempty"`
}

// encode returns d as JSON; every field is already safe to encode.
func (d detail) encode() json.RawMessage {
	b, err := json.Marshal(d)
	if err != nil {
		// Unreachable: Body is valid JSON. Keep the status at least.
		b, _ = json.Marshal(detail{Status: d.Status, Truncated: true})
	}
	return b
}

// bodyJSON returns an answer's body for a Detail: as is when it is complete,
// valid JSON that PostgreSQL's jsonb accepts; re-encoded when it is valid
// JSON with escapes jsonb refuses (\u0000, lone surrogates); otherwise
// (truncated, not JSON, too deep, numbers out of jsonb's range) as a JSON
// string of its text, invalid UTF-8 and NUL bytes replaced by U+FFFD. Empty
// gives nil.
func bodyJSON(body []byte, complete bool) json.RawMessage {
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

// bodyID returns the "id" of a JSON object body, a string or a number, if it
// is a usable Ref; else "".
func bodyID(body []byte) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return ""
	}
	raw, ok := obj["id"]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return cleanRef([]byte(s))
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return cleanRef([]byte(n))
	}
	return ""
}

// cleanRef returns b as a reference if it is one: valid UTF-8 with no
// control characters, 1 to maxRefBytes bytes after trimming spaces; else "".
func cleanRef(b []byte) string {
	s := strings.TrimSpace(string(b))
	if s == "" || len(s) > maxRefBytes || !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return ""
	}
	return s
}

// cleanText returns b as printable text of at most limit bytes: invalid
// UTF-8 and control characters replaced, cut at a character boundary.
func cleanText(b []byte, limit int) string {
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '\uFFFD'
		}
		return r
	}, strings.ToValidUTF8(string(b), "\uFFFD"))
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// secretForms returns the spellings of a signing secret that an answer
// could echo, for a providers.Redactor (which adds their URL and JSON
// escapings): the secret itself, its key in the common base64 alphabets,
// padded or not, in hex, and raw.
func secretForms(secret string, key []byte) []string {
	return []string{
		secret,
		base64.StdEncoding.EncodeToString(key),
		base64.RawStdEncoding.EncodeToString(key),
		base64.URLEncoding.EncodeToString(key),
		base64.RawURLEncoding.EncodeToString(key),
		hex.EncodeToString(key),
		strings.ToUpper(hex.EncodeToString(key)),
		string(key),
	}
}

// sortedStrings returns s sorted.
func sortedStrings(s []string) []string {
	slices.Sort(s)
	return s
}
