package stripecheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Errors the checks wrap, for errors.Is; the stripe package's errors of the
// same names are these.
var (
	// ErrUnsupportedOperation: the kind maps to no operation the Stripe
	// provider supports.
	ErrUnsupportedOperation = errors.New("unsupported stripe operation")
	// ErrInvalidPayload: the payload is not the operation's parameters.
	ErrInvalidPayload = errors.New("invalid stripe payload")
)

// operation is what the check needs of one Stripe operation.
type operation struct {
	// target: the payload's "id" names the object acted on (capture,
	// cancel); it is taken out before the rest is read as parameters.
	target bool
	// prefix is the id prefix of the object Stripe answers with.
	prefix string
}

// operations are the Stripe operations the provider supports. Each has a
// parameter table in params_gen.go, made from stripe-go's parameter struct.
var operations = map[string]operation{
	"payment_intents.create":  {prefix: "pi_"},
	"payment_intents.capture": {target: true, prefix: "pi_"},
	"payment_intents.cancel":  {target: true, prefix: "pi_"},
	"charges.create":          {prefix: "ch_"},
	"refunds.create":          {prefix: "re_"},
	"customers.create":        {prefix: "cus_"},
	"transfers.create":        {prefix: "tr_"},
}

// Operations returns the Stripe operations the provider supports, sorted.
func Operations() []string {
	return slices.Sorted(maps.Keys(operations))
}

// Supported reports whether operation is one of Operations().
func Supported(operation string) bool {
	_, ok := operations[operation]
	return ok
}

// Target reports whether operation acts on an existing object named by
// the payload's "id", and the id prefix of the object Stripe answers with.
func Target(operation string) (target bool, prefix string) {
	op := operations[operation]
	return op.target, op.prefix
}

// DefaultOperation returns the operation a kind maps to when the
// provider's operations do not name it: the kind's last two dot-separated
// words ("charge.payment_intents.create" → "payment_intents.create"). The
// result may not be a supported operation.
func DefaultOperation(kind string) string {
	words := strings.Split(kind, ".")
	if len(words) < 2 {
		return kind
	}
	return strings.Join(words[len(words)-2:], ".")
}

// Operation returns the operation kind maps to with ops (a kind → operation
// map, as stripe.Config.Operations; nil is empty), and whether it is
// supported.
func Operation(ops map[string]string, kind string) (string, bool) {
	op, ok := ops[kind]
	if !ok {
		op = DefaultOperation(kind)
	}
	return op, Supported(op)
}

// CheckPayload checks payload for kind as the Stripe provider whose
// operations are ops does before any request, with the same error: the
// kind must map to a supported operation, and the payload must be its
// parameters, read strictly (an unknown or mistyped parameter is an error
// naming it, never its value).
func CheckPayload(ops map[string]string, kind string, payload json.RawMessage) error {
	name, ok := Operation(ops, kind)
	if !ok {
		return fmt.Errorf("stripe: kind %q maps to operation %q (supported: %s): %w",
			kind, name, strings.Join(Operations(), ", "), ErrUnsupportedOperation)
	}
	if _, _, err := Parse(name, payload); err != nil {
		return fmt.Errorf("stripe %s: payload: %w: %w", name, err, ErrInvalidPayload)
	}
	return nil
}

// Parse checks payload as the parameters of operation, a supported one,
// and returns the id of the object acted on (for a target operation) and
// the parameters without it, by name. The error says what is wrong,
// without wrapping ErrInvalidPayload (CheckPayload adds it).
func Parse(operation string, payload json.RawMessage) (id string, fields map[string]json.RawMessage, err error) {
	op, ok := operations[operation]
	root, hasParams := roots()[operation]
	if !ok || !hasParams {
		return "", nil, fmt.Errorf("operation %q is not supported", operation)
	}
	if err := json.Unmarshal(payload, &fields); err != nil || fields == nil {
		return "", nil, errors.New("want a JSON object of Stripe parameters")
	}
	if op.target {
		raw, ok := fields["id"]
		if !ok {
			return "", nil, fmt.Errorf("want the %s… id of the object to act on in \"id\"", op.prefix)
		}
		if err := json.Unmarshal(raw, &id); err != nil || strings.TrimSpace(id) == "" || strings.TrimSpace(id) != id {
			return "", nil, errors.New(`"id": want the id of the object to act on, a non-empty string`)
		}
		delete(fields, "id")
	}
	if err := checkObject(fields, root, ""); err != nil {
		return "", nil, err
	}
	return id, fields, nil
}

