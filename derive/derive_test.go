package derive_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sidefx/sidefx/derive"
)

var updateGolden = flag.Bool("update-golden", false, "add vectors for new inputs to testdata/golden.json (never rewrites an existing one)")

// Vector is one pinned derivation: Func names the function, Args its
// arguments in order, Want its released output.
type Vector struct {
	Func string   `json:"func"`
	Args []string `json:"args"`
	Want string   `json:"want"`
}

const goldenPath = "testdata/golden.json"

// Eval runs the function a vector names.
func eval(t *testing.T, v Vector) string {
	t.Helper()
	switch {
	case v.Func == "Key" && len(v.Args) == 2:
		return derive.Key(v.Args[0], v.Args[1])
	case v.Func == "KeyNS" && len(v.Args) == 3:
		return derive.KeyNS(v.Args[0], v.Args[1], v.Args[2])
	case v.Func == "Child" && len(v.Args) == 2:
		return derive.Child(v.Args[0], v.Args[1])
	case v.Func == "DomainID" && len(v.Args) == 2:
		return derive.DomainID(v.Args[0], v.Args[1]).String()
	case v.Func == "ScopedDomainID" && len(v.Args) == 3:
		return derive.ScopedDomainID(v.Args[0], v.Args[1], v.Args[2]).String()
	case v.Func == "Revision" && len(v.Args) == 2:
		n, err := strconv.Atoi(v.Args[1])
		if err != nil {
			t.Fatalf("golden vector %+v: revision %q is not a number", v, v.Args[1])
		}
		return derive.Revision(v.Args[0], n)
	}
	t.Fatalf("golden vector %+v names no known function", v)
	return ""
}

// goldenInputs are the inputs the golden file must cover. Add here, run with
// -update-golden, commit the file: the old vectors stay as they were.
var goldenInputs = []Vector{
	{Func: "Key", Args: []string{"order-1042", "stripe.payment_intent.create"}},
	{Func: "Key", Args: []string{"order-1042", "email.receipt"}},
	{Func: "Key", Args: []string{"a|b", "c"}},
	{Func: "Key", Args: []string{"a", "b|c"}},
	{Func: "Key", Args: []string{"", ""}},
	{Func: "Key", Args: []string{"ünïcødé-Ω-≈-🙂", "webhook.order_paid"}},
	{Func: "Key", Args: []string{strings.Repeat("x", 255), "kind.with-dash_and.digits9"}},
	{Func: "Key", Args: []string{"evt_1\x00nul", "k"}},
	{Func: "KeyNS", Args: []string{"", "order-1042", "stripe.payment_intent.create"}},
	{Func: "KeyNS", Args: []string{"staging", "order-1042", "stripe.payment_intent.create"}},
	{Func: "KeyNS", Args: []string{"production", "order-1042", "stripe.payment_intent.create"}},
	{Func: "KeyNS", Args: []string{"stag", "ingorder-1042", "stripe.payment_intent.create"}},
	{Func: "Child", Args: []string{"sfx1_0000000000000000000000000000000000000000000000000000000000000000", "create"}},
	{Func: "Child", Args: []string{"sfx1_0000000000000000000000000000000000000000000000000000000000000000", "confirm"}},
	{Func: "Child", Args: []string{"", ""}},
	{Func: "DomainID", Args: []string{"tenant-7", "client-req-123"}},
	{Func: "DomainID", Args: []string{"", ""}},
	{Func: "DomainID", Args: []string{"tenant-7|client", "req-123"}},
	{Func: "Revision", Args: []string{"sfx1_53f13bcacc5f70c75afd9ea0516749690ca2ac75051de363ead26213ce6244f2", "1"}},
	{Func: "Revision", Args: []string{"sfx1_53f13bcacc5f70c75afd9ea0516749690ca2ac75051de363ead26213ce6244f2", "2"}},
	{Func: "Revision", Args: []string{"sfx1_53f13bcacc5f70c75afd9ea0516749690ca2ac75051de363ead26213ce6244f2", "10"}},
	{Func: "Revision", Args: []string{"", "1"}},
	{Func: "ScopedDomainID", Args: []string{"tenant-7", "client-req-123", ""}},
	{Func: "ScopedDomainID", Args: []string{"tenant-7", "client-req-123", "POST /orders"}},
	{Func: "ScopedDomainID", Args: []string{"tenant-7", "client-req-123", "POST /refunds"}},
	{Func: "ScopedDomainID", Args: []string{"", "", "GET /"}},
	{Func: "ScopedDomainID", Args: []string{"tenant-7", "client", "req-123"}},
}

