// Package roles is the one source of sidefx's database roles: the
// producer's, the daemon's, the operator's and the viewer's grants, as
// `sidefx roles` applies them and as deploy/postgres/bootstrap.sql and the
// four deploy/postgres/*-role.sql files spell them (go generate
// ./internal/roles rewrites the files; a test checks they are current).
package roles

import (
	"fmt"
	"regexp"
	"strings"
)

//go:generate go run ./gen ../../deploy/postgres

// The four roles.
const (
	Producer = "producer"
	Daemon   = "daemon"
	Operator = "operator"
	Viewer   = "viewer"
)

// Kinds are the four roles, in the order they are created and explained.
var Kinds = []string{Producer, Daemon, Operator, Viewer}

// MinVersion is the schema version the grants need: the last migration
// that added a table or a function they name (0040, sidefx_remake_claim).
const MinVersion = 40

// Options says which roles, in which schema, with what.
type Options struct {
	// Schema holds sidefx's tables: a plain identifier. Default "public".
	Schema string
	// Names names the role of each kind (Producer, …). Default
	// "sidefx_<kind>".
	Names map[string]string
	// Login creates the roles with LOGIN, and gives it to roles that exist
	// without it. Default NOLOGIN: a group for the logins of its members.
	Login bool
	// EdgeOutcome grants the producer SELECT on side_effects, which an edge
	// route that awaits an effect's outcome (edge.RequireOutcome) needs: it
	// shows every effect's payload.
	EdgeOutcome bool
	// ConsoleSettings grants the daemon SELECT on sidefx_settings, with
	// which the console says why a supersede was refused for the payload's
	// size.
	ConsoleSettings bool
}

// Name is the role of kind.
func (o *Options) Name(kind string) string {
	if n := o.Names[kind]; n != "" {
		return n
	}
	return "sidefx_" + kind
}

func (o *Options) schema() string {
	if o.Schema == "" {
		return "public"
	}
	return o.Schema
}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)
	bareRE   = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	schemaRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// reserved are the names PostgreSQL takes for something else where a
	// role is named.
	reserved = map[string]bool{"public": true, "none": true, "current_user": true, "session_user": true, "current_role": true}
	// keywords are words a bare name may not be (ident quotes them).
	keywords = map[string]bool{"user": true, "all": true, "group": true, "role": true, "table": true, "select": true, "grant": true,
		"to": true, "order": true, "default": true, "on": true, "from": true, "with": true, "and": true, "or": true, "not": true,
		"null": true, "current_user": true, "session_user": true, "current_role": true}
)

// Check refuses options the script cannot be made of: a schema that is
// not a plain identifier, a role name that is not a plain name (letters,
// digits, _, - and ., at most 63 bytes, not a name PostgreSQL reserves),
// and two kinds given one role (a viewer that is also the operator could
// act).
func (o *Options) Check() error {
	if s := o.schema(); !schemaRE.MatchString(s) || len(s) > 63 {
		return fmt.Errorf("schema %q is not a plain identifier (letters, digits and _, not starting with a digit, at most 63 bytes)", s)
	}
	seen := map[string]string{}
	for k := range o.Names {
		if !isKind(k) {
			return fmt.Errorf("no role kind %q (producer, daemon, operator, viewer)", k)
		}
	}
	for _, k := range Kinds {
		n := o.Name(k)
		switch {
		case !nameRE.MatchString(n) || len(n) > 63:
			return fmt.Errorf("%s role %q: a role name here is letters, digits, _, - and ., not starting with a digit, at most 63 bytes", k, n)
		case reserved[strings.ToLower(n)] || strings.HasPrefix(strings.ToLower(n), "pg_"):
			return fmt.Errorf("%s role %q: PostgreSQL reserves that name", k, n)
		case seen[n] != "":
			return fmt.Errorf("the %s and %s roles are both %q: each kind needs a role of its own (a viewer or a producer that is also an operator could act)", seen[n], k, n)
		}
		seen[n] = k
	}
	return nil
}

func isKind(k string) bool {
	for _, x := range Kinds {
		if x == k {
			return true
		}
	}
	return false
}