func checkObject(fields map[string]json.RawMessage, s *object, path string) error {
	names := slices.Sorted(maps.Keys(fields)) // the first error is the same on every attempt
	for _, name := range names {
		f, ok := s.fields[name]
		if !ok {
			return fmt.Errorf("unknown parameter %q", join(path, name))
		}
		if err := checkValue(fields[name], f.typ, join(path, name), f.highPrecision); err != nil {
			return err
		}
	}
	return nil
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func checkValue(raw json.RawMessage, t *typ, path string, highPrecision bool) error {
	raw = bytes.TrimSpace(raw)
	if bytes.Equal(raw, []byte("null")) {
		return nil // unset, as encoding/json does
	}
	switch t.kind {
	case kindObject:
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
			return fmt.Errorf("parameter %q: want an object", path)
		}
		return checkObject(fields, t.object, path)
	case kindArray:
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return fmt.Errorf("parameter %q: want an array", path)
		}
		for i, item := range items {
			if err := checkValue(item, t.elem, path+"["+strconv.Itoa(i)+"]", highPrecision); err != nil {
				return err
			}
		}
		return nil
	case kindMap:
		var entries map[string]json.RawMessage
		if err := json.Unmarshal(raw, &entries); err != nil || entries == nil {
			return fmt.Errorf("parameter %q: want an object", path)
		}
		for _, k := range slices.Sorted(maps.Keys(entries)) { // the first error is the same on every attempt
			if err := checkValue(entries[k], t.elem, join(path, k), highPrecision); err != nil {
				return err
			}
		}
		return nil
	case kindBadMap:
		return fmt.Errorf("parameter %q: unsupported map type %s", path, t.goType)
	case kindUnsupported:
		return fmt.Errorf("parameter %q: unsupported parameter type %s", path, t.goType)
	case kindString:
		if t.enum == nil {
			return leaf[string](raw, path, "a string")
		}
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("parameter %q: want a string", path)
		}
		if !slices.Contains(t.enum, v) {
			return &EnumError{Parameter: path, Allowed: t.enum}
		}
		return nil
	case kindBool:
		return leaf[bool](raw, path, "true or false")
	case kindInt:
		return leaf[int](raw, path, "an integer")
	case kindInt8:
		return leaf[int8](raw, path, "an integer")
	case kindInt16:
		return leaf[int16](raw, path, "an integer")
	case kindInt32:
		return leaf[int32](raw, path, "an integer")
	case kindInt64:
		return leaf[int64](raw, path, "an integer")
	case kindUint:
		return leaf[uint](raw, path, "an integer")
	case kindUint8:
		return leaf[uint8](raw, path, "an integer")
	case kindUint16:
		return leaf[uint16](raw, path, "an integer")
	case kindUint32:
		return leaf[uint32](raw, path, "an integer")
	case kindUint64:
		return leaf[uint64](raw, path, "an integer")
	case kindFloat32, kindFloat64:
		bits := 64
		if t.kind == kindFloat32 {
			bits = 32
		}
		if highPrecision && len(raw) > 0 && raw[0] == '"' {
			// Decimal parameters (unit_amount_decimal) travel as strings
			// in Stripe's own JSON; accept both.
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return fmt.Errorf("parameter %q: want a number", path)
			}
			if _, err := strconv.ParseFloat(s, bits); err != nil {
				return fmt.Errorf("parameter %q: want a number", path)
			}
			return nil
		}
		if bits == 32 {
			return leaf[float32](raw, path, "a number")
		}
		return leaf[float64](raw, path, "a number")
	}
	return fmt.Errorf("parameter %q: unsupported parameter type %s", path, t.goType)
}

// EnumError is a string parameter given a value Stripe does not take: its
// path and the values allowed, never the value given. CheckPayload's error
// wraps it (errors.As).
type EnumError struct {
	Parameter string   // "reason", "payment_method_options.card.request_three_d_secure"
	Allowed   []string // sorted
}

func (e *EnumError) Error() string {
	quoted := make([]string, len(e.Allowed))
	for i, v := range e.Allowed {
		quoted[i] = strconv.Quote(v)
	}
	return fmt.Sprintf("parameter %q: want one of %s", e.Parameter, strings.Join(quoted, ", "))
}

// leaf checks a scalar with encoding/json's own type checks, decoding into
// a value of the parameter's Go kind; the error names the expected type,
// not the value given.
func leaf[T any](raw json.RawMessage, path, want string) error {
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("parameter %q: want %s", path, want)
	}
	return nil
}
