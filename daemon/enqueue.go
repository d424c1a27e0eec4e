package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/outbox"
)

// line is one JSON line of enqueue --from.
type line struct {
	SourceID    string          `json:"source_id"`
	Kind        string          `json:"kind"`
	Payload     json.RawMessage `json:"payload"`
	MaxAttempts int             `json:"max_attempts"`
	NotBefore   time.Time       `json:"not_before"`
}

// maxLine bounds one input line: the payload limit and room for the rest.
const maxLine = outbox.DefaultMaxPayloadBytes + 64<<10

func enqueueCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("enqueue", io)
	source := fs.String("source", "", "source id of the one effect to enqueue")
	kind := fs.String("kind", "", "kind of the one effect to enqueue")
	payload := fs.String("payload", "", "payload of the one effect, a JSON object (with --config, checked as its kind's provider will send it; without, only when dispatched)")
	from := fs.String("from", "", "read effects as JSON lines from `file` (- for standard input)")
	batch := fs.Int("batch", 500, "effects per statement with --from")
	quiet := fs.Bool("quiet", false, "with --from, report only bad lines and the totals")
	anyKind := fs.Bool("any-kind", false, "accept kinds that the configuration lacks or no live dispatcher serves (they wait until one does)")
	if err := parse(fs, args); err != nil {
		return err
	}
	one := *source != "" || *kind != "" || *payload != ""
	if one == (*from != "") {
		return usageErr("give either --source, --kind and --payload, or --from")
	}
	if *batch < 1 {
		return usageErr("--batch must be at least 1")
	}
	if one {
		// Each is required: an empty payload would be refused as "not
		// valid JSON", which hides that the flag is missing.
		for _, f := range []struct{ flag, value, what string }{
			{"--source", *source, "the source id of the effect"},
			{"--kind", *kind, "the kind of the effect"},
			{"--payload", *payload, "the effect's payload, a JSON object ('{}' for none)"},
		} {
			if f.value == "" {
				return usageErr("%s is required: %s", f.flag, f.what)
			}
		}
	}
	pool, store, err := c.open(ctx, io)
	if err != nil {
		return err
	}
	defer pool.Close()
	// A kind nothing serves would wait forever: refuse it, unless asked.
	// With a configuration, its kinds are the ones served; without, the
	// live dispatchers' registry says.
	oc := &outbox.Config{Schema: store.Schema(), AnyKind: *anyKind}
	if !*anyKind {
		cfg, err := c.loadConfig(io)
		if err != nil {
			return err
		}
		if cfg != nil {
			for k := range cfg.Kinds {
				oc.Kinds = append(oc.Kinds, k)
			}
			// Checked as the provider would before sending it: a
			// misspelled Stripe parameter is refused now, not at dispatch.
			oc.CheckPayload = cfg.CheckPayload
			// The configuration's kinds are the ones served, whether or
			// not a dispatcher has registered them yet.
			oc.AnyKind = true
		} else {
			oc.RequireServed = true
		}
	}
	ob, err := outbox.New(oc)
	if err != nil {
		return err
	}
	if one {
		res, err := ob.Enqueue(ctx, pool, outbox.Effect{SourceID: *source, Kind: *kind, Payload: json.RawMessage(*payload)})
		if errors.Is(err, effects.ErrUnknownKind) {
			return fmt.Errorf("%w; configure the kind in a daemon, or give --any-kind to enqueue it anyway", err)
		}
		if err != nil {
			return enqueueRefused(err)
		}
		fmt.Fprintln(io.Out, describe(res))
		return nil
	}
	in := io.In
	if *from != "-" {
		f, err := os.Open(*from)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	return enqueueLines(ctx, io, ob, pool, in, *batch, *quiet)
}

func describe(r outbox.Enqueued) string {
	if r.Inserted {
		return fmt.Sprintf("inserted effect %d key %s", r.ID, r.Key)
	}
	return fmt.Sprintf("already present: effect %d key %s", r.ID, r.Key)
}

// pendingLine is a parsed line waiting for its batch.
type pendingLine struct {
	n int
	e outbox.Effect
}

