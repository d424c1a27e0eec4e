package daemon

import (
	"context"
	"fmt"

	"github.com/sidefx/sidefx/migrations"
)

func migrateCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("migrate", io)
	namespace := fs.String("namespace", "", "key namespace to set (only while side_effects is empty; default: the config's)")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := c.loadConfig(io)
	if err != nil {
		return err
	}
	if *namespace == "" && cfg != nil {
		*namespace = cfg.Namespace
	}
	pool, store, err := c.open(ctx, io)
	if err != nil {
		return err
	}
	defer pool.Close()
	mc := &migrations.Config{Schema: store.Schema(), Namespace: *namespace}
	_, missing, err := migrations.Status(ctx, pool, mc)
	if err != nil {
		return err
	}
	if err := migrations.Apply(ctx, pool, mc); err != nil {
		return err
	}
	if len(missing) == 0 {
		fmt.Fprintf(io.Out, "schema %s is current (version %d)\n", store.Schema(), migrations.Latest())
		return nil
	}
	fmt.Fprintf(io.Out, "applied versions %v to schema %s; now at version %d\n", missing, store.Schema(), migrations.Latest())
	return nil
}
