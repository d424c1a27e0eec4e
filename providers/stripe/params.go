package stripe

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	stripego "github.com/stripe/stripe-go/v76"
)

// stripe-go's parameter structs carry `form` tags only: the names Stripe's
// API uses on the wire (amount, payment_method_types, transfer_data). They
// have no `json` tags, so encoding/json would match a payload's keys against
// the Go field names, case-insensitively: "amount" would find Amount, but
// "payment_method_types" would find nothing, while "idempotencykey" or
// "stripeaccount" would reach the embedded stripe.Params and set headers.
// decodeParams therefore reads a payload by the form tags: a payload is
// written in Stripe's own parameter names, exactly as Stripe's API reference
// shows them, and nothing else gets in.

// decodeParams fills dst, a pointer to a stripe-go parameter struct, from a
// JSON object keyed by Stripe's parameter names. Every key must name a
// parameter of dst (nested objects, arrays and maps included); values must
// have the parameter's JSON type. A JSON null leaves a parameter unset. The
// embedded stripe.Params (context, headers, idempotency key, account,
// expand/metadata of the deprecated kind) is never reachable from a payload.
// Errors name the parameter's path but never echo its value.
func decodeParams(fields map[string]json.RawMessage, dst any) error {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("decode params: %T is not a pointer to a struct", dst)
	}
	return decodeObject(fields, v.Elem(), "")
}

var paramsType = reflect.TypeFor[stripego.Params]()

// formField locates one parameter in a struct: the index path through
// flattened (form:"*") fields, and the tag's options.
type formField struct {
	index         []int
	highPrecision bool
}

var formFieldsCache sync.Map // reflect.Type → map[string]formField

// formFields returns the parameters of struct type t by their form names.
func formFields(t reflect.Type) map[string]formField {
	if f, ok := formFieldsCache.Load(t); ok {
		return f.(map[string]formField)
	}
	fields := make(map[string]formField)
	collectFormFields(t, nil, fields)
	f, _ := formFieldsCache.LoadOrStore(t, fields)
	return f.(map[string]formField)
}

func collectFormFields(t reflect.Type, prefix []int, into map[string]formField) {
	for i := range t.NumField() {
		sf := t.Field(i)
		if sf.Anonymous && sf.Type == paramsType {
			continue // request options, not parameters
		}
		if !sf.IsExported() {
			continue
		}
		tag, ok := sf.Tag.Lookup("form")
		if !ok || tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		index := append(slices.Clone(prefix), i)
		if name == "*" {
			// Flattened: the field's own parameters sit at this level
			// (ChargeParams.Source → "source").
			ft := sf.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				collectFormFields(ft, index, into)
			}
			continue
		}
		if _, dup := into[name]; dup {
			continue // the outer field wins, as in the form encoder
		}
		into[name] = formField{index: index, highPrecision: slices.Contains(strings.Split(opts, ","), "high_precision")}
	}
}

// fieldByIndex walks index from v, allocating nil pointers on the way.
func fieldByIndex(v reflect.Value, index []int) reflect.Value {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v
}

func decodeObject(fields map[string]json.RawMessage, v reflect.Value, path string) error {
	known := formFields(v.Type())
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names) // the first error is the same on every attempt
	for _, name := range names {
		f, ok := known[name]
		if !ok {
			return fmt.Errorf("unknown parameter %q", join(path, name))
		}
		if err := decodeValue(fields[name], fieldByIndex(v, f.index), join(path, name), f.highPrecision); err != nil {
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

func decodeValue(raw json.RawMessage, v reflect.Value, path string, highPrecision bool) error {
	raw = bytes.TrimSpace(raw)
	if bytes.Equal(raw, []byte("null")) {
		return nil // unset, as encoding/json does
	}
	switch v.Kind() {
	case reflect.Pointer:
		elem := reflect.New(v.Type().Elem())
		if err := decodeValue(raw, elem.Elem(), path, highPrecision); err != nil {
			return err
		}
		v.Set(elem)
		return nil
	case reflect.Struct:
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
			return fmt.Errorf("parameter %q: want an object", path)
		}
		return decodeObject(fields, v, path)
	case reflect.Slice:
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return fmt.Errorf("parameter %q: want an array", path)
		}
		s := reflect.MakeSlice(v.Type(), len(items), len(items))
		for i, item := range items {
			if err := decodeValue(item, s.Index(i), path+"["+strconv.Itoa(i)+"]", highPrecision); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return fmt.Errorf("parameter %q: unsupported map type %s", path, v.Type())
		}
		var entries map[string]json.RawMessage
		if err := json.Unmarshal(raw, &entries); err != nil || entries == nil {
			return fmt.Errorf("parameter %q: want an object", path)
		}
		m := reflect.MakeMapWithSize(v.Type(), len(entries))
		for _, k := range slices.Sorted(maps.Keys(entries)) { // as stripecheck reads them
			ev := reflect.New(v.Type().Elem()).Elem()
			if err := decodeValue(entries[k], ev, join(path, k), highPrecision); err != nil {
				return err
			}
			m.SetMapIndex(reflect.ValueOf(k).Convert(v.Type().Key()), ev)
		}
		v.Set(m)
		return nil
	case reflect.String:
		return leaf(raw, v, path, "a string")
	case reflect.Bool:
		return leaf(raw, v, path, "true or false")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return leaf(raw, v, path, "an integer")
	case reflect.Float32, reflect.Float64:
		if highPrecision && len(raw) > 0 && raw[0] == '"' {
			// Decimal parameters (unit_amount_decimal) travel as strings
			// in Stripe's own JSON; accept both.
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return fmt.Errorf("parameter %q: want a number", path)
			}
			f, err := strconv.ParseFloat(s, v.Type().Bits())
			if err != nil {
				return fmt.Errorf("parameter %q: want a number", path)
			}
			v.SetFloat(f)
			return nil
		}
		return leaf(raw, v, path, "a number")
	}
	return fmt.Errorf("parameter %q: unsupported parameter type %s", path, v.Type())
}

// leaf decodes a scalar with encoding/json's own type checks; the error
// names the expected type, not the value given.
func leaf(raw json.RawMessage, v reflect.Value, path, want string) error {
	if err := json.Unmarshal(raw, v.Addr().Interface()); err != nil {
		return fmt.Errorf("parameter %q: want %s", path, want)
	}
	return nil
}