// ident is name as SQL names it: bare when it may be, else quoted.
func ident(name string) string {
	if bareRE.MatchString(name) && !keywords[name] {
		return name
	}
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// literal is s as a SQL string literal (s holds no quote: Check).
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Grants returns kind's grants in o's schema to role (a login or a group),
// each statement on its lines, with the comments that say why: what
// deploy/postgres/<kind>-role.sql holds for public and sidefx_<kind>.
func Grants(o Options, kind, role string) (string, error) {
	if err := o.Check(); err != nil {
		return "", err
	}
	if !isKind(kind) {
		return "", fmt.Errorf("no role kind %q", kind)
	}
	return grants(&o, kind, role), nil
}

func grants(o *Options, kind, role string) string {
	var b strings.Builder
	r := strings.NewReplacer("{{s}}", ident(o.schema()), "{{r}}", ident(role))
	for _, g := range grantsOf[kind] {
		if g.when != nil && !g.when(o) {
			continue
		}
		for _, line := range g.note {
			b.WriteString("-- " + line + "\n")
		}
		b.WriteString(r.Replace(g.sql) + "\n")
	}
	return b.String()
}

// Script returns the whole of what `sidefx roles` runs: each role created
// when it does not exist (NOLOGIN unless o.Login), and its grants. Every
// statement may run again: CREATE ROLE only when the role is missing, and
// a GRANT of what a role holds is no change. It grants, never revokes.
func Script(o Options) (string, error) {
	if err := o.Check(); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- sidefx's roles for schema %s, with every grant their features need.\n", o.schema())
	b.WriteString(scriptHeader)
	b.WriteString(commentBlock(explain(&o)))
	b.WriteString("\nBEGIN;\n")
	for _, k := range Kinds {
		n := o.Name(k)
		fmt.Fprintf(&b, "\n-- The %s role (%s).\n", k, roleFor[k])
		login := "NOLOGIN"
		if o.Login {
			login = "LOGIN"
		}
		fmt.Fprintf(&b, "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = %s) THEN CREATE ROLE %s %s; END IF; END $$;\n",
			literal(n), ident(n), login)
		if o.Login {
			fmt.Fprintf(&b, "ALTER ROLE %s LOGIN;\n", ident(n))
		}
		b.WriteString(grants(&o, k, n))
	}
	b.WriteString("\nCOMMIT;\n")
	return b.String(), nil
}

const scriptHeader = `--
-- Made by ` + "`sidefx roles --print`" + ` (internal/roles; go generate ./internal/roles
-- rewrites deploy/postgres/bootstrap.sql, a test checks it is current).
-- Run it as the schema's owner (the role that ran ` + "`sidefx migrate`" + `), after
-- ` + "`sidefx migrate`" + `, with psql -f; ` + "`sidefx roles`" + ` does the same, for any schema and
-- role names (--producer NAME, …), and first checks the schema is current
-- and that it runs as the owner. It may run again: it creates a role only
-- when it is missing, and grants what is missing. It never revokes.
--
-- The roles are created NOLOGIN: groups. Give one to a login role
-- (GRANT sidefx_operator TO app_ops), or make it a login and set its
-- password in psql (ALTER ROLE sidefx_daemon LOGIN; \password sidefx_daemon),
-- never on a command line. Logins that are members of one producer role
-- are one producer (they cancel each other's effects, share inbox and edge
-- records): make a producer role per service (sidefx roles --producer NAME).
-- Creating roles needs CREATEROLE; roles that exist already need none.
-- Drift rules read your tables: grant SELECT on those their SQL reads to
-- the daemon's role and to the operator's (for sidefx drift run).
--
`

// commentBlock prefixes each line of s with "-- ".
func commentBlock(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString(strings.TrimRight("-- "+line, " ") + "\n")
	}
	return b.String()
}

// File returns deploy/postgres/<kind>-role.sql: kind's grants for schema
// public and role sidefx_<kind>, under the comment that says what the role
// may and may not do.
func File(kind string) (string, error) {
	if !isKind(kind) {
		return "", fmt.Errorf("no role kind %q", kind)
	}
	o := Options{}
	return fileHeader[kind] + "--\n-- Made by go generate ./internal/roles (from internal/roles, as `sidefx\n" +
		"-- roles` grants them; a test checks this file is current). `sidefx roles`,\n" +
		"-- or psql -f deploy/postgres/bootstrap.sql, creates the four roles and\n" +
		"-- grants them in one step.\n\n" + grants(&o, kind, o.Name(kind)), nil
}

// Explain says what each role can and cannot do, one role a paragraph.
func Explain(o Options) string { return explain(&o) }

