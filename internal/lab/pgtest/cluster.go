package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sidefx/sidefx/internal/lab/pgcluster"
)

// opTimeout bounds every single step pgtest takes on a server (initdb and
// start, stop, CREATE DATABASE, ...), so that a wedged server fails the test
// instead of hanging it until the go test -timeout.
const opTimeout = 2 * time.Minute

// Cluster is a server of one's own, for tests that kill or restart
// PostgreSQL. It lives in a temporary directory and is stopped and removed in
// t.Cleanup, or by a watchdog process if the test binary dies first.
type Cluster struct {
	db dbServer

	// Nil for a server given by SIDEFX_TEST_DATABASE_URL; pgtest neither
	// starts nor stops that one.
	pg *pgcluster.Cluster
}

// NewCluster starts a PostgreSQL server of the test's own, on a fresh port
// and a fresh temporary data directory. It is stopped and removed in
// t.Cleanup, and by a watchdog process if the test binary dies first.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	c, err := newCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.destroy(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// URL creates a fresh database on c, cloned from c's migrated template
// (which is created on first use), and returns its connection string. The
// database is dropped in t.Cleanup if c is running then.
func (c *Cluster) URL(t testing.TB) string {
	t.Helper()
	return c.db.connString(c.newDatabase(t))
}

// Port is the TCP port c listens on, on 127.0.0.1. It stays the same across
// Stop and Start.
func (c *Cluster) Port() int {
	return c.pg.Port()
}

// Stop shuts c down with pg_ctl stop -m mode, mode being "fast" (roll back
// and disconnect the sessions, checkpoint) or "immediate" (abort, like a
// crash: the next Start runs crash recovery). It waits until the server is
// gone.
func (c *Cluster) Stop(t testing.TB, mode string) {
	t.Helper()
	if mode != "fast" && mode != "immediate" {
		t.Fatalf("pgtest: Cluster.Stop: mode %q, want \"fast\" or \"immediate\"", mode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := c.pg.Stop(ctx, mode); err != nil {
		t.Fatal(err)
	}
}

// Start starts c again after Stop, on the same port and data directory, and
// waits until it accepts connections.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := c.pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
}

// Restart is Stop(t, mode) followed by Start(t).
func (c *Cluster) Restart(t testing.TB, mode string) {
	t.Helper()
	c.Stop(t, mode)
	c.Start(t)
}

// running reports whether c's server should be reachable.
func (c *Cluster) running() bool {
	return c.pg == nil || c.pg.Running()
}

// newDatabase clones the template into a new database and drops it in
// t.Cleanup, unless the server is down by then.
func (c *Cluster) newDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	name, err := c.db.clone(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !c.running() {
			return // stopped by the test; the whole cluster goes soon
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := c.db.drop(ctx, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return name
}

// newCluster starts a server of pgcluster's, with pgcluster's fast default
// settings, in a new pgtest-* temporary directory.
func newCluster() (*Cluster, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	pg, err := pgcluster.Start(ctx, &pgcluster.Options{Name: "pgtest"})
	if errors.Is(err, pgcluster.ErrNoBinaries) {
		// Its text ends with the ways out; tests have one more.
		return nil, fmt.Errorf("%w, or set SIDEFX_TEST_DATABASE_URL to the URL of a running server to use instead", err)
	}
	if err != nil {
		return nil, err
	}
	// Past its first timeline, as a server promoted once: a test of what
	// a dispatcher does after a promotion can then say an earlier timeline
	// was seen (sidefx_timeline_seen refuses timelines the server never
	// had).
	if err := pg.NewTimeline(ctx); err != nil {
		return nil, errors.Join(err, pg.Destroy())
	}
	c := &Cluster{pg: pg}
	c.db.init(pg.ConnString("postgres"), "sidefx_template", fmt.Sprintf("sidefx_test_%d_", os.Getpid()))
	return c, nil
}

// destroy stops the server and removes its directory. For an external
// server it drops the databases pgtest made there that are still known.
func (c *Cluster) destroy() error {
	if c.pg == nil {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		return c.db.dropAll(ctx)
	}
	return c.pg.Destroy()
}
