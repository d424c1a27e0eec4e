package daemon

import (
	"strconv"
	"unicode"
	"unicode/utf8"
)

// printable is s as the CLI's text output writes a value that a producer,
// an operator or a provider supplied (a source id, a kind, a note, an
// actor, a last error, a reference, a payload): as it is when every
// character of it prints, else as a Go string literal (strconv.Quote:
// "order-1\n\x1b[31m"), so that a newline or a tab cannot break a table
// and an escape sequence never reaches the terminal raw. A value that
// starts with a double quote is quoted too, so a quoted value always
// means one that was escaped. The JSON output holds the values as they
// are.
func printable(s string) string {
	if s != "" && s[0] == '"' {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
