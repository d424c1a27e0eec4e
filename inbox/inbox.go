package inbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/internal/engine"
)

// DefaultRetention is how long a message's record is kept by default:
// longer than any broker's redelivery of an unacknowledged message.
const DefaultRetention = 7 * 24 * time.Hour

// Errors, matched with errors.Is.
var (
	// ErrPayloadMismatch: the message's id was recorded with another
	// payload. The error is a *PayloadMismatchError.
	ErrPayloadMismatch = errors.New("inbox: payload mismatch")
	// ErrInvalid: the message or the call is not usable (an empty id, a
	// consumer name out of its alphabet, a handle outside a transaction);
	// nothing was recorded.
	ErrInvalid = errors.New("inbox: invalid")
	// ErrNotFound: Record found no record of the message.
	ErrNotFound = errors.New("inbox: no record of the message")
	// ErrOtherProducer: the consumer's record of the message is another
	// producer's (schema 28): another service, under another database role,
	// uses the same consumer name. Nothing was recorded and the message was
	// not handled: give each service its own consumer names.
	ErrOtherProducer = errors.New("inbox: the record is another producer's")
)

// PayloadMismatchError says that a message id came back with another
// payload: a producer reusing ids, or a corrupted message. Its handling
// must not proceed; the transaction is aborted.
type PayloadMismatchError struct {
	Consumer, ID        string
	StoredHash, NewHash string // hex SHA-256 of the payloads
}

func (e *PayloadMismatchError) Error() string {
	return fmt.Sprintf("inbox: consumer %s message %s came back with another payload: stored payload hash %s, new payload hash %s",
		e.Consumer, e.ID, e.StoredHash, e.NewHash)
}

// Is makes errors.Is(e, ErrPayloadMismatch) hold.
func (e *PayloadMismatchError) Is(target error) bool { return target == ErrPayloadMismatch }

// Message is one delivery of a broker's message to a consumer.
type Message struct {
	// Consumer names the consumer (a group of processes that handle the
	// message once between them): a lowercase letter, then letters,
	// digits, _ . -, at most 128.
	Consumer string
	// ID is the message's id, stable across redeliveries: the event's id
	// (a JetStream Nats-Msg-Id, a Kafka key and offset…). 1 to 255
	// characters.
	ID string
	// Payload is the message's body. Its SHA-256 is kept: a redelivery
	// must carry the same bytes.
	Payload []byte
}

// Receipt is what Once learned of a delivery.
type Receipt struct {
	Consumer, ID string
	// First is true for the first delivery: handle the message. False for
	// a redelivery: its handling has committed already; return Result.
	First bool
	// ReceivedAt is when the first delivery was recorded.
	ReceivedAt time.Time
	// Deliveries counts the deliveries recorded, this one included.
	Deliveries int
	// Result is what the handler recorded for the first delivery
	// (Record), or nil.
	Result json.RawMessage

	schema string
}

// Observer is told of each delivery Once records, and of each mismatch:
// the source of a consumer's metrics (deliveries, duplicates — the dedup
// hit rate — and mismatches). Calls are made from the goroutine that
// called Once, after its statement, before the caller's transaction
// commits.
type Observer interface {
	Delivered(consumer string, first bool)
	Mismatched(consumer string)
}

// Config configures an Inbox.
type Config struct {
	// Schema holds sidefx's tables. Default "public".
	Schema string
	// Retention is how long a message's record is kept after its last
	// delivery (each redelivery extends it, never shortens it); the
	// daemon's reaper deletes it then, and a delivery after that is
	// handled as a first one. Default DefaultRetention (7 days).
	Retention time.Duration
	// Observer, if set, is told of deliveries and mismatches.
	Observer Observer
}

// Inbox records the deliveries of a consumer's messages.
type Inbox struct {
	q         string // the schema, quoted
	schema    string
	retention time.Duration
	obs       Observer
}