// enqueueLines enqueues JSON lines in batches, reporting each line; bad lines
// are reported with their number and never stop the good ones.
func enqueueLines(ctx context.Context, io *IO, ob *outbox.Outbox, db outbox.DB, in io.Reader, batchSize int, quiet bool) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	var inserted, present, bad int
	// Reports wait for their batch and come out in line order.
	type lineReport struct {
		n   int
		msg string
	}
	var reports []lineReport
	report := func(n int, r outbox.Enqueued) {
		if r.Inserted {
			inserted++
		} else {
			present++
		}
		if !quiet {
			reports = append(reports, lineReport{n, describe(r)})
		}
	}
	fail := func(n int, err error) {
		bad++
		reports = append(reports, lineReport{n, "error: " + err.Error()})
	}
	emit := func() {
		sort.Slice(reports, func(i, j int) bool { return reports[i].n < reports[j].n })
		for _, r := range reports {
			fmt.Fprintf(io.Out, "line %d: %s\n", r.n, r.msg)
		}
		reports = reports[:0]
	}
	var batch []pendingLine
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		es := make([]outbox.Effect, len(batch))
		for i, p := range batch {
			es[i] = p.e
		}
		res, err := ob.EnqueueMany(ctx, db, es)
		switch {
		case err == nil:
			for i, r := range res {
				report(batch[i].n, r)
			}
		case errors.Is(err, effects.ErrPayloadMismatch) || errors.Is(err, effects.ErrInvalid) || errors.Is(err, effects.ErrUnknownKind):
			// One item spoiled the batch: enqueue its items one by one, so
			// the good ones go in and the bad one is named.
			for _, p := range batch {
				r, err := ob.Enqueue(ctx, db, p.e)
				if err != nil {
					fail(p.n, err)
					continue
				}
				report(p.n, r)
			}
		default:
			emit()
			return fmt.Errorf("lines %d–%d: %w", batch[0].n, batch[len(batch)-1].n, enqueueRefused(err))
		}
		batch = batch[:0]
		emit()
		return nil
	}
	n := 0
	for sc.Scan() {
		n++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var l line
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			var te *time.ParseError
			if errors.As(err, &te) {
				fail(n, fmt.Errorf("not_before %q is not an RFC 3339 time (2026-11-26T10:00:00Z)", strings.Trim(te.Value, `"`)))
				continue
			}
			fail(n, fmt.Errorf("not a JSON object of source_id, kind, payload and optionally max_attempts, not_before: %v", err))
			continue
		}
		if dec.More() {
			fail(n, errors.New("more than one JSON value on the line"))
			continue
		}
		e := outbox.Effect{SourceID: l.SourceID, Kind: l.Kind, Payload: l.Payload, MaxAttempts: l.MaxAttempts, NotBefore: l.NotBefore}
		if l.Payload == nil {
			e.Payload = nil // "payload" absent: refused by validation below
		}
		if _, err := outbox.EncodePayload(e.Payload, outbox.DefaultMaxPayloadBytes); err != nil {
			fail(n, err)
			continue
		}
		if err := effects.ValidateSourceID(e.SourceID); err != nil {
			fail(n, err)
			continue
		}
		if err := effects.ValidateKind(e.Kind); err != nil {
			fail(n, err)
			continue
		}
		batch = append(batch, pendingLine{n: n, e: e})
		if len(batch) >= batchSize {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		emit()
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("line %d: longer than %d bytes; stopped after %d inserted, %d present, %d bad", n+1, maxLine, inserted, present, bad)
		}
		return fmt.Errorf("read input: %w", err)
	}
	if err := flush(); err != nil {
		return err
	}
	emit()
	fmt.Fprintf(io.Out, "%d inserted, %d already present, %s\n", inserted, present, plural(bad, "bad line", "bad lines"))
	switch {
	case bad > 0 && inserted+present == 0:
		return fmt.Errorf("%s (each reported above); nothing was enqueued", plural(bad, "bad line", "bad lines"))
	case bad > 0:
		return fmt.Errorf("%s (each reported above); the others were enqueued", plural(bad, "bad line", "bad lines"))
	}
	return nil
}

// plural is n with the noun that agrees with it.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// enqueueRefused adds to a refusal of the enqueue functions (42501) who
// may call them: a producer's role, not the daemon's or an operator's (a
// configuration's database URL is often the daemon's).
func enqueueRefused(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("%w: this URL's role may not enqueue; a producer's role may (sidefx roles --producer NAME), or the schema's owner: give its URL with --database-url", err)
	}
	return err
}
