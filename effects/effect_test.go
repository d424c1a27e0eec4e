package effects_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sidefx/sidefx/effects"
)

func TestTransitions_MatchTheDiagram(t *testing.T) {
	t.Parallel()
	allowed := map[[2]effects.State]bool{
		{effects.Pending, effects.Fired}:       true,
		{effects.Pending, effects.Cancelled}:   true,
		{effects.Fired, effects.Confirmed}:     true,
		{effects.Fired, effects.Failed}:        true,
		{effects.Fired, effects.Pending}:       true,
		{effects.Fired, effects.Uncertain}:     true,
		{effects.Uncertain, effects.Confirmed}: true,
		{effects.Uncertain, effects.Failed}:    true,
		{effects.Uncertain, effects.Pending}:   true,
		{effects.Failed, effects.Pending}:      true,
		// A late answer settles a rescued effect; a claim past the key
		// window makes an effect that may have been performed uncertain.
		{effects.Pending, effects.Confirmed}: true,
		{effects.Pending, effects.Failed}:    true,
		{effects.Pending, effects.Uncertain}: true,
		{effects.Failed, effects.Confirmed}:  true,
	}
	for _, from := range effects.States {
		for _, to := range effects.States {
			if got, want := effects.CanTransition(from, to), allowed[[2]effects.State{from, to}]; got != want {
				t.Errorf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
	for _, s := range effects.States {
		if _, ok := effects.Transitions[s]; !ok {
			t.Errorf("Transitions has no entry for %s", s)
		}
	}
}

func TestState_TerminalAndParse(t *testing.T) {
	t.Parallel()
	terminal := map[effects.State]bool{effects.Confirmed: true, effects.Failed: true, effects.Cancelled: true}
	for _, s := range effects.States {
		if s.Terminal() != terminal[s] {
			t.Errorf("%s.Terminal() = %v", s, s.Terminal())
		}
		got, err := effects.ParseState(" " + strings.ToUpper(string(s)) + " ")
		if err != nil || got != s {
			t.Errorf("ParseState(%s) = %v, %v", s, got, err)
		}
	}
	if _, err := effects.ParseState("done"); err == nil {
		t.Error("ParseState(done) accepted")
	}
	if effects.State("done").Valid() {
		t.Error(`State("done").Valid()`)
	}
}

func TestValidateSourceID(t *testing.T) {
	t.Parallel()
	ok := []string{"a", "order-1042", strings.Repeat("x", 255), strings.Repeat("é", 255), "evt_01HZ|x y"}
	for _, id := range ok {
		if err := effects.ValidateSourceID(id); err != nil {
			t.Errorf("ValidateSourceID(%.20q…) = %v", id, err)
		}
	}
	bad := map[string]string{
		"":                       "empty",
		strings.Repeat("x", 256): "256 characters",
		strings.Repeat("é", 256): "256 characters",
		"bad\xffutf8":            "UTF-8",
		"nul\x00byte":            "NUL",
	}
	for id, want := range bad {
		err := effects.ValidateSourceID(id)
		var ve *effects.ValidationError
		if !errors.As(err, &ve) || !errors.Is(err, effects.ErrInvalid) {
			t.Errorf("ValidateSourceID(%.20q…) = %v, want a ValidationError", id, err)
			continue
		}
		if ve.Field != "source_id" || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateSourceID(%.20q…) = %q, want field source_id and %q", id, err, want)
		}
	}
}

func TestValidateKind(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"email.receipt", "stripe.payment_intent.create", "webhook.order-paid", "a", "a.1", strings.Repeat("a", 128)} {
		if err := effects.ValidateKind(k); err != nil {
			t.Errorf("ValidateKind(%q) = %v", k, err)
		}
	}
	for _, k := range []string{"", "Email.receipt", "1abc", "email..receipt", "email.", ".email", "email receipt", "émail", strings.Repeat("a", 129), "a;drop table x"} {
		err := effects.ValidateKind(k)
		if !errors.Is(err, effects.ErrInvalid) || !strings.Contains(err.Error(), "kind") {
			t.Errorf("ValidateKind(%q) = %v, want an invalid-kind error", k, err)
		}
	}
}

// FuzzValidate: any source id and kind are accepted or refused with a
// ValidationError naming the field, never a panic; what is accepted is what
// the table's CHECK constraints accept.
func FuzzValidate(f *testing.F) {
	for _, s := range [][2]string{{"order-1", "email.receipt"}, {"", ""}, {"a\x00b", "k"}, {"\xff", "K"}, {"'; DROP TABLE side_effects; --", "a.b"}, {strings.Repeat("é", 256), "a..b"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, source, kind string) {
		for field, err := range map[string]error{"source_id": effects.ValidateSourceID(source), "kind": effects.ValidateKind(kind)} {
			if err == nil {
				continue
			}
			var ve *effects.ValidationError
			if !errors.As(err, &ve) || ve.Field != field || !errors.Is(err, effects.ErrInvalid) {
				t.Fatalf("%s: %v is not a ValidationError for the field", field, err)
			}
		}
		if effects.ValidateSourceID(source) == nil {
			n := utf8.RuneCountInString(source)
			if n < 1 || n > 255 || !utf8.ValidString(source) || strings.IndexByte(source, 0) >= 0 {
				t.Fatalf("accepted source id %q", source)
			}
		}
		if effects.ValidateKind(kind) == nil && (len(kind) > 128 || kind != strings.ToLower(kind) || strings.Contains(kind, "..")) {
			t.Fatalf("accepted kind %q", kind)
		}
	})
}

// What list and the console show beside an effect: its latest attempt's
// error only, never one an earlier attempt left (rows written before
// schema 38 kept it beside a later attempt's answer).
func TestLatestError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		e       effects.Effect
		attempt int
		text    string
	}{
		{effects.Effect{State: effects.Confirmed, Attempts: 7, OutcomeAttempt: 7, LastError: "attempt 6 of 8: retryable: 429"}, 0, ""},
		// Attempt 7's EOF, then reconciliation found it performed.
		{effects.Effect{State: effects.Confirmed, Attempts: 7, OutcomeAttempt: 7, LastError: "attempt 7 of 8: unknown: EOF"}, 0, ""},
		{effects.Effect{State: effects.Uncertain, Attempts: 7, OutcomeAttempt: 7, LastError: "attempt 7 of 8: unknown: EOF"}, 7, "attempt 7 of 8: unknown: EOF"},
		{effects.Effect{State: effects.Pending, Attempts: 7, OutcomeAttempt: 7, LastError: "attempt 6 of 8: retryable: 429"}, 0, ""},
		{effects.Effect{State: effects.Fired, Attempts: 8, OutcomeAttempt: 7, LastError: "attempt 7 of 8: unknown: EOF"}, 7, "attempt 7 of 8: unknown: EOF"},
		{effects.Effect{State: effects.Pending, Attempts: 3, OutcomeAttempt: 2, LastError: "attempt 3: lease expired at T with no outcome recorded (worker w)"}, 3, "attempt 3: lease expired at T with no outcome recorded (worker w)"},
		{effects.Effect{State: effects.Failed, Attempts: 2, OutcomeAttempt: 2, LastError: "resolved as failed by ops: never sent"}, 0, "resolved as failed by ops: never sent"},
	} {
		if at, text := c.e.LatestError(); at != c.attempt || text != c.text {
			t.Errorf("%s, %d attempts, error %q: (%d, %q), want (%d, %q)", c.e.State, c.e.Attempts, c.e.LastError, at, text, c.attempt, c.text)
		}
	}
}

// WhetherPerformed never says "never sent" of an effect held uncertain
// after a failover: its claim may have been lost with the old primary.
func TestWhetherPerformed_AHeldEffectMayHaveBeen(t *testing.T) {
	for _, c := range []struct {
		e    effects.Effect
		want string
	}{
		{effects.Effect{State: effects.Pending}, "no: never sent"},
		{effects.Effect{State: effects.Uncertain, LastError: "held after a failover"}, "maybe: held uncertain"},
		{effects.Effect{State: effects.Uncertain, Attempts: 2, MaybeAttempts: []int{2}}, "maybe: attempt 2"},
		{effects.Effect{State: effects.Confirmed, Attempts: 1}, "yes"},
	} {
		if got := effects.WhetherPerformed(&c.e); !strings.HasPrefix(got, c.want) {
			t.Errorf("%s with %d attempts: %q, want %q…", c.e.State, c.e.Attempts, got, c.want)
		}
	}
}
