package effects

import (
	"unicode/utf8"
)

// JSONProblem returns why PostgreSQL's jsonb would refuse the valid JSON b,
// or "" if it would store it: invalid UTF-8, the escape \u0000, or a UTF-16
// surrogate escape that is not part of a pair.
func JSONProblem(b []byte) string {
	if !utf8.Valid(b) {
		return "is not valid UTF-8"
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 >= len(b) {
			continue
		}
		if b[i+1] != 'u' || i+5 >= len(b) {
			i++ // skip the escaped character (an escaped backslash among them)
			continue
		}
		r, ok := hex4(b[i+2 : i+6])
		switch {
		case !ok:
		case r == 0:
			return `holds the escape \u0000, which PostgreSQL's jsonb cannot store`
		case r >= 0xD800 && r <= 0xDBFF: // high surrogate: a low one must follow
			if i+11 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
				if lo, ok := hex4(b[i+8 : i+12]); ok && lo >= 0xDC00 && lo <= 0xDFFF {
					i += 11
					continue
				}
			}
			return "holds an unpaired UTF-16 surrogate escape, which PostgreSQL's jsonb cannot store"
		case r >= 0xDC00 && r <= 0xDFFF:
			return "holds an unpaired UTF-16 surrogate escape, which PostgreSQL's jsonb cannot store"
		}
		i += 5
	}
	return ""
}

func hex4(b []byte) (rune, bool) {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// MaxOutcomeBytes bounds a stored outcome detail and last_error.
const MaxOutcomeBytes = 64 << 10
