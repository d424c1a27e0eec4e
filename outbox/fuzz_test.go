package outbox_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/outbox"
)

// FuzzEncodePayload: any bytes either come back as a JSON object PostgreSQL
// can store, unchanged, or are refused with a ValidationError for the
// payload; never a panic, never another error.
func FuzzEncodePayload(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `[]`, `"s"`, `null`, `{"a":"\u0000"}`, `{"a":"\\u0000"}`, "{\"a\":\"\xff\"}", ` {"a":{"b":[1,2,{"c":null}]}} `, `{"a":`, ``, `{"\\\u0000":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := outbox.EncodePayload(json.RawMessage(in), 4096)
		if err != nil {
			var ve *effects.ValidationError
			if !errors.As(err, &ve) || ve.Field != "payload" || !errors.Is(err, outbox.ErrInvalid) {
				t.Fatalf("EncodePayload(%q) = %v, want a payload ValidationError", in, err)
			}
			return
		}
		if !bytes.Equal(out, in) {
			t.Fatalf("EncodePayload changed %q to %q", in, out)
		}
		var v map[string]any
		if len(out) > 4096 || !utf8.Valid(out) || json.Unmarshal(out, &v) != nil || v == nil {
			t.Fatalf("EncodePayload accepted %q, which is not a JSON object within the limit", in)
		}
		if containsNUL(v) {
			t.Fatalf("EncodePayload accepted %q, which holds a NUL PostgreSQL cannot store", in)
		}
	})
}

func containsNUL(v any) bool {
	switch x := v.(type) {
	case string:
		return bytes.IndexByte([]byte(x), 0) >= 0
	case []any:
		for _, e := range x {
			if containsNUL(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range x {
			if containsNUL(k) || containsNUL(e) {
				return true
			}
		}
	}
	return false
}
