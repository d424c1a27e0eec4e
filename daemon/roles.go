package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/roles"
	"github.com/sidefx/sidefx/migrations"
)

// rolesCmd creates (when missing) and grants the producer's, the daemon's,
// the operator's and the viewer's roles for a schema, as its owner, after
// sidefx migrate. --print writes the SQL instead; --explain says what each
// role can and cannot do.
func rolesCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("roles", io)
	o := roles.Options{Names: map[string]string{}}
	names := map[string]*string{}
	for _, k := range roles.Kinds {
		names[k] = fs.String(k, "", "the "+k+" role's `name` (default sidefx_"+k+")")
	}
	fs.BoolVar(&o.Login, "login", false, "create the roles with LOGIN (and give it to those that exist); default NOLOGIN: groups to grant to login roles. "+
		"Set a password in psql (\\password ROLE), never on a command line")
	fs.BoolVar(&o.EdgeOutcome, "edge-outcome", false, "grant the producer read access to side_effects (every effect's payload), which edge.RequireOutcome reads")
	fs.BoolVar(&o.ConsoleSettings, "console-settings", false, "grant the daemon read access to sidefx_settings, for the console to say why a supersede was refused for its size")
	print := fs.Bool("print", false, "print the SQL, run nothing (psql -f it as the schema's owner)")
	dryRun := fs.Bool("dry-run", false, "the same as --print")
	explain := fs.Bool("explain", false, "say what each role can and cannot do, run nothing")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("roles takes no arguments, got %q", fs.Args())
	}
	for k, n := range names {
		if *n != "" {
			o.Names[k] = *n
		}
	}
	cfg, err := c.loadConfig(io)
	if err != nil {
		return err
	}
	o.Schema = c.schema
	if o.Schema == "" && cfg != nil {
		o.Schema = cfg.Schema
	}
	if err := o.Check(); err != nil {
		return usageErr("roles: %v", err)
	}
	if *explain {
		fmt.Fprint(io.Out, roles.Explain(o))
		return nil
	}
	script, err := roles.Script(o)
	if err != nil {
		return usageErr("roles: %v", err)
	}
	if *print || *dryRun {
		fmt.Fprint(io.Out, script)
		return nil
	}

	pool, store, err := c.open(ctx, io)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := store.Schema()
	// The schema is current: the grants name every table and function of
	// the latest migrations.
	applied, missing, err := migrations.Status(ctx, pool, &migrations.Config{Schema: schema})
	if err != nil {
		return fmt.Errorf("roles: %w", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("roles: %w (as the schema's owner), then sidefx roles", &migrations.SchemaBehindError{Schema: schema, Applied: applied, Missing: missing})
	}
	// It runs as the tables' owner (the role that ran sidefx migrate): no
	// other role may grant on them.
	owner, me, owns, err := engine.TableOwner(ctx, pool, schema)
	if err != nil {
		return fmt.Errorf("roles: %w", err)
	}
	if !owns {
		return fmt.Errorf("roles: connected as %s, which does not own schema %s's tables: run sidefx roles as %s, the role that ran sidefx migrate (or print the SQL with --print for it to run)",
			printable(me), schema, printable(owner))
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The script's own BEGIN and COMMIT are for psql: this transaction
		// holds every statement.
		body := strings.TrimSuffix(strings.Replace(script, "\nBEGIN;\n", "\n", 1), "\nCOMMIT;\n")
		_, err := tx.Exec(ctx, body)
		return err
	})
	if err != nil {
		if pe, ok := engine.PgErrorOf(err); ok && pe.Code == "42501" && strings.Contains(pe.Message, "create role") {
			return errors.New("roles: " + pe.Message + ": creating a role needs CREATEROLE; have a role that has it create them (CREATE ROLE NAME NOLOGIN), then run sidefx roles again")
		}
		return fmt.Errorf("roles: %w", err)
	}
	fmt.Fprintf(io.Out, "roles %s, %s, %s and %s ready for schema %s (created when missing; granted what they lacked)\n\n",
		o.Name(roles.Producer), o.Name(roles.Daemon), o.Name(roles.Operator), o.Name(roles.Viewer), schema)
	fmt.Fprint(io.Out, roles.Explain(o))
	if !o.Login {
		fmt.Fprintln(io.Out, "\nThey are NOLOGIN groups: GRANT one to a login role, or ALTER ROLE NAME LOGIN and set its password in psql (\\password NAME).")
	}
	return nil
}
