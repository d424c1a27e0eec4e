package engine_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// bundle holds a fresh database, its read and operator API and its engine.
type bundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	store *engine.Store
	eng   *engine.Engine
}

func setup(t *testing.T) bundle {
	t.Helper()
	pool := pgtest.DB(t)
	return bundleOn(t, pool, pool)
}

// bundleOn is the bundle whose pool and store are on pool and whose engine
// is on eng.
func bundleOn(t *testing.T, pool, eng *pgxpool.Pool) bundle {
	t.Helper()
	st, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(eng, "")
	if err != nil {
		t.Fatal(err)
	}
	return bundle{ctx: context.Background(), pool: pool, store: st, eng: e}
}

func insert(t *testing.T, b bundle, items ...effects.NewEffect) []effects.Inserted {
	t.Helper()
	res, err := b.store.Insert(b.ctx, items, 0, "")
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
	return res
}

func TestNew_RejectsBadSchema(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"a-b", `x"; drop table y; --`, "1abc"} {
		if _, err := engine.New(nil, s); err == nil {
			t.Errorf("schema %q accepted", s)
		}
	}
}