// ReadGolden returns the pinned vectors.
func readGolden(t *testing.T) []Vector {
	t.Helper()
	b, err := os.ReadFile(goldenPath)
	if err != nil && !(os.IsNotExist(err) && *updateGolden) {
		t.Fatalf("read golden vectors: %v", err)
	}
	var vs []Vector
	if len(b) > 0 {
		if err := json.Unmarshal(b, &vs); err != nil {
			t.Fatalf("parse %s: %v", goldenPath, err)
		}
	}
	return vs
}

func sameInput(a, b Vector) bool {
	if a.Func != b.Func || len(a.Args) != len(b.Args) {
		return false
	}
	for i := range a.Args {
		if a.Args[i] != b.Args[i] {
			return false
		}
	}
	return true
}

// Golden vectors are the released keys. If this test fails, the change alters
// keys that providers have already seen: a retry after the upgrade would not
// be recognised as one. Do not edit the file to make it pass.
func TestGoldenVectors(t *testing.T) {
	vs := readGolden(t)
	for _, v := range vs {
		if got := eval(t, v); got != v.Want {
			t.Errorf("%s(%q) = %s, released as %s: a derived key changed", v.Func, v.Args, got, v.Want)
		}
	}
	var missing []Vector
	for _, in := range goldenInputs {
		found := false
		for _, v := range vs {
			found = found || sameInput(in, v)
		}
		if !found {
			in.Want = eval(t, in)
			missing = append(missing, in)
		}
	}
	if len(missing) == 0 {
		if len(vs) < len(goldenInputs) {
			t.Fatalf("golden file has %d vectors, fewer than the %d inputs", len(vs), len(goldenInputs))
		}
		return
	}
	if !*updateGolden {
		t.Fatalf("%d inputs have no golden vector; run go test ./derive -run TestGoldenVectors -update-golden", len(missing))
	}
	b, err := json.MarshalIndent(append(vs, missing...), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(goldenPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goldenPath, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("added %d golden vectors", len(missing))
}

// The SQL functions are checked against the same file (migrations tests).
func TestGoldenFileCoversEveryFunction(t *testing.T) {
	seen := map[string]bool{}
	for _, v := range readGolden(t) {
		seen[v.Func] = true
	}
	for _, f := range []string{"Key", "KeyNS", "Child", "DomainID", "ScopedDomainID", "Revision"} {
		if !seen[f] {
			t.Errorf("no golden vector for %s", f)
		}
	}
}

func TestKey_SeparatorTricksDiffer(t *testing.T) {
	t.Parallel()
	pairs := [][2][3]string{
		{{"", "a|b", "c"}, {"", "a", "b|c"}},
		{{"", "ab", "c"}, {"", "a", "bc"}},
		{{"ns", "a", "b"}, {"", "nsa", "b"}},
		{{"n", "sa", "b"}, {"ns", "a", "b"}},
		{{"", "a\x00", "b"}, {"", "a", "\x00b"}},
	}
	for _, p := range pairs {
		a := derive.KeyNS(p[0][0], p[0][1], p[0][2])
		b := derive.KeyNS(p[1][0], p[1][1], p[1][2])
		if a == b {
			t.Errorf("KeyNS%q and KeyNS%q collide: %s", p[0], p[1], a)
		}
	}
	if derive.Key("a", "b") != derive.KeyNS("", "a", "b") {
		t.Error("Key is not KeyNS with the empty namespace")
	}
	if derive.Child("k", "s") == derive.Key("k", "s") {
		t.Error("Child and Key share a domain")
	}
	if derive.Revision("k", 1) == derive.Child("k", "1") {
		t.Error("Revision and Child share a domain")
	}
	if derive.Revision(derive.Revision("k", 1), 2) == derive.Revision("k", 2) {
		t.Error("revision 2 does not depend on revision 1's key")
	}
}

// ScopedDomainID with an empty scope is the released DomainID, on every
// DomainID golden vector; with a scope it is another id, one per scope.
func TestScopedDomainID_EmptyScopeIsDomainID(t *testing.T) {
	n := 0
	for _, v := range readGolden(t) {
		if v.Func != "DomainID" {
			continue
		}
		n++
		if got := derive.ScopedDomainID(v.Args[0], v.Args[1], "").String(); got != v.Want {
			t.Errorf("ScopedDomainID(%q, %q, \"\") = %s, DomainID released %s", v.Args[0], v.Args[1], got, v.Want)
		}
		orders, refunds := derive.ScopedDomainID(v.Args[0], v.Args[1], "POST /orders"), derive.ScopedDomainID(v.Args[0], v.Args[1], "POST /refunds")
		if orders.String() == v.Want || refunds.String() == v.Want || orders == refunds {
			t.Errorf("scoped ids of %q: %s %s, unscoped %s: want three ids", v.Args, orders, refunds, v.Want)
		}
	}
	if n == 0 {
		t.Fatal("no DomainID golden vector")
	}
}

func TestDomainID_VersionAndVariant(t *testing.T) {
	t.Parallel()
	u := derive.DomainID("t", "c")
	if u[6]>>4 != 8 {
		t.Errorf("version nibble = %x, want 8", u[6]>>4)
	}
	if u[8]>>6 != 2 {
		t.Errorf("variant bits = %b, want 10", u[8]>>6)
	}
	back, err := derive.ParseUUID(u.String())
	if err != nil || back != u {
		t.Fatalf("ParseUUID(%s) = %v, %v", u, back, err)
	}
	for _, bad := range []string{"", "nope", "0123456789abcdef0123456789abcdef0123", "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"} {
		if _, err := derive.ParseUUID(bad); err == nil {
			t.Errorf("ParseUUID(%q) accepted", bad)
		}
	}
}

func TestValid(t *testing.T) {
	t.Parallel()
	if !derive.Valid(derive.Key("s", "k")) {
		t.Error("a derived key is not Valid")
	}
	for _, bad := range []string{"", "sfx1_", "sfx2_" + strings.Repeat("0", 64), "sfx1_" + strings.Repeat("A", 64), "sfx1_" + strings.Repeat("0", 63)} {
		if derive.Valid(bad) {
			t.Errorf("Valid(%q) = true", bad)
		}
	}
}

// checkKey fails unless key is usable as a Stripe Idempotency-Key (≤255),
// an HTTP header value (visible ASCII) and a Standard Webhooks webhook-id.
func checkKey(t *testing.T, key string) {
	t.Helper()
	if len(key) > 80 || !utf8.ValidString(key) || !derive.Valid(key) {
		t.Fatalf("key %q is not a valid derived key", key)
	}
	for _, c := range []byte(key) {
		if c <= 0x20 || c >= 0x7f {
			t.Fatalf("key %q has byte %#x, not a visible ASCII character", key, c)
		}
	}
}

func FuzzKey(f *testing.F) {
	f.Add("", "a|b", "c", "", "a", "b|c")
	f.Add("ns", "a", "b", "", "nsa", "b")
	f.Add("", "order-1", "email.receipt", "", "order-1", "email.receipt")
	f.Add("x", "\x00", "\xff", "x\x00", "", "\xff")
	f.Fuzz(func(t *testing.T, ns1, s1, k1, ns2, s2, k2 string) {
		a, b := derive.KeyNS(ns1, s1, k1), derive.KeyNS(ns2, s2, k2)
		checkKey(t, a)
		checkKey(t, b)
		same := ns1 == ns2 && s1 == s2 && k1 == k2
		if same != (a == b) {
			t.Fatalf("KeyNS(%q,%q,%q)=%s, KeyNS(%q,%q,%q)=%s: same inputs %v but equal keys %v",
				ns1, s1, k1, a, ns2, s2, k2, b, same, a == b)
		}
		c := derive.Child(a, s2)
		checkKey(t, c)
		if c == a {
			t.Fatal("a child key equals its parent")
		}
		if derive.KeyNS(ns1, s1, k1) != a {
			t.Fatal("KeyNS is not deterministic")
		}
	})
}
