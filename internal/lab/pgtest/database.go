package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/migrations"
)

// dbServer hands out databases on one PostgreSQL server, each a clone of a
// template database that holds the migrated schema.
//
// It keeps no connection open between calls: a connection per operation
// costs about a millisecond against a local server, survives Cluster
// restarts, and leaves no pool goroutines behind for leak checkers.
type dbServer struct {
	base     string // connection string of the maintenance database
	template string // name of the migrated template database
	prefix   string // prefix of the names of the databases we create
	seq      atomic.Uint64

	mu       sync.Mutex
	version  int             // server_version_num, once known
	ready    bool            // the template exists and is migrated
	created  map[string]bool // databases we created and have not dropped
	sharedDB string          // the database Tx uses, once created
}

func (s *dbServer) init(base, template, prefix string) {
	s.base, s.template, s.prefix = base, template, prefix
	s.created = make(map[string]bool)
}

// connString is the connection string of database name on the server.
func (s *dbServer) connString(name string) string {
	if strings.HasPrefix(s.base, "postgres://") || strings.HasPrefix(s.base, "postgresql://") {
		if u, err := url.Parse(s.base); err == nil {
			u.Path, u.RawPath = "/"+name, ""
			return u.String()
		}
	}
	// keyword=value form: a later dbname overrides an earlier one. Our
	// names need no quoting.
	return s.base + " dbname=" + name
}

// admin runs f on a new connection to the maintenance database.
func (s *dbServer) admin(ctx context.Context, f func(*pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, s.base)
	if err != nil {
		return fmt.Errorf("pgtest: connecting to the server: %w", err)
	}
	defer conn.Close(context.Background())
	return f(conn)
}

// clone creates a new database from the migrated template, creating the
// template first if needed, and returns its name.
func (s *dbServer) clone(ctx context.Context) (string, error) {
	if err := s.ensureTemplate(ctx); err != nil {
		return "", err
	}
	name := fmt.Sprintf("%s%d", s.prefix, s.seq.Add(1))
	q := "CREATE DATABASE " + name + " TEMPLATE " + s.template
	if s.serverVersion() >= 150000 {
		// FILE_COPY copies the few files of a small template; the default
		// WAL_LOG reads and logs it block by block.
		q += " STRATEGY FILE_COPY"
	}
	err := s.admin(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, q)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("pgtest: %s: %w", q, err)
	}
	s.mu.Lock()
	s.created[name] = true
	s.mu.Unlock()
	return name, nil
}

// drop drops a database, disconnecting whoever is still connected to it.
func (s *dbServer) drop(ctx context.Context, name string) error {
	q := "DROP DATABASE IF EXISTS " + name
	if s.serverVersion() >= 130000 {
		q += " WITH (FORCE)"
	}
	err := s.admin(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, q)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgtest: %s: %w", q, err)
	}
	s.mu.Lock()
	delete(s.created, name)
	if name == s.sharedDB {
		s.sharedDB = ""
	}
	s.mu.Unlock()
	return nil
}

// dropAll drops the template and every database we created that is still
// there. It is for servers that outlive us (SIDEFX_TEST_DATABASE_URL).
func (s *dbServer) dropAll(ctx context.Context) error {
	s.mu.Lock()
	names := make([]string, 0, len(s.created))
	for name := range s.created {
		names = append(names, name)
	}
	s.mu.Unlock()
	var errs []error
	for _, name := range names {
		errs = append(errs, s.drop(ctx, name))
	}
	return errors.Join(errs...)
}

// sharedDatabase returns the name of the database that Tx uses, cloning it
// on first use.
func (s *dbServer) sharedDatabase(ctx context.Context) (string, error) {
	s.mu.Lock()
	name := s.sharedDB
	s.mu.Unlock()
	if name != "" {
		return name, nil
	}
	name, err := s.clone(ctx)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sharedDB == "" {
		s.sharedDB = name
		return name, nil
	}
	// Another Tx won the race; ours goes to waste until dropAll/the end.
	return s.sharedDB, nil
}

func (s *dbServer) serverVersion() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// ensureTemplate creates and migrates the template database unless done.
// A failure is not remembered: the next call tries again, so every test
// shows the error.
func (s *dbServer) ensureTemplate(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ready {
		return nil
	}
	err := s.admin(ctx, func(conn *pgx.Conn) error {
		if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&s.version); err != nil {
			return fmt.Errorf("pgtest: server version: %w", err)
		}
		// Left over from an earlier attempt that failed half-way?
		if err := s.dropTemplate(ctx, conn); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+s.template); err != nil {
			return fmt.Errorf("pgtest: creating the template database: %w", err)
		}
		if err := s.migrate(ctx); err != nil {
			return errors.Join(err, s.dropTemplate(ctx, conn))
		}
		// Nobody connects to the template any more, so nobody can make
		// CREATE DATABASE ... TEMPLATE fail with "source database is being
		// accessed by other users".
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+s.template+" ALLOW_CONNECTIONS false"); err != nil {
			return errors.Join(fmt.Errorf("pgtest: locking the template database: %w", err), s.dropTemplate(ctx, conn))
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.ready = true
	s.created[s.template] = true
	return nil
}

// migrate applies the migrations to the template database.
func (s *dbServer) migrate(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(s.connString(s.template))
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pgtest: connecting to the template database: %w", err)
	}
	// Closed before the first clone: CREATE DATABASE ... TEMPLATE wants no
	// one connected to the template.
	defer pool.Close()
	if err := migrations.Apply(ctx, pool, nil); err != nil {
		return fmt.Errorf("pgtest: migrating the template database: %w", err)
	}
	return nil
}

// dropTemplate drops the template database if it exists; s.mu is held.
func (s *dbServer) dropTemplate(ctx context.Context, conn *pgx.Conn) error {
	q := "DROP DATABASE IF EXISTS " + s.template
	if s.version >= 130000 {
		q += " WITH (FORCE)"
	}
	if _, err := conn.Exec(ctx, q); err != nil {
		return fmt.Errorf("pgtest: dropping the template database: %w", err)
	}
	return nil
}
