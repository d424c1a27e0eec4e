package main

import (
	"strings"
	"testing"
)

// A --against revision's cells get a column of their own and the working
// tree's ratio to them; a table without them has neither.
func TestMarkdown_RevisionColumn(t *testing.T) {
	tb := newTable()
	tb.add("1. enqueue", "1 producer(s), 1 effect per tx", "tx/s", colSidefx, 1500)
	tb.add("1. enqueue", "1 producer(s), 1 effect per tx", "tx/s", colRiverU, 1000)
	plain := tb.markdown()
	if strings.Contains(plain, "@") {
		t.Fatalf("a table without a revision has its column:\n%s", plain)
	}
	r := &revision{sha: "aba0a921bc32"}
	for _, v := range []float64{1000, 1200, 1300} {
		tb.add("1. enqueue", "1 producer(s), 1 effect per tx", "tx/s", r.column(), v)
	}
	md := tb.markdown()
	lines := strings.Split(md, "\n")
	if !strings.HasSuffix(lines[0], "| sidefx @aba0a921bc32 | sidefx/@aba0a921bc32 |") {
		t.Fatalf("header: %s", lines[0])
	}
	// The median of the revision's runs (1,200), and 1,500 over it.
	if !strings.HasSuffix(lines[2], "| 1200 | 1.25 |") {
		t.Fatalf("row: %s", lines[2])
	}
	if got, want := strings.Count(lines[0], "|"), strings.Count(lines[1], "|"); got != want {
		t.Fatalf("header has %d bars, rule %d", got, want)
	}
}

// A child's server is its parent's, by URL, with each database in the path.
func TestAttached_ConnString(t *testing.T) {
	u := "postgres://postgres@127.0.0.1:5433/postgres?sslmode=disable"
	a, err := parseAttached(u)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := a.ConnString("tmpl_sidefxrev"), "postgres://postgres@127.0.0.1:5433/tmpl_sidefxrev?sslmode=disable"; got != want {
		t.Fatalf("ConnString = %s, want %s", got, want)
	}
	if a.Port() != 5433 {
		t.Fatalf("Port = %d", a.Port())
	}
}

// A child's log lines reach the parent's, each with the revision before it,
// however the writes split them.
func TestPrefixWriter(t *testing.T) {
	var b strings.Builder
	w := &prefixWriter{w: &b, prefix: "@x "}
	for _, s := range []string{"one\ntw", "o\n", "three\n"} {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := b.String(), "@x one\n@x two\n@x three\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