func explain(o *Options) string {
	var b strings.Builder
	login := "NOLOGIN"
	if o.Login {
		login = "LOGIN"
	}
	fmt.Fprintf(&b, "What each role can and cannot do (created %s):\n", login)
	for _, k := range Kinds {
		can, cannot := abilities[k][0], abilities[k][1]
		switch {
		case k == Producer && o.EdgeOutcome:
			can += "; read every effect, payloads included (--edge-outcome)"
			cannot = strings.Replace(cannot, "read any effect or payload, ", "", 1)
		case k == Daemon && o.ConsoleSettings:
			can += "; read the settings (--console-settings)"
			cannot = strings.Replace(cannot, ", read the settings", "", 1)
		}
		fmt.Fprintf(&b, "%s (%s)\n%s%s", o.Name(k), k, wrap("  can:    ", can), wrap("  cannot: ", cannot))
	}
	return b.String()
}

// wrap writes text after lead, in lines of at most 76 columns, the
// following ones indented as far as lead.
func wrap(lead, text string) string {
	var b strings.Builder
	line := lead
	for _, w := range strings.Fields(text) {
		if len(line)+1+len(w) > 76 && strings.TrimSpace(line) != strings.TrimSpace(lead) {
			b.WriteString(line + "\n")
			line = strings.Repeat(" ", len(lead))
		} else if line != lead {
			line += " "
		}
		line += w
	}
	return b.String() + line + "\n"
}

var roleFor = map[string]string{
	Producer: "your services: outbox, inbox, edge",
	Daemon:   "sidefx run and its console",
	Operator: "the sidefx CLI's commands",
	Viewer:   "dashboards, status, list, inspect",
}

var abilities = map[string][2]string{
	Producer: {
		"enqueue (Go's outbox, sidefx_enqueue…), cancel its own pending effects, read the dispatchers' registry (RequireServed), keep its own inbox and edge records",
		"read any effect or payload, change an effect, read another service's inbox or edge records, the history, settings, evidence or pauses, pause, hold off the daemon's jobs",
	},
	Daemon: {
		"claim, send, record and rescue effects (a dispatcher's columns only), late answers, reap and purge, record heartbeats, kinds, drift and reconciliation runs, evidence, reap inbox and edge records, hold the jobs' locks, act as an operator through the guarded functions (reconciler, console: retry, resolve, cancel, supersede, pause, resume)",
		"enqueue, insert or delete effects, change a key, payload or producer, write the history itself, read the settings, change the schema",
	},
	Operator: {
		"read everything; status, list, inspect, drift list, reconcile list; retry, retry --now, refire, resolve, cancel, supersede, pause, resume through the guarded functions (each writes its history row); drift run (records the run); enqueue and cancel as a producer",
		"UPDATE, INSERT or DELETE side_effects, its history or the pauses, write the drift tables (its drift run goes through a function), change the settings, record evidence, hold the jobs' locks, change the schema",
	},
	Viewer: {
		"read effects, payloads included, their history, pauses, registry, drift and reconciliation runs, evidence: status, list, inspect, drift list, reconcile list",
		"write anything; execute any function that changes state (enqueue, cancel, retry, resolve, pause, …)",
	},
}

// grant is one statement of a role's, with the comment that says why.
// {{s}} stands for the schema, {{r}} for the role.
type grant struct {
	note []string
	sql  string
	when func(*Options) bool
}

const (
	enqueueFns = `{{s}}.sidefx_enqueue(text, text, jsonb, integer, timestamptz),
  {{s}}.sidefx_enqueue_many(text[], text[], jsonb[], integer[], timestamptz[], integer),
  {{s}}.sidefx_enqueue_many_traced(text, text[], text[], jsonb[], integer[], timestamptz[], integer),
  {{s}}.sidefx_enqueue_known(text, text[], text[], jsonb[], integer[], timestamptz[], integer),
  {{s}}.sidefx_cancel(text, text)`
	operatorFns = `{{s}}.sidefx_send_again(text, bigint, integer, boolean, bigint, integer, text, text),
  {{s}}.sidefx_resolve(bigint, text, text, integer, text, text),
  {{s}}.sidefx_cancel_effect(bigint, integer, text, text),
  {{s}}.sidefx_supersede(bigint, jsonb, integer, integer, bytea, text, text),
  {{s}}.sidefx_set_pause(text, text, boolean, text, text),
  {{s}}.sidefx_due_now(bigint[], text[], integer, text, text)`
)

