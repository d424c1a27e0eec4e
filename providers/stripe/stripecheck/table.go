package stripecheck

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// The parameter tables are text (paramsTable, in params_gen.go), read the
// first time a payload is checked. A line is an operation's root object:
//
//	op payment_intents.create 0
//
// or an object, by number, with its parameters:
//
//	3 amount=i64 currency=s metadata={s shipping=#7 unit_amount_decimal=^f64
//
// A parameter's type is s (string), b (bool), i, i8 … i64, u, u8 … u64
// (integers of Go's sizes), f32 or f64 (numbers; a leading ^ marks a
// decimal parameter, which also takes a string), #N (object N), [T (an
// array of T), {T (an object of T by any name), !G (a map with keys that
// are not strings, Go type G) or ?G (a Go type G the provider cannot
// read). A string parameter that takes only some values lists them after
// a colon, s:duplicate,fraudulent,requested_by_customer (an empty value
// between commas, or alone after the colon, is the empty string, which
// Stripe reads as unsetting the parameter).

type kind uint8

const (
	kindObject kind = iota
	kindArray
	kindMap
	kindBadMap
	kindUnsupported
	kindString
	kindBool
	kindInt
	kindInt8
	kindInt16
	kindInt32
	kindInt64
	kindUint
	kindUint8
	kindUint16
	kindUint32
	kindUint64
	kindFloat32
	kindFloat64
)

var scalars = map[string]kind{
	"s": kindString, "b": kindBool,
	"i": kindInt, "i8": kindInt8, "i16": kindInt16, "i32": kindInt32, "i64": kindInt64,
	"u": kindUint, "u8": kindUint8, "u16": kindUint16, "u32": kindUint32, "u64": kindUint64,
	"f32": kindFloat32, "f64": kindFloat64,
}

// typ is the type of a parameter.
type typ struct {
	kind   kind
	object *object  // kindObject
	elem   *typ     // kindArray, kindMap
	goType string   // kindBadMap, kindUnsupported
	enum   []string // kindString: the values allowed, sorted; nil: any
}

type field struct {
	typ           *typ
	highPrecision bool
}

// object is a parameter struct: its parameters by name.
type object struct {
	fields map[string]field
}

// roots returns each operation's parameter object, reading the tables the
// first time.
var roots = sync.OnceValue(func() map[string]*object {
	r, err := readTable(paramsTable)
	if err != nil {
		panic("stripecheck: " + err.Error()) // the generated table is tested
	}
	return r
})

func readTable(text string) (map[string]*object, error) {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	var objects []*object
	for _, line := range lines {
		if !strings.HasPrefix(line, "op ") {
			objects = append(objects, &object{})
		}
	}
	get := func(s string) (*object, error) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n >= len(objects) {
			return nil, fmt.Errorf("no object %q", s)
		}
		return objects[n], nil
	}
	roots := map[string]*object{}
	for _, line := range lines {
		words := strings.Fields(line)
		if words[0] == "op" {
			if len(words) != 3 {
				return nil, fmt.Errorf("line %q", line)
			}
			o, err := get(words[2])
			if err != nil {
				return nil, err
			}
			roots[words[1]] = o
			continue
		}
		o, err := get(words[0])
		if err != nil {
			return nil, err
		}
		o.fields = make(map[string]field, len(words)-1)
		for _, w := range words[1:] {
			name, expr, ok := strings.Cut(w, "=")
			if !ok {
				return nil, fmt.Errorf("parameter %q", w)
			}
			hp := strings.HasPrefix(expr, "^")
			t, err := readType(strings.TrimPrefix(expr, "^"), get)
			if err != nil {
				return nil, fmt.Errorf("parameter %q: %w", name, err)
			}
			o.fields[name] = field{typ: t, highPrecision: hp}
		}
	}
	return roots, nil
}

func readType(expr string, get func(string) (*object, error)) (*typ, error) {
	if k, ok := scalars[expr]; ok {
		return &typ{kind: k}, nil
	}
	if values, ok := strings.CutPrefix(expr, "s:"); ok {
		return &typ{kind: kindString, enum: strings.Split(values, ",")}, nil
	}
	if expr == "" {
		return nil, fmt.Errorf("no type")
	}
	switch rest := expr[1:]; expr[0] {
	case '#':
		o, err := get(rest)
		if err != nil {
			return nil, err
		}
		return &typ{kind: kindObject, object: o}, nil
	case '[', '{':
		elem, err := readType(rest, get)
		if err != nil {
			return nil, err
		}
		k := kindArray
		if expr[0] == '{' {
			k = kindMap
		}
		return &typ{kind: k, elem: elem}, nil
	case '!':
		return &typ{kind: kindBadMap, goType: rest}, nil
	case '?':
		return &typ{kind: kindUnsupported, goType: rest}, nil
	}
	return nil, fmt.Errorf("type %q", expr)
}
