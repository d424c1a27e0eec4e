package pgcluster

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// standby starts a standby of c that is destroyed at the end of the test.
func standby(t *testing.T, c *Cluster, opts *StandbyOptions) *Cluster {
	t.Helper()
	s, err := c.StartStandby(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	return s
}

func mustExec(t *testing.T, connString, query string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// A row committed on the primary is read on the standby, which refuses
// writes; once promoted it takes them.
func TestStandbyStreamsAndPromotes(t *testing.T) {
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("synchronous=%v", sync), func(t *testing.T) {
			p := start(t, nil)
			s := standby(t, p, &StandbyOptions{Synchronous: sync})
			mustExec(t, p.ConnString("postgres"), "CREATE TABLE t (v text); INSERT INTO t VALUES ('committed on the primary')")
			if sync {
				// Synchronous: the commit returned, so the standby has it
				// flushed; with remote_apply it would be visible at once,
				// with on it is visible once replayed.
				got, err := queryString(p.ConnString("postgres"),
					"SELECT sync_state FROM pg_stat_replication WHERE application_name = '"+s.ApplicationName()+"'")
				if err != nil || got != "sync" {
					t.Fatalf("sync_state %q, %v; want sync", got, err)
				}
			}
			waitUntil(t, func() error {
				got, err := queryString(s.ConnString("postgres"), "SELECT v FROM t")
				if err != nil {
					return err
				}
				if got != "committed on the primary" {
					return fmt.Errorf("standby reads %q", got)
				}
				return nil
			})
			if in, err := s.InRecovery(context.Background()); err != nil || !in {
				t.Fatalf("standby in recovery: %v, %v; want true", in, err)
			}
			if _, err := queryString(s.ConnString("postgres"), "INSERT INTO t VALUES ('x') RETURNING v"); err == nil || !strings.Contains(err.Error(), "25006") {
				t.Fatalf("write on the standby: %v; want a read-only error (25006)", err)
			}
			if err := p.Kill(); err != nil {
				t.Fatal(err)
			}
			if err := s.Promote(context.Background()); err != nil {
				t.Fatal(err)
			}
			got, err := queryString(s.ConnString("postgres"), "INSERT INTO t VALUES ('written after promotion') RETURNING v")
			if err != nil || got != "written after promotion" {
				t.Fatalf("write after promotion: %q, %v", got, err)
			}
			// The promoted server is a primary that a standby can follow.
			s2 := standby(t, s, &StandbyOptions{Synchronous: sync})
			waitUntil(t, func() error {
				got, err := queryString(s2.ConnString("postgres"), "SELECT count(*)::text FROM t")
				if err != nil {
					return err
				}
				if got != "2" {
					return fmt.Errorf("second standby reads %s rows", got)
				}
				return nil
			})
		})
	}
}

// Kill leaves the port closed and the postmaster gone, at once; Destroy
// then cleans up.
func TestKill(t *testing.T) {
	c := start(t, nil)
	pid, err := c.postmasterPID()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", c.Port()), time.Second); err == nil {
		conn.Close()
		t.Fatalf("port %d still open after Kill", c.Port())
	}
	if alive(pid) {
		t.Fatalf("postmaster %d alive after Kill", pid)
	}
	if c.Running() {
		t.Fatal("Running after Kill")
	}
	if err := c.Kill(); err == nil {
		t.Fatal("a second Kill: no error")
	}
}

// The multi-host URL reaches the primary, whichever host it is.
func TestMultiHostConnString(t *testing.T) {
	p := start(t, nil)
	s := standby(t, p, nil)
	url := MultiHostConnString("postgres", s, p) // the standby first
	if !strings.Contains(url, "target_session_attrs=read-write") {
		t.Fatalf("url %s", url)
	}
	port := func() string {
		got, err := queryString(url, "SELECT current_setting('port')")
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := port(); got != fmt.Sprint(p.Port()) {
		t.Fatalf("connected to port %s, want the primary's %d", got, p.Port())
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.Promote(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := port(); got != fmt.Sprint(s.Port()) {
		t.Fatalf("connected to port %s, want the promoted standby's %d", got, s.Port())
	}
	// A new standby on the killed primary's port: the same URL follows the
	// next failover.
	s2 := standby(t, s, &StandbyOptions{Port: p.Port()})
	if s2.Port() != p.Port() {
		t.Fatalf("standby on port %d, want %d", s2.Port(), p.Port())
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s2.Promote(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := port(); got != fmt.Sprint(p.Port()) {
		t.Fatalf("connected to port %s, want the second promoted standby's %d", got, p.Port())
	}
}
