package webhook

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxRefBytes bounds a Ref taken from an answer, and a webhook-id.
const maxRefBytes = 255

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
