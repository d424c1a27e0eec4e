package stripe

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/form"

	"github.com/sidefx/sidefx/providers"
)

// Every parameter reachable from the supported operations has a type the
// decoder reads: a stripe-go upgrade that adds an interface-typed or
// custom-encoded parameter fails here, not in production.
func TestDecodeParams_SupportsEveryParameterType(t *testing.T) {
	appender := reflect.TypeFor[form.Appender]()
	seen := map[reflect.Type]bool{}
	var walk func(t *testing.T, typ reflect.Type, path string)
	walk = func(t *testing.T, typ reflect.Type, path string) {
		switch typ.Kind() {
		case reflect.Pointer, reflect.Slice:
			walk(t, typ.Elem(), path)
			return
		case reflect.Map:
			if typ.Key().Kind() != reflect.String {
				t.Errorf("%s: map key %s", path, typ.Key())
			}
			walk(t, typ.Elem(), path+".*")
			return
		case reflect.Struct:
		case reflect.String, reflect.Bool, reflect.Int64, reflect.Int, reflect.Float64:
			return
		default:
			t.Errorf("%s: unsupported kind %s (%s)", path, typ.Kind(), typ)
			return
		}
		if seen[typ] {
			return
		}
		seen[typ] = true
		if reflect.PointerTo(typ).Implements(appender) && typ != reflect.TypeFor[stripego.PaymentSourceSourceParams]() {
			t.Errorf("%s: %s has custom form encoding the decoder does not mirror", path, typ)
		}
		for name, f := range formFields(typ) {
			ft := typ.FieldByIndex(f.index).Type
			walk(t, ft, path+"."+name)
		}
	}
	for name, op := range operations {
		p := op.params()
		typ := reflect.TypeOf(p).Elem()
		if len(formFields(typ)) == 0 {
			t.Errorf("%s: %s has no parameters", name, typ)
		}
		walk(t, typ, name)
	}
	if len(seen) < 20 {
		t.Fatalf("walked only %d struct types", len(seen))
	}
}

func TestDecodeParams(t *testing.T) {
	var p stripego.ChargeParams
	err := decodeParams(fields(t, `{"amount":2000,"currency":"usd","source":"tok_visa","capture":false,"description":null,`+
		`"metadata":{"a":"b"},"shipping":{"name":"Ada","address":{"line1":"1 Main St"}},"exchange_rate":1.25}`), &p)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case p.Amount == nil || *p.Amount != 2000, p.Currency == nil || *p.Currency != "usd":
		t.Fatalf("amount/currency: %+v", p)
	case p.Source == nil || p.Source.Token == nil || *p.Source.Token != "tok_visa" || p.Source.Card != nil:
		t.Fatalf("source (flattened form:\"*\"): %+v", p.Source)
	case p.Capture == nil || *p.Capture:
		t.Fatal("capture: false must be sent, not dropped")
	case p.Description != nil:
		t.Fatal("null must leave a parameter unset")
	case p.Metadata["a"] != "b" || p.Params.Metadata != nil:
		t.Fatalf("metadata: %v / %v", p.Metadata, p.Params.Metadata)
	case p.Shipping == nil || *p.Shipping.Name != "Ada" || *p.Shipping.Address.Line1 != "1 Main St":
		t.Fatalf("shipping: %+v", p.Shipping)
	case p.ExchangeRate == nil || *p.ExchangeRate != 1.25:
		t.Fatal("exchange_rate")
	}
	var body form.Values
	form.AppendTo(&body, &p)
	if got := body.Encode(); !strings.Contains(got, "source=tok_visa") || !strings.Contains(got, "capture=false") {
		t.Fatalf("form body %s", got)
	}
}

func TestDecodeParams_HighPrecision(t *testing.T) {
	type price struct {
		UnitAmountDecimal *float64 `form:"unit_amount_decimal,high_precision"`
		Plain             *float64 `form:"plain"`
	}
	var p price
	if err := decodeParams(fields(t, `{"unit_amount_decimal":"12.345","plain":1.5}`), &p); err != nil {
		t.Fatal(err)
	}
	if *p.UnitAmountDecimal != 12.345 || *p.Plain != 1.5 {
		t.Fatalf("%v %v", *p.UnitAmountDecimal, *p.Plain)
	}
	if err := decodeParams(fields(t, `{"plain":"1.5"}`), &p); err == nil {
		t.Fatal("a string for a plain number was accepted")
	}
}

func TestDecodeParams_ErrorsNameThePathNotTheValue(t *testing.T) {
	var p stripego.PaymentIntentParams
	err := decodeParams(fields(t, `{"payment_method_data":{"billing_details":{"email":42}}}`), &p)
	if err == nil || err.Error() != `parameter "payment_method_data.billing_details.email": want a string` {
		t.Fatalf("error %v", err)
	}
	err = decodeParams(fields(t, `{"payment_method_types":["card",7]}`), &p)
	if err == nil || err.Error() != `parameter "payment_method_types[1]": want a string` {
		t.Fatalf("error %v", err)
	}
	err = decodeParams(fields(t, `{"description":"4242 4242 4242 4242","amount":"4242424242424242"}`), &p)
	if err == nil || strings.Contains(err.Error(), "4242") {
		t.Fatalf("error %v echoes the value", err)
	}
}

func TestBuild_SetsKeyAndMetadata(t *testing.T) {
	c := providers.Call{SourceID: "src", Kind: "k.payment_intents.capture", Key: "sfx1_abc", Payload: json.RawMessage(`{"id":"pi_1","amount_to_capture":5}`)}
	params, id, err := operations["payment_intents.capture"].build(c)
	if err != nil {
		t.Fatal(err)
	}
	p := params.(*stripego.PaymentIntentCaptureParams)
	if id != "pi_1" || *p.AmountToCapture != 5 || *p.IdempotencyKey != "sfx1_abc" {
		t.Fatalf("id %q params %+v", id, p)
	}
	want := map[string]string{MetadataKey: "sfx1_abc", MetadataSourceID: "src", MetadataKind: "k.payment_intents.capture"}
	if !reflect.DeepEqual(p.Metadata, want) || p.Params.Metadata != nil {
		t.Fatalf("metadata %v, deprecated %v", p.Metadata, p.Params.Metadata)
	}
	c.Payload = json.RawMessage(`{"id":"pi_1"}`)
	params, _, err = operations["payment_intents.cancel"].build(c)
	if err != nil {
		t.Fatal(err)
	}
	if md := params.GetParams().Metadata; md != nil {
		t.Fatalf("cancel got metadata %v", md)
	}
}

// Call must not panic on any payload; build is where payloads are read.
func FuzzBuild(f *testing.F) {
	for _, s := range []string{`{}`, `{"amount":1}`, `{"id":"pi_1","amount_to_capture":1}`, `{"metadata":{"a":null}}`,
		`{"shipping":{"address":null}}`, `{"payment_method_types":[null]}`, `{"source":"tok"}`, `[]`, `null`, `{"id":null}`} {
		f.Add(s)
	}
	names := Operations()
	f.Fuzz(func(t *testing.T, payload string) {
		for _, name := range names {
			c := providers.Call{SourceID: "s", Kind: name, Key: "k", Payload: json.RawMessage(payload)}
			params, _, err := operations[name].build(c)
			if err == nil {
				var body form.Values
				form.AppendTo(&body, params)
			}
		}
	})
}

func fields(t *testing.T, s string) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}
