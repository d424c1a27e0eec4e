package daemon

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	goio "io"
	"os"
	"strings"
	"time"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// opFlags are the flags of the operators' commands.
type opFlags struct {
	note, actor string
	noNote      bool
}

func addOpFlags(fs *flag.FlagSet) *opFlags {
	o := &opFlags{}
	fs.StringVar(&o.note, "note", "", "why (recorded with the action: in the effect's history, or the pause log); required, unless --no-note")
	fs.BoolVar(&o.noNote, "no-note", false, "act without a note (the history records none): what --note is for, said explicitly")
	fs.StringVar(&o.actor, "actor", "", "who acts (recorded; default user@host)")
	return o
}

// checkNote refuses a command that changes an effect with neither --note
// nor --no-note, as the console refuses an action without a note: an
// action's history says who did it and why.
func (o *opFlags) checkNote(cmd string) error {
	o.note = strings.TrimSpace(o.note)
	switch {
	case o.note != "" && o.noNote:
		return usageErr("%s: give --note WHY or --no-note, not both", cmd)
	case o.note == "" && !o.noNote:
		return usageErr("%s needs --note WHY (recorded in the effect's history: why it was done), or --no-note to act without one", cmd)
	}
	return nil
}

// needNote refuses a command that always records why (pause, resume, a
// bulk action) without --note; --no-note is refused there.
func (o *opFlags) needNote(cmd string) error {
	o.note = strings.TrimSpace(o.note)
	switch {
	case o.noNote:
		return usageErr("%s always records why: give --note WHY (--no-note is not accepted)", cmd)
	case o.note == "":
		return usageErr("%s needs --note WHY (recorded with the action)", cmd)
	}
	return nil
}

func (o *opFlags) action() effects.By {
	return effects.By{Actor: actor(o.actor), Note: o.note}
}

// target opens the database and finds the effect the one argument names.
func target(ctx context.Context, io *IO, c *common, fs *flag.FlagSet) (*engine.Store, *effects.Effect, func(), error) {
	ref, err := oneArg(fs, "effect id or key")
	if err != nil {
		return nil, nil, nil, err
	}
	pool, store, err := c.open(ctx, io)
	if err != nil {
		return nil, nil, nil, err
	}
	e, err := lookup(ctx, store, ref)
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return store, e, pool.Close, nil
}

// act performs r on e through the operations API, the console's too: the
// configuration's key windows and payload checks, the state rules, one
// history entry with the operator's actor and note.
func act(ctx context.Context, io *IO, c *common, store *engine.Store, e *effects.Effect, r admin.Request, op *opFlags) (*effects.Effect, error) {
	o, err := newOps(io, c, store)
	if err != nil {
		return nil, err
	}
	r.Actor, r.Note = actor(op.actor), op.note
	return o.Apply(ctx, e, r)
}

// apply performs r on the effect the command's one argument names.
func apply(ctx context.Context, io *IO, c *common, fs *flag.FlagSet, r admin.Request, op *opFlags) (*effects.Effect, error) {
	store, e, done, err := target(ctx, io, c, fs)
	if err != nil {
		return nil, err
	}
	defer done()
	return act(ctx, io, c, store, e, r, op)
}

// report says what an operator's command did to e and the state it is in
// now, unless the verb says that already ("cancelled").
func report(io *IO, verb string, e *effects.Effect) {
	if verb == string(e.State) {
		fmt.Fprintf(io.Out, "effect %d (%s %s): %s\n", e.ID, printable(e.Kind), printable(e.SourceID), verb)
		return
	}
	fmt.Fprintf(io.Out, "effect %d (%s %s): %s, now %s\n", e.ID, printable(e.Kind), printable(e.SourceID), verb, e.State)
}

func retryCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("retry", io)
	attempts := fs.Int("attempts", 5, "attempts granted beyond those made")
	past := fs.Bool("past-key-window", false, "send it although its provider's key window has passed: it may be performed twice")
	now := fs.Bool("now", false, "a pending effect backing off after an attempt (its provider recovered): make it due now; a failed one is retried as without it")
	op := addOpFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *attempts < 1 {
		return usageErr("--attempts %d: want 1 or more", *attempts)
	}
	if err := op.checkNote("retry"); err != nil {
		return err
	}
	store, e, done, err := target(ctx, io, c, fs)
	if err != nil {
		return err
	}
	defer done()
	was := e.NextAttemptAt
	pending := e.State == effects.Pending
	e, err = act(ctx, io, c, store, e, admin.Request{Action: admin.Retry, Attempts: *attempts, PastKeyWindow: *past, Now: *now}, op)
	if err != nil {
		return err
	}
	if *now && pending {
		report(io, fmt.Sprintf("due now (its next attempt was at %s)", was.UTC().Format(time.RFC3339)), e)
		return nil
	}
	report(io, "retried", e)
	return nil
}

func resolveCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("resolve", io)
	as := fs.String("as", "", "confirmed (it happened) or failed (it did not)")
	ref := fs.String("ref", "", "with --as confirmed: the provider's reference")
	refire := fs.Bool("refire", false, "call the provider again instead: accepts that the effect may happen twice")
	attempts := fs.Int("attempts", 1, "with --refire: attempts granted")
	past := fs.Bool("past-key-window", false, "with --refire: send it although its provider's key window has passed: it may be performed twice")
	op := addOpFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *refire == (*as != "") {
		return usageErr("give --as confirmed|failed, or --refire")
	}
	if err := op.checkNote("resolve"); err != nil {
		return err
	}
	if *refire {
		if *attempts < 1 {
			return usageErr("--attempts %d: want 1 or more", *attempts)
		}
		e, err := apply(ctx, io, c, fs, admin.Request{Action: admin.Refire, Attempts: *attempts, PastKeyWindow: *past}, op)
		if err != nil {
			return err
		}
		report(io, "re-fired (a duplicate is possible)", e)
		return nil
	}
	to, err := effects.ParseState(*as)
	if err != nil || (to != effects.Confirmed && to != effects.Failed) {
		return usageErr("--as %q: want confirmed or failed", *as)
	}
	e, err := apply(ctx, io, c, fs, admin.Request{Action: admin.Resolve, As: to, Ref: *ref}, op)
	if err != nil {
		return err
	}
	report(io, "resolved", e)
	return nil
}

func cancelCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("cancel", io)
	source := fs.String("source", "", "the source id of the effect")
	kind := fs.String("kind", "", "with --source: the kind of the effect")
	op := addOpFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := op.checkNote("cancel"); err != nil {
		return err
	}
	if *source != "" {
		if *kind == "" || fs.NArg() != 0 {
			return usageErr("--source needs --kind and no id")
		}
		pool, store, err := c.open(ctx, io)
		if err != nil {
			return err
		}
		defer pool.Close()
		e, err := store.GetBySource(ctx, *source, *kind)
		if err != nil {
			return err
		}
		if e, err = act(ctx, io, c, store, e, admin.Request{Action: admin.Cancel}, op); err != nil {
			return err
		}
		report(io, "cancelled", e)
		return nil
	}
	e, err := apply(ctx, io, c, fs, admin.Request{Action: admin.Cancel}, op)
	if err != nil {
		return err
	}
	report(io, "cancelled", e)
	return nil
}

func supersedeCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("supersede", io)
	payload := fs.String("payload", "", "the corrected payload, a JSON object")
	payloadFile := fs.String("payload-file", "", "read the corrected payload from `file` (- for standard input)")
	attempts := fs.Int("attempts", 5, "attempts granted beyond those made")
	expect := fs.String("expect-hash", "", "the payload hash (`hex`, as inspect shows it) of the payload the correction was written from: refused if the effect's is another by now (default: the effect's when the command starts)")
	op := addOpFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *attempts < 1 {
		return usageErr("--attempts %d: want 1 or more", *attempts)
	}
	if (*payload == "") == (*payloadFile == "") {
		return usageErr("give the corrected payload with --payload JSON or --payload-file FILE")
	}
	if err := op.checkNote("supersede"); err != nil {
		return err
	}
	var from *effects.Version
	if *expect != "" {
		h, err := effects.ParsePayloadHash(*expect)
		if err != nil {
			return usageErr("--expect-hash: %v", err)
		}
		from = &effects.Version{PayloadHash: h}
	}
	body := []byte(*payload)
	if *payloadFile != "" {
		var err error
		if body, err = readPayloadFile(io, *payloadFile); err != nil {
			return err
		}
	}
	store, e, done, err := target(ctx, io, c, fs)
	if err != nil {
		return err
	}
	defer done()
	// The operations API checks the correction as the provider would before
	// sending it, when the configuration names the kind: it must not fail
	// the same way.
	cfg, err := c.loadConfig(io)
	if err != nil {
		return err
	}
	if cfg != nil && !cfg.HasKind(e.Kind) {
		fmt.Fprintf(io.Err, "note: kind %s is not in the configuration; the payload was not checked against its provider\n", printable(e.Kind))
	}
	// The correction replaces the payload the operator read (--expect-hash),
	// at the revision read now, else the effect as read now: the database
	// refuses it if the effect changed since.
	if from != nil {
		from.Revision = e.Revision
	}
	old := e.Key
	e, err = act(ctx, io, c, store, e, admin.Request{Action: admin.Supersede, Payload: json.RawMessage(body), Attempts: *attempts, From: from}, op)
	if err != nil {
		return err
	}
	report(io, fmt.Sprintf("superseded (revision %d, key %s replaces %s; payload hash %x)", e.Revision, e.Key, old, e.PayloadHash), e)
	return nil
}

// readPayloadFile reads a payload from path, or standard input for "-".
func readPayloadFile(io *IO, path string) ([]byte, error) {
	var r goio.Reader = io.In
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := goio.ReadAll(goio.LimitReader(r, maxLine+1))
	if err != nil {
		return nil, fmt.Errorf("read the payload: %w", err)
	}
	if len(b) > maxLine {
		return nil, fmt.Errorf("the payload in %s is longer than %d bytes", path, maxLine)
	}
	return b, nil
}
