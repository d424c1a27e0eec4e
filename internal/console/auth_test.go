package console

import "testing"

// Where to go after signing in is a clean path of the console: whatever a
// browser could read as another host is "/".
func TestSafeNext_OnlyAPathOfTheConsole(t *testing.T) {
	t.Parallel()
	hostile := []string{
		"",
		"effects",
		" /effects",
		"/\t/evil.example",
		"/\n/evil.example",
		"/\r\n/evil.example",
		"/\x00/evil.example",
		"/\x7f/evil.example",
		"/%09/evil.example",
		"/%0a/evil.example",
		"/%0D%0A/evil.example",
		"/%00",
		"/%7f/evil.example",
		"/\\evil.example",
		"/\\/evil.example",
		"\\\\evil.example",
		"/%5Cevil.example",
		"/%5c%5cevil.example",
		"//evil.example",
		"///evil.example",
		"/%2F%2Fevil.example",
		"/%2fevil.example/%2f%2fx",
		"/effects//x",
		"https://evil.example",
		"https:/evil.example",
		"javascript:alert(1)",
		"/x?a=%0a",
		"/100%",
		"/login",
		"/login?next=//evil.example",
		"/login/",
		"/effects/../login",
		"/./login",
	}
	for _, next := range hostile {
		if got := safeNext(next); got != "/" {
			t.Errorf("safeNext(%q) = %q, want \"/\"", next, got)
		}
	}
	for _, next := range []string{
		"/",
		"/effects?state=uncertain",
		"/effects/42",
		"/effects?kind=email.receipt&state=failed&after=100",
		"/bulk?action=refire&state=failed",
		"/runs#drift",
		"/effects?key=sfx1_a%2Fb",
	} {
		if got := safeNext(next); got != next {
			t.Errorf("safeNext(%q) = %q, want it kept", next, got)
		}
	}
}
