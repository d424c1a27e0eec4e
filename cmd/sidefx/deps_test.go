package main

import (
	"flag"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/internal/lab/godeps"
)

var update = flag.Bool("update", false, "rewrite testdata/modules.txt from what the binary links")

// The sidefx binary is the product alone: no fake provider, no cluster
// launcher, no broker client, no test or demo kit (the demo is its own
// command, cmd/sidefx-demo).
var labRules = godeps.Rules{
	Modules: map[string]string{
		"github.com/nats-io/":              "the demo's broker",
		"github.com/Shopify/toxiproxy/":    "test-only",
		"github.com/chromedp/":             "test-only",
		"go.uber.org/goleak":               "test-only",
		"pgregory.net/rapid":               "test-only",
		"github.com/riverqueue/":           "the benchmarks'",
		"github.com/lib/pq":                "test-only",
		"github.com/prometheus/prometheus": "the alert rules' check",
	},
	Packages: map[string]string{
		"github.com/sidefx/sidefx/internal/lab/":          "test and demo kit",
		"github.com/sidefx/sidefx/providers/providertest": "fake providers, for tests",
		"testing": "test-only code",
	},
}

// TestBinary_LinksNoLab checks, on what go list -deps says the binary
// compiles, that it links none of the lab; and pins the modules it links
// (testdata/modules.txt, rewritten with -update): a new module in the
// product is a decision, made in review, not an accident of an import.
func TestBinary_LinksNoLab(t *testing.T) {
	t.Parallel()
	deps := godeps.Check(t, "github.com/sidefx/sidefx/cmd/sidefx",
		[]string{"github.com/sidefx/sidefx/daemon", "github.com/sidefx/sidefx/dispatcher", "github.com/jackc/pgx/v5"}, labRules)
	mods := map[string]bool{}
	for _, p := range deps {
		if p.Module != "" && p.Module != "github.com/sidefx/sidefx" {
			mods[p.Module] = true
		}
	}
	got := strings.Join(slices.Sorted(maps.Keys(mods)), "\n") + "\n"
	if *update {
		if err := os.WriteFile("testdata/modules.txt", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/modules.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("the binary links these modules:\n%s\ntestdata/modules.txt pins:\n%s\nif the change is meant, rerun with -update and say why in the commit", got, want)
	}
}
