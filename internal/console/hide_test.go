package console

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestHide_PathsThroughObjectsAndArrays(t *testing.T) {
	t.Parallel()
	h := newHider([]string{"personalizations.to.email", "customer_email", "items.1.card", "missing.path", "meta"})
	payload := `{"personalizations":[{"to":[{"email":"a@example.com","name":"A"},{"email":"b@example.com"}]},{"to":[{"email":"c@example.com"}]}],
		"customer_email":"d@example.com","items":[{"card":"4242"},{"card":"5555-secret"}],"meta":{"ip":"192.0.2.1","n":12345678901234567890},
		"email":"top-level-not-hidden","amount":12345678901234567890}`
	s := h.hide([]byte(payload))
	for _, gone := range []string{"a@example.com", "b@example.com", "c@example.com", "d@example.com", "5555-secret", "192.0.2.1", "12345678901234567890\n  }"} {
		if strings.Contains(s.JSON, gone) {
			t.Errorf("%q is shown:\n%s", gone, s.JSON)
		}
	}
	for _, kept := range []string{`"name": "A"`, `"card": "4242"`, "top-level-not-hidden", `"amount": 12345678901234567890`} {
		if !strings.Contains(s.JSON, kept) {
			t.Errorf("%q is not shown:\n%s", kept, s.JSON)
		}
	}
	b := blotterOf(s.values)
	if got := b.text("550 mailbox a@example.com unknown; from 192.0.2.1"); got != "550 mailbox (hidden) unknown; from (hidden)" {
		t.Errorf("blotted: %q", got)
	}
	if got := b.text("a number: 12345678901234567890"); strings.Contains(got, "1234567890") {
		t.Errorf("a hidden number is not blotted: %q", got)
	}
	if s := h.hide([]byte(`nope`)); s.JSON != "(not shown: not JSON)" {
		t.Errorf("not JSON: %q", s.JSON)
	}
}

func TestHide_ShortValuesAreNotBlottedOutOfText(t *testing.T) {
	t.Parallel()
	s := newHider([]string{"n"}).hide([]byte(`{"n":"ab","m":"x"}`))
	if !strings.Contains(s.JSON, `"n": "(hidden)"`) {
		t.Errorf("payload %s", s.JSON)
	}
	if got := blotterOf(s.values).text("abc"); got != "abc" {
		t.Errorf("a 2-character value blotted text: %q", got)
	}
	if got := blotterOf([]string{`a<b"c`}).text(`{"x":"a<b\"c"}`); got != `{"x":"(hidden)"}` {
		t.Errorf("a value as JSON writes it is not blotted: %q", got)
	}
}

func TestHide_RestoreKeepsWhatTheFormDidNotShow(t *testing.T) {
	t.Parallel()
	h := newHider([]string{"personalizations.to.email", "customer"})
	old := `{"personalizations":[{"to":[{"email":"a@example.com"},{"email":"b@example.com"}]}],"customer":{"id":"cus_1"},"template":"old"}`
	shown := h.hide([]byte(old)).JSON
	written := strings.Replace(shown, `"old"`, `"new"`, 1)
	got, err := h.restore([]byte(written), []byte(old))
	if err != nil {
		t.Fatal(err)
	}
	var want, have any
	_ = json.Unmarshal([]byte(strings.Replace(old, `"old"`, `"new"`, 1)), &want)
	_ = json.Unmarshal(got, &have)
	if wb, _ := json.Marshal(want); string(wb) != func() string { hb, _ := json.Marshal(have); return string(hb) }() {
		t.Errorf("restored %s", got)
	}
	// An address written over the placeholder is refused, and so is the
	// address it replaces: a value at a hidden field is refused whatever
	// it is, never compared with the one kept.
	for _, addr := range []string{"new@example.com", "a@example.com"} {
		_, err = h.restore([]byte(`{"personalizations":[{"to":[{"email":"`+addr+`"},{"email":"(hidden)"}]}],"customer":"(hidden)"}`), []byte(old))
		if hw := new(hiddenWrite); !errors.As(err, &hw) || hw.field != "personalizations.to.email" {
			t.Errorf("an address %s written over the placeholder: %v", addr, err)
		}
	}
	// A placeholder where the current payload has nothing is refused.
	if _, err := h.restore([]byte(`{"personalizations":[{"to":[{"email":"(hidden)"},{"email":"(hidden)"},{"email":"(hidden)"}]}]}`), []byte(old)); err == nil {
		t.Error("a placeholder with no value to keep was accepted")
	}
}

