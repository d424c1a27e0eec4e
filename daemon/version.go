package daemon

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/sidefx/sidefx/migrations"
)

// commit is the VCS revision the build was made from, set at build time
// with -ldflags "-X github.com/sidefx/sidefx/daemon.commit=…" (make release
// does, with version); "" when not stamped.
var commit = ""

// Commit returns the VCS revision the build was made from: the one set at
// build time, else the one go build recorded in a git clone (with
// ", modified" when the tree had changes), else "".
func Commit() string {
	if commit != "" {
		return commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" && dirty {
		return rev + ", modified"
	}
	return rev
}

// Version returns the build's version: the one set at build time
// (-ldflags "-X github.com/sidefx/sidefx/daemon.version=v1.2.3"), else the
// module version go install recorded (go install …/cmd/sidefx@v1.2.3), else
// "dev" with the VCS revision when the build recorded one.
func Version() string {
	if version != "dev" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version
	}
	for _, dep := range append([]*debug.Module{&bi.Main}, bi.Deps...) {
		if dep.Path == "github.com/sidefx/sidefx" && dep.Version != "" && dep.Version != "(devel)" {
			return dep.Version
		}
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	switch {
	case rev != "" && dirty:
		return "dev (" + rev + ", modified)"
	case rev != "":
		return "dev (" + rev + ")"
	}
	return version
}

func versionCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("version", io)
	if err := parse(fs, args); err != nil {
		return err
	}
	v := Version()
	if v == "dev" {
		// go run, go test, or go build -buildvcs=false: neither a module
		// version nor a commit was stamped. Say so rather than a bare "dev".
		v = "dev, no version or commit stamped (go run and go test never stamp one; go build in a git clone does, unless -buildvcs=false, in GOFLAGS too: build with go build -buildvcs=true ./cmd/sidefx)"
	}
	build := runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH
	if c := Commit(); c != "" && !strings.HasPrefix(v, "dev (") {
		// A stamped or module version: the commit beside it ("dev (…)"
		// names it already).
		build = "commit " + c + ", " + build
	}
	fmt.Fprintf(io.Out, "sidefx %s (%s)\n", v, build)
	fmt.Fprintf(io.Out, "schema version %d (the migrations this build applies)\n", migrations.Latest())
	// The database's, when one is named: never required.
	if c.configPath == "" && c.databaseURL == "" && io.Getenv("SIDEFX_DATABASE_URL") == "" {
		return nil
	}
	pool, store, err := c.open(ctx, io)
	if err != nil {
		fmt.Fprintf(io.Out, "database: not reached (%v)\n", err)
		return nil
	}
	defer pool.Close()
	applied, missing, err := migrations.Status(ctx, pool, &migrations.Config{Schema: store.Schema()})
	switch {
	case err != nil:
		fmt.Fprintf(io.Out, "database: schema %s not read (%v)\n", store.Schema(), err)
	case len(applied) == 0:
		fmt.Fprintf(io.Out, "database: schema %s has no sidefx tables: run sidefx migrate\n", store.Schema())
	case migrations.CheckNotNewer(store.Schema(), applied) != nil:
		fmt.Fprintf(io.Out, "database: schema %s at version %d, newer than this sidefx: upgrade sidefx\n", store.Schema(), applied[len(applied)-1])
	case len(missing) > 0:
		fmt.Fprintf(io.Out, "database: schema %s at version %d, behind: run sidefx migrate (missing %s)\n", store.Schema(), applied[len(applied)-1], ints(missing))
	default:
		fmt.Fprintf(io.Out, "database: schema %s at version %d, current\n", store.Schema(), applied[len(applied)-1])
	}
	return nil
}

func ints(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}
