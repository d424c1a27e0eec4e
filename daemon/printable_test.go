package daemon

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/effects"
)

func TestPrintable(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                     "",
		"order-1":              "order-1",
		"évènement 42 ✓":       "évènement 42 ✓",
		`{"to": "a\nb"}`:       `{"to": "a\nb"}`, // JSON text, its escapes as they are
		"order\n1":             `"order\n1"`,
		"\x1b[31mred\x1b[0m":   `"\x1b[31mred\x1b[0m"`,
		"tab\there":            `"tab\there"`,
		"\u009b31m":            `"\u009b31m"`,     // the one-byte CSI
		"abc\u202edcba":        `"abc\u202edcba"`, // a right-to-left override
		"bad \xff byte":        `"bad \xff byte"`, // not UTF-8
		`"quoted" on purpose`:  `"\"quoted\" on purpose"`,
		`a\nb, written so`:     `a\nb, written so`,
		"carriage\rreturn":     `"carriage\rreturn"`,
		"bell\a and null\x00x": `"bell\a and null\x00x"`,
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %s, want %s", in, got, want)
		}
	}
}

// A source id, a note, an actor, a last error and a reference holding a
// newline and an ANSI escape sequence reach no text output raw: each is
// escaped, so the list's table keeps one line per effect; the JSON holds
// them as they are.
func TestCLI_TextEscapesWhatUsersSupply(t *testing.T) {
	t.Parallel()
	c, pool, _ := newCLI(t)
	ctx := context.Background()
	const evil = "order-1\n\x1b[31mred"
	const quoted = `"order-1\n\x1b[31mred"`
	c.ok("enqueue", "--any-kind", "--source", evil, "--kind", "email.receipt", "--payload", `{"to":"a@example.com"}`)
	c.ok("enqueue", "--any-kind", "--source", "order-2", "--kind", "email.receipt", "--payload", `{}`)
	if _, err := pool.Exec(ctx, `UPDATE side_effects SET last_error = E'boom\n\x1b[2J', provider_ref = E're\tf'`); err != nil {
		t.Fatal(err)
	}
	c.ok("pause", "--kind", "email.receipt", "--actor", "ops\x1b[0m", "--note", "incident\n12")
	raw := func(cmd, out string) {
		t.Helper()
		if strings.Contains(out, "\x1b") {
			t.Errorf("sidefx %s writes a raw escape:\n%q", cmd, out)
		}
	}

	list := c.ok("list")
	raw("list", list)
	if strings.Contains(list, "\t") {
		t.Errorf("list writes a raw tab:\n%q", list)
	}
	lines := strings.Split(strings.TrimSuffix(list, "\n"), "\n")
	if len(lines) != 4 || !strings.Contains(lines[1], quoted) || !strings.Contains(lines[1], `"boom\n\x1b[2J"`) || !strings.Contains(lines[1], `"re\tf"`) {
		t.Errorf("list: want a header, two rows and a total, the first row's fields escaped:\n%s", list)
	}

	inspect := c.ok("inspect", "--source", evil, "--kind", "email.receipt")
	raw("inspect", inspect)
	if !regexp.MustCompile(`(?m)^source_id +` + regexp.QuoteMeta(quoted) + `$`).MatchString(inspect) {
		t.Errorf("inspect does not escape the source id:\n%s", inspect)
	}
	for _, want := range []string{`"boom\n\x1b[2J"`, `"re\tf"`, `"ops\x1b[0m"`, `"incident\n12"`} {
		if !strings.Contains(inspect, want) {
			t.Errorf("inspect lacks %s:\n%s", want, inspect)
		}
	}
	status := c.ok("status")
	raw("status", status)
	if !strings.Contains(status, `by "ops\x1b[0m" ("incident\n12")`) {
		t.Errorf("status does not escape the pause's actor and note:\n%s", status)
	}
	c.ok("resume", "--kind", "email.receipt", "--actor", "ops", "--note", "over")
	cancel := c.ok("cancel", "--source", evil, "--kind", "email.receipt", "--actor", "ops", "--note", "a\x1b[1mbold\x1b[0m note")
	raw("cancel", cancel)
	if !strings.Contains(cancel, "(email.receipt "+quoted+"): cancelled") {
		t.Errorf("cancel: %s", cancel)
	}
	if out := c.ok("inspect", "--source", evil, "--kind", "email.receipt"); !strings.Contains(out, `cancelled by ops: "a\x1b[1mbold\x1b[0m note"`) {
		t.Errorf("inspect's history does not escape the note:\n%s", out)
	}

	// The JSON holds the values as they were given.
	var e effects.EffectJSON
	js := c.ok("list", "--json", "--source-prefix", "order-1")
	if err := json.Unmarshal([]byte(js), &e); err != nil || e.SourceID != evil || e.LastError == nil || *e.LastError != "boom\n\x1b[2J" {
		t.Errorf("list --json: %v\n%s", err, js)
	}
	raw("list --json", js)
}