func TestHide_ChangedFieldFindsEveryChangeToAHiddenField(t *testing.T) {
	t.Parallel()
	h := newHider([]string{"personalizations.to.email", "customer_email", "items.0.card"})
	old := `{"personalizations":[{"to":[{"email":"a@example.com","name":"A"}]}],"customer_email":"c@example.com","items":[{"card":"4242"}],"template":"old"}`
	for name, c := range map[string]struct{ new, field string }{
		"a visible field changed": {`{"personalizations":[{"to":[{"name":"B","email":"a@example.com"}]}],"customer_email":"c@example.com","items":[{"card":"4242"},{"card":"1"}],"template":"new"}`, ""},
		"a hidden value changed":  {`{"personalizations":[{"to":[{"email":"a@example.com","name":"A"}]}],"customer_email":"me@example.com","items":[{"card":"4242"}]}`, "customer_email"},
		"a hidden field removed":  {`{"personalizations":[{"to":[{"email":"a@example.com","name":"A"}]}],"items":[{"card":"4242"}]}`, "customer_email"},
		"a hidden field nulled":   {`{"personalizations":[{"to":[{"email":"a@example.com","name":"A"}]}],"customer_email":null,"items":[{"card":"4242"}]}`, "customer_email"},
		"an address changed":      {`{"personalizations":[{"to":[{"email":"me@example.com","name":"A"}]}],"customer_email":"c@example.com","items":[{"card":"4242"}]}`, "personalizations.to.email"},
		"a recipient added":       {`{"personalizations":[{"to":[{"email":"a@example.com","name":"A"},{"email":"me@example.com"}]}],"customer_email":"c@example.com","items":[{"card":"4242"}]}`, "personalizations.to.email"},
		"a personalization added": {`{"personalizations":[{"to":[{"email":"a@example.com","name":"A"}]},{"to":[{"email":"me@example.com"}]}],"customer_email":"c@example.com","items":[{"card":"4242"}]}`, "personalizations.to.email"},
		"the recipients replaced": {`{"personalizations":"me@example.com","customer_email":"c@example.com","items":[{"card":"4242"}]}`, "personalizations.to.email"},
		"an indexed value moved":  {`{"personalizations":[{"to":[{"email":"a@example.com","name":"A"}]}],"customer_email":"c@example.com","items":[{"card":"1"},{"card":"4242"}]}`, "items.0.card"},
	} {
		got, err := h.changedField([]byte(old), []byte(c.new))
		if err != nil || got != c.field {
			t.Errorf("%s: changed %q, %v; want %q", name, got, err, c.field)
		}
	}
	// A hidden field added where the payload had none is a change too.
	if got, _ := h.changedField([]byte(`{"template":"old"}`), []byte(`{"template":"old","customer_email":"me@example.com"}`)); got != "customer_email" {
		t.Errorf("a hidden field added: changed %q", got)
	}
}

func TestParseTokens(t *testing.T) {
	t.Parallel()
	const hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" // sha256("test")
	ts, err := ParseTokens("# comment\n\n" + hash + " operator  on call ops\n")
	if err != nil || len(ts) != 1 || ts[0].Role != Operator || ts[0].Actor != "on call ops" {
		t.Fatalf("%+v, %v", ts, err)
	}
	a := Auth{Tokens: ts}
	if tk, ok := a.lookupToken("test"); !ok || tk.Actor != "on call ops" {
		t.Errorf("lookup: %+v %v", tk, ok)
	}
	if _, ok := a.lookupToken("Test"); ok {
		t.Error("another token was accepted")
	}
	for _, bad := range []string{
		"abc operator x",
		hash + " root x",
		hash + " viewer",
		hash + " viewer a\n" + hash + " admin b",
	} {
		_, err := ParseTokens(bad)
		if err == nil {
			t.Errorf("%q accepted", bad)
			continue
		}
		if strings.Contains(err.Error(), hash) || strings.Contains(err.Error(), "root") {
			t.Errorf("the error quotes the line: %v", err)
		}
	}
}

// A bulk patch is judged from itself: it touches a hidden field when it
// sets, removes or replaces it, or replaces what holds it.
func TestHide_PatchTouches(t *testing.T) {
	t.Parallel()
	h := newHider([]string{"personalizations.to.email", "customer.id", "items.1.card"})
	for patch, want := range map[string]string{
		`{"template_id":"d-new"}`:                       "",
		`{"customer":{"name":"Ann"}}`:                   "",
		`{"customer":{"id":"cus_guess"}}`:               "customer.id",
		`{"customer":{"id":null}}`:                      "customer.id",
		`{"customer":null}`:                             "customer.id",
		`{"customer":"x"}`:                              "customer.id",
		`{"personalizations":[{"to":[{"email":"x"}]}]}`: "personalizations.to.email",
		`{"personalizations":{"to":{"email":"x"}}}`:     "personalizations.to.email",
		`{"personalizations":{"subject":"hello"}}`:      "",
		`{"items":[{"card":"x"}]}`:                      "items.1.card",
		`{"items":{"1":{"card":"x"}}}`:                  "items.1.card",
		`[]`:                                            "personalizations.to.email",
	} {
		got, err := h.patchTouches([]byte(patch))
		if err != nil || got != want {
			t.Errorf("patch %s touches %q, %v; want %q", patch, got, err, want)
		}
	}
}