var grantsOf = map[string][]grant{
	Producer: {
		{sql: `GRANT USAGE ON SCHEMA {{s}} TO {{r}};`},
		{note: []string{"Enqueue (Go's outbox on pgx or database/sql, or the SQL functions) and", "cancel: functions that run with their owner's rights."},
			sql: `GRANT EXECUTE ON FUNCTION ` + enqueueFns + ` TO {{r}};`},
		{note: []string{"outbox.Config{RequireServed: true} checks that a live dispatcher serves", "each kind it enqueues: it reads the dispatchers' registry (names, hosts,", "kinds and heartbeats; no effect)."},
			sql: `GRANT SELECT ON {{s}}.sidefx_dispatchers TO {{r}};`},
		{note: []string{"A consumer's inbox (package inbox) and the HTTP edge's keys (package", "edge): row-level security keeps each producer to its own records", "(schema 28); edge.New checks the schema is current."},
			sql: `GRANT SELECT, INSERT, UPDATE ON {{s}}.sidefx_inbox, {{s}}.sidefx_edge_keys TO {{r}};
GRANT SELECT ON {{s}}.sidefx_migrations TO {{r}};`},
		{note: []string{"--edge-outcome: an edge route that awaits an effect's outcome", "(edge.RequireOutcome) reads that effect, and may read every effect's payload."},
			sql: `GRANT SELECT ON {{s}}.side_effects TO {{r}};`, when: func(o *Options) bool { return o.EdgeOutcome }},
	},
	Daemon: {
		{sql: `GRANT USAGE ON SCHEMA {{s}} TO {{r}};`},
		{note: []string{"Claim, send, record and rescue: a dispatcher's columns only; the", "database refuses any change no dispatcher makes (schema 37's guard)."},
			sql: `GRANT SELECT ON {{s}}.side_effects TO {{r}};
GRANT UPDATE (state, attempts, maybe_attempts, last_error, lease_until, claimed_by, fired_at, first_fired_at,
  next_attempt_at, provider_ref, outcome, confirmed_at, outcome_attempt, flag, rescues, updated_at) ON {{s}}.side_effects TO {{r}};`},
		{note: []string{"Reap (finished effects into tombstones) and purge tombstones (schema 34)."},
			sql: `GRANT EXECUTE ON FUNCTION {{s}}.sidefx_reap(bigint, integer), {{s}}.sidefx_purge(bigint, integer) TO {{r}};`},
		{note: []string{"Late answers, each with its history row (schema 37); it never writes the", "history itself."},
			sql: `GRANT SELECT ON {{s}}.side_effect_events TO {{r}};
GRANT EXECUTE ON FUNCTION {{s}}.sidefx_late_answer(bigint, text, text, integer[], boolean, text, jsonb, text, boolean, text,
  boolean, integer, text) TO {{r}};`},
		{note: []string{"After a failover: an answer whose claim the new primary lacks is recorded", "(its claim made again), and a promotion is seen and acted on (schema 40)."},
			sql: `GRANT EXECUTE ON FUNCTION {{s}}.sidefx_remake_claim(bigint, integer, text, text, boolean, text, jsonb),
  {{s}}.sidefx_timeline_seen(text, bigint, boolean, text[], text) TO {{r}};`},
		{note: []string{"/readyz reads the migration versions; the registry holds its heartbeat."},
			sql: `GRANT SELECT ON {{s}}.sidefx_migrations TO {{r}};
GRANT SELECT, INSERT, UPDATE, DELETE ON {{s}}.sidefx_dispatchers TO {{r}};`},
		{note: []string{"Drift runs and their findings, and their pruning."},
			sql: `GRANT SELECT, INSERT, UPDATE, DELETE ON {{s}}.sidefx_drift_runs TO {{r}};
GRANT SELECT, INSERT ON {{s}}.sidefx_drift_findings TO {{r}};
GRANT EXECUTE ON FUNCTION {{s}}.sidefx_drift_by_hand(text, timestamptz, integer, jsonb, jsonb) TO {{r}};`},
		{note: []string{"The reaper locks what it deletes (FOR UPDATE SKIP LOCKED: it never waits", "on a consumer's transaction), which needs UPDATE on a column (schema 29)."},
			sql: `GRANT SELECT, DELETE, UPDATE (expires_at) ON {{s}}.sidefx_inbox TO {{r}};
GRANT SELECT, DELETE, UPDATE (expires_at) ON {{s}}.sidefx_edge_keys TO {{r}};`},
		{note: []string{"The providers' evidence and reconciliation runs."},
			sql: `GRANT SELECT, INSERT, DELETE ON {{s}}.sidefx_evidence TO {{r}};
GRANT SELECT, INSERT, UPDATE, DELETE ON {{s}}.sidefx_reconcile_runs TO {{r}};
GRANT SELECT, INSERT ON {{s}}.sidefx_reconcile_findings TO {{r}};`},
		{note: []string{"The pauses it honours, and the kinds it serves (which producers check", "kinds against)."},
			sql: `GRANT SELECT ON {{s}}.sidefx_pauses TO {{r}};
GRANT SELECT, INSERT, UPDATE ON {{s}}.sidefx_kinds TO {{r}};`},
		{note: []string{"The maintenance jobs' exclusion (schema 36): rescue and reaping lock", "their row for their transaction, drift and reconciliation lease theirs.", "The daemons alone hold it: a role that can lock these rows can hold the", "jobs off."},
			sql: `GRANT SELECT, INSERT, UPDATE ON {{s}}.sidefx_locks TO {{r}};`},
		{note: []string{"The operators' actions (each checks its guard and records itself in the", "history or the pause log): the reconciler resolves with them, the web", "console retries, resolves, cancels, supersedes, pauses and resumes with", "them."},
			sql: `GRANT EXECUTE ON FUNCTION ` + operatorFns + ` TO {{r}};`},
		{note: []string{"--console-settings: the console says why a supersede was refused for the", "payload's size."},
			sql: `GRANT SELECT ON {{s}}.sidefx_settings TO {{r}};`, when: func(o *Options) bool { return o.ConsoleSettings }},
	},
	Operator: {
		{sql: `GRANT USAGE ON SCHEMA {{s}} TO {{r}};`},
		{note: []string{"It reads everything sidefx keeps: status, list, inspect, drift list,", "reconcile list."},
			sql: `GRANT SELECT ON {{s}}.side_effects, {{s}}.side_effect_events, {{s}}.sidefx_settings, {{s}}.sidefx_migrations,
  {{s}}.sidefx_dispatchers, {{s}}.sidefx_kinds, {{s}}.sidefx_pauses, {{s}}.sidefx_pause_log,
  {{s}}.sidefx_drift_runs, {{s}}.sidefx_drift_findings, {{s}}.sidefx_evidence,
  {{s}}.sidefx_reconcile_runs, {{s}}.sidefx_reconcile_findings, {{s}}.sidefx_inbox, {{s}}.sidefx_edge_keys TO {{r}};`},
		{note: []string{"It enqueues and cancels as a producer does (sidefx enqueue, cancel --source)."},
			sql: `GRANT EXECUTE ON FUNCTION ` + enqueueFns + ` TO {{r}};`},
		{note: []string{"retry, refire, resolve, cancel, supersede, pause and resume: each function", "checks its action's guard and writes the history (or pause log) row."},
			sql: `GRANT EXECUTE ON FUNCTION ` + operatorFns + ` TO {{r}};`},
		{note: []string{"sidefx drift run records its run and findings through a function", "(schema 39): a finished run by hand, with no tick (it claims no scheduled", "run's), touching no other run. It writes no drift table: it cannot", "rewrite, forge, lock or delete the daemon's runs."},
			sql: `GRANT EXECUTE ON FUNCTION {{s}}.sidefx_drift_by_hand(text, timestamptz, integer, jsonb, jsonb) TO {{r}};`},
	},
	Viewer: {
		{sql: `GRANT USAGE ON SCHEMA {{s}} TO {{r}};`},
		{note: []string{"It reads what an operator reads but the settings and the inbox's and", "edge's records; it writes nothing and executes no function of sidefx's."},
			sql: `GRANT SELECT ON {{s}}.side_effects, {{s}}.side_effect_events, {{s}}.sidefx_migrations, {{s}}.sidefx_dispatchers,
  {{s}}.sidefx_kinds, {{s}}.sidefx_pauses, {{s}}.sidefx_pause_log, {{s}}.sidefx_drift_runs, {{s}}.sidefx_drift_findings,
  {{s}}.sidefx_evidence, {{s}}.sidefx_reconcile_runs, {{s}}.sidefx_reconcile_findings TO {{r}};`},
	},
}

// Files returns deploy/postgres's generated files by name: bootstrap.sql
// (Script for schema public and the default names) and <kind>-role.sql.
func Files() (map[string]string, error) {
	out := map[string]string{}
	s, err := Script(Options{})
	if err != nil {
		return nil, err
	}
	out["bootstrap.sql"] = s
	for _, k := range Kinds {
		f, err := File(k)
		if err != nil {
			return nil, err
		}
		out[k+"-role.sql"] = f
	}
	return out, nil
}
