package daemon

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The command table of docs/operations.md names every command the CLI
// has, and none it lacks; the binary's package doc points at the full list.
func TestDocs_CommandTableMatchesTheCLI(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(doc), "## Commands")
	if start < 0 {
		t.Fatal(`docs/operations.md has no "## Commands" section`)
	}
	section := string(doc[start:])
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	documented := map[string]bool{}
	// Each row's first cell: `sidefx NAME …`, some with a second form
	// (`sidefx pause … / sidefx resume …`).
	cell := regexp.MustCompile("(?m)^\\| (.*?) \\|")
	name := regexp.MustCompile("`sidefx ([a-z]+)")
	for _, m := range cell.FindAllStringSubmatch(section, -1) {
		for _, n := range name.FindAllStringSubmatch(m[1], -1) {
			documented[n[1]] = true
		}
	}
	cli := map[string]bool{}
	for _, c := range commands() {
		cli[c.name] = true
	}
	for _, n := range slices.Sorted(maps.Keys(cli)) {
		if !documented[n] {
			t.Errorf("sidefx %s is a command, missing from the table in docs/operations.md", n)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(documented)) {
		if !cli[n] {
			t.Errorf("docs/operations.md's table has sidefx %s, which is no command", n)
		}
	}
	if len(documented) < 10 {
		t.Fatalf("found %d commands in the table: not the table this test expects", len(documented))
	}
}
