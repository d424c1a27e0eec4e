package engine

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// The SQL text of drift rules: what a rule's own SQL may hold, and the
// statements sidefx writes around it, with the database's error positions
// placed back in the rule's text.

// placeholderNames are the placeholders a rule's SQL may use.
var placeholderNames = []string{"due_before", "window_start"}

// placeholder is one :name in a rule's SQL, outside strings, quoted
// identifiers, comments and array subscripts; start and end are byte offsets.
type placeholder struct {
	name       string
	start, end int
}

// placeholders scans sql the way PostgreSQL's lexer would for what a
// placeholder can be: a colon then an identifier, not a :: cast, not inside
// '…', E'…', "…", $tag$…$tag$, -- and /* */ comments, or [lo:hi] subscripts.
func placeholders(sql string) []placeholder {
	var out []placeholder
	brackets := 0
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '-' && strings.HasPrefix(sql[i:], "--"):
			if j := strings.IndexByte(sql[i:], '\n'); j >= 0 {
				i += j + 1
			} else {
				i = len(sql)
			}
		case c == '/' && strings.HasPrefix(sql[i:], "/*"):
			i = skipBlockComment(sql, i)
		case c == '\'':
			escapes := i > 0 && (sql[i-1] == 'e' || sql[i-1] == 'E') && (i == 1 || !isIdent(sql[i-2]))
			i = skipQuoted(sql, i, '\'', escapes)
		case c == '"':
			i = skipQuoted(sql, i, '"', false)
		case c == '$' && (i == 0 || !isIdent(sql[i-1])):
			i = skipDollarQuoted(sql, i)
		case c == '[':
			brackets++
			i++
		case c == ']':
			if brackets > 0 {
				brackets--
			}
			i++
		case c == ':' && i+1 < len(sql) && sql[i+1] == ':':
			i += 2
		case c == ':' && brackets == 0 && i+1 < len(sql) && isIdentStart(sql[i+1]):
			j := i + 2
			for j < len(sql) && isIdent(sql[j]) {
				j++
			}
			out = append(out, placeholder{name: sql[i+1 : j], start: i, end: j})
			i = j
		default:
			if isIdent(c) { // a whole word, so that a$1 or x:: are not misread
				for i < len(sql) && (isIdent(sql[i]) || sql[i] == '$') {
					i++
				}
			} else {
				i++
			}
		}
	}
	return out
}

func isIdentStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

func isIdent(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }

// skipQuoted returns the offset after the quoted text starting at i, a
// doubled quote standing for one (and, with escapes, a backslash escaping
// the next byte).
func skipQuoted(sql string, i int, q byte, escapes bool) int {
	for j := i + 1; j < len(sql); j++ {
		switch {
		case escapes && sql[j] == '\\':
			j++
		case sql[j] == q && j+1 < len(sql) && sql[j+1] == q:
			j++
		case sql[j] == q:
			return j + 1
		}
	}
	return len(sql)
}

func skipBlockComment(sql string, i int) int {
	depth := 0
	for j := i; j < len(sql)-1; j++ {
		switch sql[j : j+2] {
		case "/*":
			depth++
			j++
		case "*/":
			depth--
			j++
			if depth == 0 {
				return j + 1
			}
		}
	}
	return len(sql)
}

// skipDollarQuoted returns the offset after $tag$…$tag$ starting at i, or
// i+1 when i is not the start of one ($1, a lone $).
func skipDollarQuoted(sql string, i int) int {
	j := i + 1
	if j < len(sql) && isIdentStart(sql[j]) {
		for j < len(sql) && isIdent(sql[j]) {
			j++
		}
	}
	if j >= len(sql) || sql[j] != '$' {
		return i + 1
	}
	tag := sql[i : j+1]
	if k := strings.Index(sql[j+1:], tag); k >= 0 {
		return j + 1 + k + len(tag)
	}
	return len(sql)
}

// CheckDriftPlaceholders names the first placeholder of a drift rule's sql
// that is not :due_before or :window_start, with where it is in sql.
func CheckDriftPlaceholders(sql string) error {
	for _, p := range placeholders(sql) {
		if p.name != "due_before" && p.name != "window_start" {
			line, col := lineColumn(sql, utf8.RuneCountInString(sql[:p.start]))
			return fmt.Errorf("unknown placeholder :%s at line %d, column %d of its sql (want :%s)",
				p.name, line, col, strings.Join(placeholderNames, " or :"))
		}
	}
	return nil
}

// ruleText is a rule's SQL with its placeholders bound to parameters, and
// for each character of it the character of the rule's own SQL it came
// from, so that the database's error positions can be placed there.
type ruleText struct {
	sql    string
	origin []int // origin[i]: 0-based character in the rule's SQL of bound character i
}

// bindRule replaces the placeholders of a rule's sql with $dueBefore and
// $windowStart.
func bindRule(sql string, dueBefore, windowStart int) ruleText {
	var b strings.Builder
	var origin []int
	copyText := func(from, to int) {
		base := utf8.RuneCountInString(sql[:from])
		for n := range []rune(sql[from:to]) {
			origin = append(origin, base+n)
		}
		b.WriteString(sql[from:to])
	}
	last := 0
	for _, p := range placeholders(sql) {
		copyText(last, p.start)
		n := windowStart
		if p.name == "due_before" {
			n = dueBefore
		}
		param := fmt.Sprintf("$%d::timestamptz", n)
		at := utf8.RuneCountInString(sql[:p.start])
		for range param {
			origin = append(origin, at)
		}
		b.WriteString(param)
		last = p.end
	}
	copyText(last, len(sql))
	return ruleText{sql: b.String(), origin: origin}
}

// query is SQL that sidefx writes around a rule's: it remembers where each
// copy of the rule's text went.
type query struct {
	b     strings.Builder
	runes int
	uses  []ruleUse
}

type ruleUse struct {
	start int // character of the query where the rule's text starts
	text  ruleText
}

func (q *query) add(s string) *query {
	q.b.WriteString(s)
	q.runes += utf8.RuneCountInString(s)
	return q
}

func (q *query) rule(t ruleText) *query {
	q.uses = append(q.uses, ruleUse{start: q.runes, text: t})
	return q.add(t.sql)
}

func (q *query) String() string { return q.b.String() }

// explain turns the database's error into a message whose position, if it
// has one, is a line and column of the rule's own SQL, ruleSQL.
func (q *query) explain(err error, ruleSQL string) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	if pe.Position <= 0 {
		return pe.Message
	}
	at := int(pe.Position) - 1 // PostgreSQL counts characters from 1
	for _, u := range q.uses {
		if at >= u.start && at < u.start+len(u.text.origin) {
			line, col := lineColumn(ruleSQL, u.text.origin[at-u.start])
			return fmt.Sprintf("%s at line %d, column %d of its sql", pe.Message, line, col)
		}
	}
	// Past a copy of the rule's text, in what sidefx wrote after it: the
	// rule's SQL ends too early (an unclosed parenthesis or quote, a
	// dangling AND).
	for i := len(q.uses) - 1; i >= 0; i-- {
		if at >= q.uses[i].start {
			line, col := lineColumn(ruleSQL, utf8.RuneCountInString(ruleSQL))
			return fmt.Sprintf("%s, after the end of its sql (line %d, column %d)", pe.Message, line, col)
		}
	}
	return pe.Message
}

// lineColumn is the 1-based line and column of the character at 0-based
// offset in s.
func lineColumn(s string, offset int) (line, col int) {
	line, col = 1, 1
	n := 0
	for _, c := range s {
		if n == offset {
			break
		}
		if c == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
		n++
	}
	return line, col
}