// New returns an Inbox for cfg (nil: the defaults).
func New(cfg *Config) (*Inbox, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	schema, err := engine.CheckSchema(c.Schema)
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	if c.Retention < 0 {
		return nil, fmt.Errorf("inbox: retention %s is negative", c.Retention)
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	return &Inbox{q: engine.Quote(schema), schema: schema, retention: c.Retention, obs: c.Observer}, nil
}

var defaultInbox, _ = New(nil)

// Once records a delivery of m with the defaults (schema public, 7 days'
// retention); see (*Inbox).Once.
func Once(ctx context.Context, tx any, m Message) (Receipt, error) {
	return defaultInbox.Once(ctx, tx, m)
}

var consumerRE = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,127}$`)

// Once records a delivery of m inside tx, the consumer's transaction that
// also does the message's work: a pgx.Tx or a *sql.Tx (or a wrapper of
// either with their methods). It runs one statement.
//
//   - The first delivery of m.ID to m.Consumer gives First == true: do the
//     work, Record its result, commit, then acknowledge the message.
//   - A redelivery with the same payload gives First == false, with the
//     first delivery's time and recorded Result: do not do the work again;
//     commit (the delivery is counted) and acknowledge.
//   - The same ID with another payload is a *PayloadMismatchError (errors.Is
//     ErrPayloadMismatch) naming both hashes; like any failed statement it
//     leaves tx aborted.
//
// Two deliveries of one message at once: the second waits for the first's
// transaction. If it commits, the second is a redelivery; if it rolls back,
// the second is the first. Nothing is ever checked before it is inserted.
func (in *Inbox) Once(ctx context.Context, tx any, m Message) (Receipt, error) {
	switch {
	case !consumerRE.MatchString(m.Consumer):
		return Receipt{}, fmt.Errorf("%w: consumer %q is not a lowercase letter then letters, digits, _ . - (at most 128)", ErrInvalid, m.Consumer)
	case m.ID == "" || len([]rune(m.ID)) > 255:
		return Receipt{}, fmt.Errorf("%w: message id of consumer %s is empty or longer than 255 characters", ErrInvalid, m.Consumer)
	}
	db, err := inTransaction("Once", tx)
	if err != nil {
		return Receipt{}, err
	}
	sum := sha256.Sum256(m.Payload)
	r := Receipt{Consumer: m.Consumer, ID: m.ID, schema: in.q}
	d, err := engine.InboxOnce(ctx, db, in.q, m.Consumer, m.ID, sum[:], in.retention)
	if err != nil {
		err = translate(err, m)
		if errors.Is(err, ErrPayloadMismatch) && in.obs != nil {
			in.obs.Mismatched(m.Consumer)
		}
		return Receipt{}, err
	}
	r.First, r.ReceivedAt, r.Deliveries = d.First, d.ReceivedAt, d.Deliveries
	if len(d.Result) > 0 {
		r.Result = d.Result
	}
	if in.obs != nil {
		in.obs.Delivered(m.Consumer, r.First)
	}
	return r, nil
}

// Record stores result, encoded as JSON, as what handling the message
// produced, inside tx (the transaction Once ran in, before it commits): a
// redelivery's Receipt returns it. A json.RawMessage or []byte is stored as
// it is and must be JSON.
func (r Receipt) Record(ctx context.Context, tx any, result any) error {
	if r.schema == "" {
		return fmt.Errorf("%w: Record on a Receipt that Once did not return", ErrInvalid)
	}
	var raw []byte
	switch v := result.(type) {
	case json.RawMessage:
		raw = v
	case []byte:
		raw = v
	default:
		b, err := json.Marshal(result)
		if err != nil {
			return fmt.Errorf("%w: result of consumer %s message %s: %v", ErrInvalid, r.Consumer, r.ID, err)
		}
		raw = b
	}
	if !json.Valid(raw) {
		return fmt.Errorf("%w: result of consumer %s message %s is not JSON", ErrInvalid, r.Consumer, r.ID)
	}
	db, err := inTransaction("Record", tx)
	if err != nil {
		return err
	}
	found, err := engine.InboxRecord(ctx, db, r.schema, r.Consumer, r.ID, raw)
	if err != nil {
		return fmt.Errorf("inbox: record the result of consumer %s message %s: %w", r.Consumer, r.ID, engine.ExplainPooled(err))
	}
	if !found {
		return fmt.Errorf("%w: consumer %s message %s", ErrNotFound, r.Consumer, r.ID)
	}
	return nil
}

// inTransaction returns tx as a engine.DB, refusing the handles that are
// not a transaction: outside one, the record would commit apart from the
// work it guards.
func inTransaction(op string, tx any) (engine.DB, error) {
	switch tx.(type) {
	case *pgxpool.Pool, *pgx.Conn, *sql.DB, *sql.Conn:
		return nil, fmt.Errorf("%w: %s needs the consumer's transaction (a pgx.Tx or *sql.Tx), not a %T: outside it, the record would commit apart from the work it guards", ErrInvalid, op, tx)
	}
	db, err := engine.Of(tx)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, op, err)
	}
	return db, nil
}

// translate turns the SQL functions' errors into the package's.
func translate(err error, m Message) error {
	pe, ok := engine.PgErrorOf(err)
	if !ok {
		return fmt.Errorf("inbox: consumer %s message %s: %w", m.Consumer, m.ID, err)
	}
	switch pe.Code {
	case "SX002":
		var d struct {
			Stored string `json:"stored_hash"`
			New    string `json:"new_hash"`
		}
		_ = json.Unmarshal([]byte(pe.Detail), &d)
		if d.New == "" {
			sum := sha256.Sum256(m.Payload)
			d.New = hex.EncodeToString(sum[:])
		}
		return &PayloadMismatchError{Consumer: m.Consumer, ID: m.ID, StoredHash: d.Stored, NewHash: d.New}
	case "22023":
		return fmt.Errorf("%w: %s", ErrInvalid, pe.Message)
	case "42501":
		if strings.Contains(pe.Message, "row-level security") {
			return fmt.Errorf("%w: consumer %s message %s was recorded by another database role, which this one may not read or change (two services share the consumer name %s?)",
				ErrOtherProducer, m.Consumer, m.ID, m.Consumer)
		}
	}
	return fmt.Errorf("inbox: consumer %s message %s: %w", m.Consumer, m.ID, engine.ExplainPooled(err))
}
